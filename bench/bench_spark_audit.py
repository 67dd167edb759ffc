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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--transactions", type=int, default=1_000_000)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--dir", default=None, help="work folder (default: a temp folder, removed afterwards)")
    ap.add_argument("--segment-size", type=int, default=1 << 30, help="commit-log segment size (broker default 1 GiB)")
    ap.add_argument("--report", action="store_true", help="also draw the HTML report")
    args = ap.parse_args()
    work = args.dir or tempfile.mkdtemp(prefix="txmq-bench-audit-")
    store = os.path.join(work, "store")
    out = os.path.join(work, "out")
    try:
        n = args.transactions
        plan = Plan(commit=n * 70 // 100, rollback=n * 20 // 100, discard=n * 5 // 100)
        plan.pending = n - plan.commit - plan.rollback - plan.discard
        t0 = time.perf_counter()
        written = write_transactions(store, plan, segment_size=args.segment_size)
        gen = time.perf_counter() - t0
        segments = len(os.listdir(os.path.join(store, "commitlog")))
        print(f"store: {n} transactions {written} written in {gen:.1f}s ({segments} commit-log segment(s))")
        conf = {
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "8",
            "spark.driver.memory": "2g",
        }
        t1 = time.perf_counter()
        spark = get_spark(args.master, app_name="bench-audit", conf=conf)
        spark.sparkContext.setLogLevel("ERROR")
        session = time.perf_counter() - t1
        result = run_audit(spark, store, out, report=args.report)
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
        spark.stop()
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
