#!/usr/bin/env bash
# Builds the binaries into bin/ and runs sm-manager on config.example.toml:
# simulated clusters, no Discord token needed. Ctrl-C quiesces and stops them.
set -euo pipefail
cd "$(dirname "$0")/.."
go build -o bin/ ./cmd/...
exec bin/sm-manager -config "${SM_CONFIG:-config.example.toml}" "$@"
