#!/usr/bin/env bash
# Resolves mqadmin's classpath (org.apache.rocketmq:rocketmq-tools, pinned in pom.xml) into target/lib.
# Fails (non-zero) when Maven or Maven Central is unavailable: the mqadmin compat tests must never be skipped.
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v mvn >/dev/null 2>&1; then
    echo "build.sh: mvn is not installed; the mqadmin compat suite needs Maven" >&2
    exit 2
fi
rm -rf target/lib
if ! mvn -B -q package; then
    echo "build.sh: Maven could not resolve rocketmq-tools (is Maven Central reachable?)" >&2
    exit 1
fi
if ! ls target/lib/rocketmq-tools-*.jar >/dev/null 2>&1; then
    echo "build.sh: target/lib has no rocketmq-tools jar after the build" >&2
    exit 1
fi
echo "mqadmin classpath: $(ls target/lib | wc -l) jars in $(pwd)/target/lib"
