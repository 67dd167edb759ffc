#!/usr/bin/env bash
# Build the Java compatibility programs against both lines of the official remoting client, from Maven Central.
# Maven's cache (~/.m2) makes later builds fast. A registry that cannot be reached fails here, loudly.
set -euo pipefail
cd "$(dirname "$0")"
mvn -B -q -Dstyle.color=never compile -Drocketmq.version=4.9.8 -Plegacy -Dout="$PWD/target/v4"
mvn -B -q -Dstyle.color=never compile -Drocketmq.version=5.5.0 -Dout="$PWD/target/v5"
test -d target/v4/classes/txmq/compat && test -d target/v5/classes/txmq/compat
