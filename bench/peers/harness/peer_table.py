"""Issue 16's table from runs of the peer harness: medians over runs, and txmq's ratios to its peers within each run.

    python bench/peers/harness/peer_table.py RESULTS.jsonl [RESULTS2.jsonl ...] [--loadavg FILE]

Each file is one run of ``run_all.sh`` (``$PEERBENCH_HOME/results/<run>/results.jsonl``). For every measure the
table gives each system's median rate over the runs, then txmq's ratio to the reference peer of issue 16's target
computed within each run (the machine is shared, so only figures of one run compare) and the median of those
ratios. A second table gives CPU per operation (server and client, microseconds of CPU per message or transaction)
and the CPU other processes used during txmq's windows. Standard library only.
"""

from __future__ import annotations

import json
import statistics
import sys

# (measure, system, variant, mode): the rows the table reads; a variant or mode of None matches any.
COLUMNS = [
    ("RabbitMQ quorum", "rabbitmq", "quorum (durable)"),
    ("RabbitMQ classic", "rabbitmq", "classic durable, persistent"),
    ("NATS file (no fsync)", "nats", "file stream, default sync"),
    ("PG outbox asyncpg", "postgres", "outbox txn (asyncpg)"),
    ("PG outbox pgbench (C)", "postgres", "REF outbox txn (pgbench, C client)"),
    ("RocketMQ 5.5.0 SYNC", "rocketmq", "5.5.0 SYNC_FLUSH"),
    ("txmq", "txmq", "SYNC_FLUSH (default)"),
]
MEASURES = [
    # name, {system: mode}, reference column, target ratio
    (
        "publish x1 (msg/s)",
        {
            "rabbitmq": "publish sync (1 in flight)",
            "nats": "publish sync (1 in flight)",
            "rocketmq": "publish sync (1 in flight)",
            "txmq": "publish sync (1 in flight)",
        },
        "RabbitMQ quorum",
        2.0,
    ),
    (
        "publish x128 (msg/s)",
        {
            "rabbitmq": "publish pipelined (128 in flight)",
            "nats": "publish async (128 in flight)",
            "rocketmq": "publish pipelined (128 in flight)",
            "txmq": "publish pipelined (128 in flight)",
        },
        "RabbitMQ quorum",
        1.5,
    ),
    (
        "transactions x1 (tx/s)",
        {
            "postgres": "commit, 1 client",
            "rocketmq": "tx prepare+commit (1 in flight)",
            "txmq": "tx prepare+commit (1 in flight)",
        },
        "PG outbox asyncpg",
        None,
    ),
    (
        "transactions x16 (tx/s)",
        {
            "postgres": "commit, 16 clients",
            "rocketmq": "tx prepare+commit (16 in flight)",
            "txmq": "tx prepare+commit (16 in flight)",
        },
        "PG outbox asyncpg",
        3.0,
    ),
    (
        "consume (msg/s)",
        {
            "rabbitmq": "consume prefetch 256, ack/128",
            "nats": "pull fetch 256, AckAll/batch",
            "rocketmq": "consume (pull 32)",
            "txmq": "consume (pull 32)",
        },
        "RabbitMQ quorum",
        1.0,
    ),
]


def load(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def find(rows: list[dict], system: str, variant: str, mode: str | None) -> dict | None:
    for r in rows:
        same = r["system"] == system and r["variant"] == variant and (mode is None or r["mode"] == mode)
        if same and not r.get("skipped") and r.get("rate"):
            return r
    return None


def med(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(x: float | None, digits: int = 0) -> str:
    return "" if x is None else f"{x:,.{digits}f}"


def cpu_us(r: dict | None, key: str) -> float | None:
    """Microseconds of CPU per operation: CPU % of one core over the probe, divided by the rate."""
    if r is None or r.get(key) is None or not r.get("rate"):
        return None
    return r[key] * 1e4 / r["rate"]


def main(argv: list[str]) -> int:
    loadavg = None
    if "--loadavg" in argv:
        i = argv.index("--loadavg")
        loadavg = argv[i + 1]
        argv = argv[:i] + argv[i + 2 :]
    runs = [load(p) for p in argv]
    print(f"{len(runs)} run(s): " + ", ".join(rows[0].get("run", "?") for rows in runs if rows))
    head = ["measure"] + [c[0] for c in COLUMNS] + ["target", "txmq / reference, per run", "median ratio"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    cpu_lines = []
    for name, modes, ref, target in MEASURES:
        cells = [name]
        per_run: dict[str, list[dict | None]] = {}
        for label, system, variant in COLUMNS:
            mode = modes.get(system)
            found = [find(rows, system, variant, mode) if mode else None for rows in runs]
            per_run[label] = found
            m = med([r["rate"] for r in found if r])
            cells.append(fmt(m))
        ratios = []
        for t, rf in zip(per_run["txmq"], per_run[ref], strict=True):
            ratios.append(t["rate"] / rf["rate"] if t and rf else None)
        mr = med(ratios)
        cells.append(f">= {target}x {ref}" if target else f"(vs {ref})")
        cells.append(", ".join(fmt(x, 2) for x in ratios))
        verdict = ""
        if mr is not None and target is not None:
            verdict = " met" if mr >= target else f" missed by {1 - mr / target:.0%}"
        cells.append(f"**{fmt(mr, 2)}**{verdict}" if mr is not None else "")
        print("| " + " | ".join(cells) + " |")
        for label in (ref, "RocketMQ 5.5.0 SYNC", "txmq"):
            found = per_run[label]
            if not any(found):
                continue
            cpu_lines.append(
                [
                    name,
                    label,
                    fmt(med([r["rate"] for r in found if r])),
                    fmt(med([r.get("server_cpu_pct") for r in found if r])),
                    fmt(med([cpu_us(r, "server_cpu_pct") for r in found])),
                    fmt(med([r.get("client_cpu_pct") for r in found if r])),
                    fmt(med([cpu_us(r, "client_cpu_pct") for r in found])),
                    fmt(med([r.get("server_fsyncs_per_s") for r in found if r])),
                    fmt(med([r.get("other_cpu_pct") for r in found if r])),
                ]
            )
    print()
    head = [
        "measure",
        "system",
        "rate",
        "server CPU %",
        "server CPU us/op",
        "client CPU %",
        "client CPU us/op",
        "server fsync/s",
        "other processes' CPU %",
    ]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    seen = set()
    for line in cpu_lines:
        key = (line[0], line[1])
        if key not in seen:
            seen.add(key)
            print("| " + " | ".join(line) + " |")
    for rows in runs:
        for r in rows:
            if r.get("errors") or r.get("nacks"):
                what = f"errors={r.get('errors')} nacks={r.get('nacks')}"
                print(f"\nnote: {r.get('run')} {r['system']} / {r['mode']}: {what}")
    if loadavg:
        with open(loadavg) as f:
            one = [float(line.split()[1]) for line in f if line.strip()]  # time, then /proc/loadavg
        if one:
            q = statistics.quantiles(one, n=10) if len(one) > 1 else [one[0]] * 9
            print(
                f"\nload average (1 min) sampled every 5 s during the runs: min {min(one):.1f}, median "
                f"{statistics.median(one):.1f}, 90th percentile {q[8]:.1f}, max {max(one):.1f} ({len(one)} samples)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
