#!/usr/bin/env bash
# Builds the Go compatibility program (tests/compat/go/bin/txmqgo) with the official Go client pinned in go.mod.
# Uses the normal module cache (~/go/pkg/mod); fails (non-zero) if a module cannot be downloaded, never skips.
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v go >/dev/null 2>&1; then
    echo "build.sh: the go tool is not on PATH" >&2
    exit 1
fi
# -mod=readonly: go.mod and go.sum are the pin; a build never rewrites them.
export GOFLAGS="${GOFLAGS:-} -mod=readonly"
if ! go mod download; then
    echo "build.sh: could not download the pinned modules (GOPROXY=$(go env GOPROXY)); not building" >&2
    exit 1
fi
mkdir -p bin
go build -o bin/txmqgo ./cmd/txmqgo
echo "built $(pwd)/bin/txmqgo with $(go list -m github.com/apache/rocketmq-client-go/v2)"
