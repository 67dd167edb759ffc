#!/usr/bin/env bash
# Build the RocketMQ 5.x Java client scenarios (gRPC) from Maven Central; ~/.m2 makes later builds fast.
# A registry that cannot be reached fails here, loudly.
set -euo pipefail
cd "$(dirname "$0")"
mvn -B -q -Dstyle.color=never compile
test -f target/classes/txmq/compat5/Main.class
