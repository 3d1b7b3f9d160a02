#!/usr/bin/env bash
# The whole test suite: vet, staticcheck, and every package's tests under the
# race detector (fuzz seed corpora included). Needs only the Go toolchain.
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
echo "== go test -race"
go test -race -count=1 -timeout 8m "$@" ./...
