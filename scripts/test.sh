#!/usr/bin/env bash
# The whole test suite: gofmt, vet, staticcheck, every Go package's tests under
# the race detector (fuzz seed corpora included), and the Node package's tests
# (clients/node, node:test, against real sm-manager processes and the real
# @discordjs/ws). Needs the Go toolchain and Node 20+ with npm, and Chromium for
# the status page's browser test: run as root, this installs Debian's chromium
# package when it is missing (else that test is skipped).
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
	echo "gofmt would change:"; echo "$unformatted"; exit 1
fi
echo "== go vet"
go vet ./...
echo "== staticcheck"
go tool staticcheck ./...
echo "== chromium"
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
	echo "found $(command -v chromium || command -v chromium-browser)"
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
	echo "installing Debian's chromium package"
	DEBIAN_FRONTEND=noninteractive apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
else
	echo "chromium is missing and cannot be installed here (not root): the status page's browser test will be skipped"
fi
echo "== go test -race"
go test -race -count=1 -timeout 8m "$@" ./...
echo "== node: clients/node"
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
	echo "node and npm (Node 20 or newer) are needed for the Node package's tests"; exit 1
fi
(cd clients/node && npm ci --no-audit --no-fund --loglevel=error && npm test)
