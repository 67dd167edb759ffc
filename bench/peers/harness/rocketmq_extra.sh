#!/usr/bin/env bash
# EXTRA_BENCH_CMD for the peer harness's run_all.sh: Apache RocketMQ 5.5.0 (bench/peers/rocketmq/apache_rocketmq.py,
# flushDiskType SYNC_FLUSH, broker heap 1 GiB) measured by the same txmq_bench.py as txmq: the same Python client
# (txmq's asyncio client speaks RocketMQ's 4.x remoting protocol), cases and probes, so only the broker differs.
# Server CPU counts the broker JVM and the name server JVM (as `txmq dev` holds both in one process). Before the
# windows, WARM_PASS seconds (default 10) of unrecorded sends let the JIT compile the send path; txmq_extra.sh gives
# txmq the same pass.
# Needs TXMQ_PY (a Python whose venv has txmq) and TXMQ_REPO (the checkout holding bench/peers/rocketmq).
set -u
TPY=${TXMQ_PY:-$PY}
REPO=${TXMQ_REPO:?set TXMQ_REPO to the txmq checkout}
NS_PORT=${ROCKETMQ_NS_PORT:-49976}; BR_PORT=${ROCKETMQ_BR_PORT:-51011}
D=$DATA_DIR/rocketmq; rm -rf "$D"; mkdir -p "$D"
RMQ="$TPY $REPO/bench/peers/rocketmq/apache_rocketmq.py"
stop() { $RMQ stop --dir "$D" >/dev/null 2>&1; cp "$D"/*.out "$LOG_DIR/" 2>/dev/null; rm -rf "$D"; }
trap stop EXIT
# On a saturated machine RocketMQ's fast failure refuses sends that waited 200 ms in its send queue
# ("[TIMEOUT_CLEAN_QUEUE]broker busy", code 2); txmq has no such shedding, so the wait is raised to 10 s here.
printf 'waitTimeMillsInSendQueue=10000\n' >"$DATA_DIR/rocketmq-bench.conf"
$RMQ start --dir "$D" --namesrv-port "$NS_PORT" --broker-port "$BR_PORT" --flush SYNC_FLUSH \
  -c "$DATA_DIR/rocketmq-bench.conf" ${ROCKETMQ_START_ARGS:-} || exit 1
PIDS=$("$TPY" -c "import json,sys; print(' '.join('--server-pid %d' % p for p in json.load(open(sys.argv[1])).values()))" "$D/pids.json")
echo "Apache RocketMQ 5.5.0 SYNC_FLUSH: $PIDS"
sleep 10  # RocketMQ's transaction service spins for about 10 s after start (bench/RESULTS.md, issue 24)
cd "$BENCH_DIR" && "$TPY" txmq_bench.py --namesrv 127.0.0.1:$NS_PORT $PIDS --data-dir "$D" \
  --system rocketmq --variant "5.5.0 SYNC_FLUSH" \
  --duration "$DURATION" --warmup "$WARMUP" --warm-pass "${WARM_PASS:-10}" --out "$RESULTS_FILE" ${TXMQ_BENCH_ARGS:-}
