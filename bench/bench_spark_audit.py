"""Transaction audit benchmark: N transactions written straight into a store (ASYNC flush, not timed), then the audit
(txmq spark audit's run_audit without the HTML report) on local[2], timed.

    .venv/bin/python bench/bench_spark_audit.py --transactions 1000000
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from txmq.spark import get_spark
from txmq.spark.audit import run_audit
from txmq.spark.synthetic import Plan, write_transactions


def tree_cpu() -> float:
    """CPU seconds used so far by this process and every live descendant (the JVM, its Python workers), including
    the children they have reaped: what the audit's phases cost whatever else runs on the machine."""
    tick = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    used: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(name)] = int(fields[1])
        used[int(name)] = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    me = os.getpid()
    total = 0
    for pid, ticks in used.items():
        p = pid
        while p not in (0, 1, me) and p in parent:
            p = parent[p]
        if p == me:
            total += ticks
    return total / tick


def scan_cpu(store: str) -> str:
    """The transactions view of format txmq-store read by this process alone: what every executor task does, without
    Spark. CPU seconds (less sensitive to a loaded machine than wall time) per record."""
    from txmq.spark.store_source import TxmqStoreReader

    reader = TxmqStoreReader({"path": store, "view": "transactions"})
    started = time.process_time()
    rows = sum(batch.num_rows for part in reader.partitions() for batch in reader.read(part))
    cpu = time.process_time() - started
    return f"{rows} rows in {cpu:.2f} CPU s, {cpu / rows * 1e6:.2f} us per row"


