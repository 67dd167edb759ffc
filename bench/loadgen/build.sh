#!/usr/bin/env bash
# Builds the compiled load generator of bench/bench_rocketmq.py (bench/loadgen/bin/txmq-loadgen): Go's standard
# library only, so it needs no module download.
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v go >/dev/null 2>&1; then
    echo "build.sh: the go tool is not on PATH" >&2
    exit 1
fi
mkdir -p bin
go build -o bin/txmq-loadgen .
echo "built $(pwd)/bin/txmq-loadgen"
