#!/usr/bin/env bash
# EXTRA_BENCH_CMD for the peer harness's run_all.sh: starts `txmq dev` (SYNC_FLUSH, its default) on loopback and
# private ports, runs txmq_bench.py (this folder's copy, placed in $BENCH_DIR by bench/bench_peers.sh) against it,
# and stops it by pid.
#
# The repository's copy of ../shared/peers/txmq_extra.sh. Changes: today's `txmq dev` also opens the gRPC door (8081)
# and /metrics (5557) by default, which other processes on a shared machine may hold, so both are turned off; it
# listens on 127.0.0.1 only, like the harness's other servers; TXMQ_PY chooses the Python whose venv has txmq
# (default: $PY, the harness's venv), so the compiled build installed in the project's .venv can be measured
# without installing txmq anywhere else.
set -u
NS_PORT=${TXMQ_NS_PORT:-49876}; BR_PORT=${TXMQ_BR_PORT:-50911}
TPY=${TXMQ_PY:-$PY}
TXMQ=$(dirname "$TPY")/txmq
D=$DATA_DIR/txmq; rm -rf "$D"; mkdir -p "$D"
"$TPY" -c "import txmq._hotpath as h; print('txmq hot path:', h.STATE.describe())"
"$TXMQ" dev --data-dir "$D" --host 127.0.0.1 --namesrv-port "$NS_PORT" --broker-port "$BR_PORT" \
  --grpc-port 0 --metrics-port 0 >"$LOG_DIR/txmq.log" 2>&1 &
P=$!
for _ in $(seq 100); do (echo >/dev/tcp/127.0.0.1/$BR_PORT) 2>/dev/null && break; sleep 0.1; done
sleep 1
cd "$BENCH_DIR" && "$TPY" txmq_bench.py --namesrv 127.0.0.1:$NS_PORT --server-pid $P --data-dir "$D" \
  --duration "$DURATION" --warmup "$WARMUP" --warm-pass "${WARM_PASS:-10}" --out "$RESULTS_FILE" ${TXMQ_BENCH_ARGS:-}
kill -INT $P; wait $P
rm -rf "$D"