def print_stages(events_dir: str) -> None:
    """Each stage of the run (Spark's event log): its wall time, its tasks' run time and JVM CPU time, its shuffle
    writes and reads: where the Spark side of the audit goes (a Python worker's own CPU is not in the JVM's)."""
    import json

    stages: dict[int, dict[str, object]] = {}
    walked = [(d, n) for d, _dirs, names in os.walk(events_dir) for n in names]
    files = [os.path.join(d, n) for d, n in walked if n[0] != "." and "appstatus" not in n]
    for path in files:
        if os.path.getsize(path) == 0:
            continue
        with open(path) as f:
            for line in f:
                event = json.loads(line)
                kind = event.get("Event")
                if kind == "SparkListenerTaskEnd":
                    metrics = event.get("Task Metrics") or {}
                    st = stages.setdefault(event["Stage ID"], {"run": 0.0, "cpu": 0.0, "sw": 0, "sr": 0})
                    st["run"] += metrics.get("Executor Run Time", 0) / 1e3  # type: ignore[operator]
                    st["cpu"] += metrics.get("Executor CPU Time", 0) / 1e9  # type: ignore[operator]
                    st["sw"] += (metrics.get("Shuffle Write Metrics") or {}).get("Shuffle Bytes Written", 0)  # type: ignore[operator]
                    read = metrics.get("Shuffle Read Metrics") or {}
                    st["sr"] += read.get("Remote Bytes Read", 0) + read.get("Local Bytes Read", 0)  # type: ignore[operator]
                elif kind == "SparkListenerStageCompleted":
                    info = event["Stage Info"]
                    st = stages.setdefault(info["Stage ID"], {"run": 0.0, "cpu": 0.0, "sw": 0, "sr": 0})
                    st["name"] = info["Stage Name"]
                    st["tasks"] = info["Number of Tasks"]
                    st["wall"] = (info.get("Completion Time", 0) - info.get("Submission Time", 0)) / 1e3
    print("stage  tasks  wall s  task run s  JVM CPU s  shuffle write MB  shuffle read MB  name")
    for sid in sorted(stages):
        st = stages[sid]
        print(
            f"{sid:5d} {st.get('tasks', 0):6d} {st.get('wall', 0.0):7.1f} {st['run']:11.1f} {st['cpu']:10.1f}"
            f" {st['sw'] / 1e6:17.1f} {st['sr'] / 1e6:16.1f}  {st.get('name', '?')}"  # type: ignore[operator]
        )
    total = sum(st.get("wall", 0.0) for st in stages.values())  # type: ignore[misc]
    cpu = sum(st["cpu"] for st in stages.values())  # type: ignore[misc]
    print(f"{len(stages)} stages, {total:.1f} s of stage wall time, {cpu:.1f} s of JVM CPU in tasks")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--transactions", type=int, default=1_000_000)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--dir", default=None, help="work folder (default: a temp folder, removed afterwards)")
    ap.add_argument(
        "--store", default=None, help="audit this store (written earlier by this benchmark with the same count) instead"
    )
    ap.add_argument("--segment-size", type=int, default=1 << 30, help="commit-log segment size (broker default 1 GiB)")
    ap.add_argument("--report", action="store_true", help="also draw the HTML report")
    ap.add_argument("--cpu", action="store_true", help="phases in CPU seconds of the process tree, not wall time")
    ap.add_argument("--scan-cpu", action="store_true", help="also time the store scan alone (CPU s, one process)")
    ap.add_argument(
        "--stages", action="store_true", help="print each Spark stage's time and JVM CPU (from Spark's event log)"
    )
    ap.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="another Spark setting (repeatable)"
    )
    args = ap.parse_args()
    work = args.dir or tempfile.mkdtemp(prefix="txmq-bench-audit-")
    store = args.store or os.path.join(work, "store")
    out = os.path.join(work, "out")
    try:
        n = args.transactions
        plan = Plan(commit=n * 70 // 100, rollback=n * 20 // 100, discard=n * 5 // 100)
        plan.pending = n - plan.commit - plan.rollback - plan.discard
        t0 = time.perf_counter()
        written = "reused" if args.store else write_transactions(store, plan, segment_size=args.segment_size)
        gen = time.perf_counter() - t0
        segments = len(os.listdir(os.path.join(store, "commitlog")))
        print(f"store: {n} transactions {written} written in {gen:.1f}s ({segments} commit-log segment(s))")
        conf = {
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "8",
            "spark.driver.memory": "2g",
        }
        conf |= dict(item.split("=", 1) for item in args.conf)
        events_dir = os.path.join(work, "spark-events")
        if args.stages:
            os.makedirs(events_dir, exist_ok=True)
            conf |= {
                "spark.eventLog.enabled": "true",
                "spark.eventLog.dir": events_dir,
                "spark.eventLog.compress": "false",
                "spark.eventLog.rolling.enabled": "false",
            }
        t1 = time.perf_counter()
        spark = get_spark(args.master, app_name="bench-audit", conf=conf)
        spark.sparkContext.setLogLevel("ERROR")
        session = time.perf_counter() - t1
        cpu0 = tree_cpu()
        result = run_audit(
            spark, store, out, report=args.report, phase_clock=tree_cpu if args.cpu else time.perf_counter
        )
        cpu = tree_cpu() - cpu0
        total = result.seconds
        assert result.transactions == n, result
        assert result.by_resolution == {
            "COMMIT": plan.commit,
            "ROLLBACK": plan.rollback,
            "DISCARDED": plan.discard,
            "PENDING": plan.pending,
        }, result.by_resolution
        assert result.anomalies == 0
        print(f"session start: {session:.1f}s")
        print(f"audit of {n} transactions on {args.master}: {total:.1f}s, {n / total:,.0f} transactions/s")
        unit = "CPU s" if args.cpu else "s"
        print(f"phases ({unit}): " + ", ".join(f"{k} {v:.1f}" for k, v in result.phases.items()))
        print(f"CPU of the driver, the JVM and its Python workers during the audit: {cpu:.1f}s")
        if args.scan_cpu:
            print(f"scan in this process, no Spark: {scan_cpu(store)}")
        spark.stop()
        if args.stages:
            print_stages(events_dir)
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
