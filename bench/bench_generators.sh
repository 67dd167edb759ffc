#!/usr/bin/env bash
# txmq's broker CPU per transaction under the two load generators of bench_rocketmq.py (issue 24): one `txmq dev`,
# windows of 16 transactions in flight from bench/loadgen (Go) and from the Java client alternated, the broker's CPU
# (utime + stime of the txmq dev process) read from /proc around each window. Prints rate, p50 and broker us/tx.
#
#   bash bench/bench_generators.sh [PAIRS] [SECONDS]      # from the project root, with .venv and the Java client built
set -euo pipefail
cd "$(dirname "$0")/.."
PAIRS=${1:-3}
SECONDS_PER_WINDOW=${2:-6}
DIR=$(mktemp -d /tmp/txmq-bench-generators-XXXXXX)
NS=29876
.venv/bin/txmq dev --data-dir "$DIR/data" --namesrv-port $NS --broker-port 30911 >"$DIR/log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null; rm -rf "$DIR"' EXIT
bash bench/loadgen/build.sh >/dev/null
.venv/bin/python - <<PY
from txmq.client.sync import Admin
from txmq.testing import eventually
def create():
    with Admin("127.0.0.1:$NS") as admin:
        admin.create_topic("BenchGen", cluster="DefaultCluster", read_queue_nums=4, write_queue_nums=4)
    return True
eventually(create, "the topic", timeout=30, interval=0.5, retry_on=(Exception,))
PY
JAVA=tests/compat/java/target/v4
cpu() { awk '{print $14 + $15}' /proc/$PID/stat; }
for _ in $(seq "$PAIRS"); do
    for gen in go java; do
        before=$(cpu)
        if [[ $gen == go ]]; then
            result=$(bench/loadgen/bin/txmq-loadgen --mode tx --namesrv 127.0.0.1:$NS --topic BenchGen --group BenchGenGo \
                --inflight 16 --seconds "$SECONDS_PER_WINDOW")
        else
            result=$(java -Xms1g -Xmx1g -XX:+UseParallelGC -Drocketmq.client.logLevel=ERROR \
                -Drocketmq.client.logRoot="$DIR/java" -Duser.home="$DIR/java" -cp "$JAVA/classes:$JAVA/lib/*" \
                txmq.compat.Main bench --namesrv 127.0.0.1:$NS --mode tx --topic BenchGen --group BenchGenJava \
                --inflight 16 --seconds "$SECONDS_PER_WINDOW" 2>/dev/null | grep '"result"')
        fi
        after=$(cpu)
        echo "$result" | python3 -c "
import json, os, sys
d = json.loads(sys.stdin.read())
ticks = os.sysconf('SC_CLK_TCK')
print(f\"$gen: {d['rate']:.0f} tx/s, p50 {d['p50_ms']:.2f} ms, broker {($after - $before) / ticks / d['count'] * 1e6:.1f} us/tx\")"
    done
done
