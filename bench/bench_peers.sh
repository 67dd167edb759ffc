#!/usr/bin/env bash
# txmq side by side with its peers (issue 16): RabbitMQ quorum and classic queues, NATS JetStream, a PostgreSQL
# transactional outbox (asyncpg and pgbench), Apache RocketMQ 5.5.0 (SYNC_FLUSH) and txmq (SYNC_FLUSH, its default),
# in one run of the peer harness, repeated RUNS times; then the medians and txmq's ratios within each run.
#
#   bash bench/bench_peers.sh            # from the project root; as root (apt-get installs the peers once)
#
# Environment:
#   PEERBENCH_HOME  scratch folder outside the repository (default /tmp/peerbench): the harness, its venv (the peers'
#                   Python clients), data and results/<run>/ (results.jsonl, summary.txt, env.txt, logs/)
#   PEERS_SRC       the harness to copy (default ../shared/peers beside the project, where it is kept)
#   RUNS            runs of the whole harness (default 3); DURATION seconds per window (default 10)
#   ONLY            the harness's own sections (default "disk rabbitmq nats postgres")
#   ROCKETMQ        1 (default) adds Apache RocketMQ 5.5.0 SYNC_FLUSH (bench/peers/rocketmq, needs java and mvn
#                   or its fetched jars); 0 leaves it out
#   TXMQ_PY         the Python whose venv has txmq installed (default: the project's .venv/bin/python, so the
#                   compiled hot path it was installed with is what runs); nothing is installed into it
#   SKIP_INSTALL    1: no apt-get / pip even on the first run
#
# The harness (run_all.sh, servers.sh, bench/*.py) comes from PEERS_SRC unchanged; its txmq parts come from
# bench/peers/harness/ (see the README there). Servers listen on 127.0.0.1 only and are stopped by pid at the end
# of their section. Load: the 1-minute load average is sampled every 5 s into results/<tag>-loadavg.txt.
set -u
REPO=$(cd "$(dirname "$0")/.." && pwd)
PB=${PEERBENCH_HOME:-/tmp/peerbench}
SRC=${PEERS_SRC:-$REPO/../shared/peers}
RUNS=${RUNS:-3}
ROCKETMQ=${ROCKETMQ:-1}
TXMQ_PY=${TXMQ_PY:-$REPO/.venv/bin/python}
HARNESS=$REPO/bench/peers/harness
TAG=peers-$(date -u +%Y%m%d-%H%M%S)

[[ -x $SRC/run_all.sh ]] || { echo "no peer harness at $SRC (set PEERS_SRC)" >&2; exit 1; }
[[ -x $TXMQ_PY ]] || { echo "no Python at $TXMQ_PY (set TXMQ_PY)" >&2; exit 1; }
case "$PB" in "$REPO"|"$REPO"/*) echo "PEERBENCH_HOME must be outside the repository" >&2; exit 1;; esac

mkdir -p "$PB/results"
cp -r "$SRC"/* "$PB"/ && chmod -R u+w "$PB"
cp "$HARNESS/txmq_bench.py" "$PB/bench/txmq_bench.py"
export PEERBENCH_HOME=$PB TXMQ_PY TXMQ_REPO=$REPO
# Fixed ports below Linux's ephemeral range (32768-60999): the harness's defaults lie inside it, and on a busy machine
# a client socket once held PostgreSQL's 55432 when it started (two runs of three lost their PostgreSQL section).
export RMQ_PORT=${RMQ_PORT:-21721} RMQ_DIST_PORT=${RMQ_DIST_PORT:-21722} EPMD_PORT=${EPMD_PORT:-21369}
export NATS_PORT=${NATS_PORT:-21422} NATS_HTTP_PORT=${NATS_HTTP_PORT:-21822} PG_PORT=${PG_PORT:-21432}
export TXMQ_NS_PORT=${TXMQ_NS_PORT:-21876} TXMQ_BR_PORT=${TXMQ_BR_PORT:-21911}
export ROCKETMQ_NS_PORT=${ROCKETMQ_NS_PORT:-22876} ROCKETMQ_BR_PORT=${ROCKETMQ_BR_PORT:-22911}
export DURATION=${DURATION:-10}

if [[ "${SKIP_INSTALL:-0}" != 1 && ! -x $PB/venv/bin/python ]]; then
  echo "first run: installing the peers (apt) and their clients (pip, into $PB/venv)"
  ONLY=none RUN_LABEL=$TAG-install bash "$PB/run_all.sh" || exit 1
fi

EXTRA="bash $HARNESS/txmq_extra.sh"
[[ $ROCKETMQ == 1 ]] && EXTRA="$EXTRA; bash $HARNESS/rocketmq_extra.sh"

(while sleep 5; do echo "$(date -u +%H:%M:%S) $(cat /proc/loadavg)"; done) >"$PB/results/$TAG-loadavg.txt" &
SAMPLER=$!
trap 'kill $SAMPLER 2>/dev/null' EXIT

files=()
for i in $(seq "$RUNS"); do
  echo "=== run $i of $RUNS ($TAG-$i)"
  SKIP_INSTALL=1 RUN_LABEL=$TAG-$i EXTRA_BENCH_CMD="$EXTRA" bash "$PB/run_all.sh"
  files+=("$PB/results/$TAG-$i/results.jsonl")
done
kill $SAMPLER 2>/dev/null

"$TXMQ_PY" "$HARNESS/peer_table.py" "${files[@]}" --loadavg "$PB/results/$TAG-loadavg.txt" \
  | tee "$PB/results/$TAG-table.md"
echo "table: $PB/results/$TAG-table.md"
