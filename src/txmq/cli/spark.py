"""``txmq spark audit`` and ``txmq spark reconcile``: the Spark jobs from the command line (needs txmq[spark]).

The same functions run under ``spark-submit`` (``python -m txmq.cli.spark ...`` as the application, see
docs/spark.md); ``--master`` defaults to ``local[*]`` outside spark-submit.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def _session(args: argparse.Namespace) -> Any:
    try:
        from txmq.spark import get_spark
    except ModuleNotFoundError as exc:  # pragma: no cover - depends on the install
        raise SystemExit(f"txmq: the Spark jobs need pyspark: pip install 'txmq[spark]' ({exc})") from None
    import logging

    logging.getLogger("py4j").setLevel(logging.WARNING)  # its INFO lines are noise on a command's output
    conf = dict(item.split("=", 1) for item in (args.conf or []))
    if args.remote:
        if args.master:
            raise SystemExit("txmq: give --master or --remote, not both")
        return get_spark(conf=conf, remote=args.remote)  # Spark Connect: the server's log level is its own
    spark = get_spark(args.master, app_name=f"txmq-{args.spark_command}", conf=conf)
    spark.sparkContext.setLogLevel(args.spark_log_level)
    return spark


def cmd_audit(args: argparse.Namespace) -> int:
    from txmq.spark.audit import run_audit

    spark = _session(args)
    result = run_audit(spark, args.store, args.out, report=not args.no_report)
    print(f"{result.transactions} transactions in {result.seconds:.1f}s -> {result.out_dir}/audit.parquet")
    for name, count in result.by_resolution.items():
        print(f"  {name:<10} {count}")
    print(f"  anomalies  {result.anomalies}")
    if result.report:
        print(f"report: {result.report}")
    return 1 if result.anomalies and args.fail_on_anomaly else 0


def cmd_reconcile(args: argparse.Namespace) -> int:
    from txmq.spark.reconcile import run_reconcile

    spark = _session(args)
    summary = run_reconcile(
        spark,
        source=args.source,
        source_key=args.source_key,
        topics=[t for t in args.topics.split(",") if t],
        key=args.key,
        source_format=args.source_format,
        source_table=args.source_table,
        where=args.where,
        namesrv=args.namesrv,
        store=args.store,
        out_dir=args.out,
    )
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        print(
            f"{summary['source_rows']} source rows, {summary['deliveries']} deliveries: "
            f"{summary['missing']} missing, {summary['unexpected']} unexpected, {summary['duplicates']} duplicated"
        )
        for name in ("missing", "unexpected", "duplicates"):
            for row in summary["samples"][name]:
                print(f"  {name}: {row}")
        print("consistent" if summary["consistent"] else "INCONSISTENT")
    return 0 if summary["consistent"] else 1


def cmd_package(args: argparse.Namespace) -> int:
    from txmq.spark.package import describe, write_package

    print(describe(write_package(args.out)), end="")
    return 0


def cmd_cluster(args: argparse.Namespace) -> int:
    import signal
    import threading
    from pathlib import Path

    from txmq.spark.local_cluster import ConnectServer, StandaloneCluster

    work = Path(args.work_dir)
    cluster = StandaloneCluster(work, workers=args.workers, cores=args.cores, memory=args.memory)
    connect = None
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        cluster.start()
        print(f"master: {cluster.master_url} ({args.workers} worker(s), logs in {work / 'logs'})", flush=True)
        if args.connect:
            python = args.executor_python or sys.executable
            connect = ConnectServer(work / "connect", python, master=cluster.master_url, port=args.connect_port)
            connect.start()
            print(f"Spark Connect: {connect.url}", flush=True)
        print("Ctrl-C stops them", flush=True)
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        if connect is not None:
            connect.stop()
        cluster.stop()
    return 0


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--master", default=None, help="Spark master (default local[*]; under spark-submit: its own)")
    p.add_argument("--remote", default=None, metavar="sc://HOST:PORT", help="run through Spark Connect instead")
    p.add_argument("--conf", action="append", metavar="KEY=VALUE", help="extra Spark settings (repeatable)")
    p.add_argument("--spark-log-level", default="ERROR", help="Spark's own log level (default ERROR)")


def add_parser(subparsers: Any) -> None:
    spark = subparsers.add_parser("spark", help="Spark jobs: transaction audit and reconciliation (txmq[spark])")
    sub = spark.add_subparsers(dest="spark_command", required=True)

    audit = sub.add_parser("audit", help="one row per transaction from a store folder, with summaries and a report")
    audit.add_argument("--store", required=True, help="the broker's store folder (storePathRootDir)")
    audit.add_argument("--out", required=True, help="output folder (audit.parquet, summary.json, report.html)")
    audit.add_argument("--no-report", action="store_true", help="skip the HTML report and charts")
    audit.add_argument("--fail-on-anomaly", action="store_true", help="exit 1 when anomalies are found")
    _common(audit)
    audit.set_defaults(func=_guarded(cmd_audit))

    rec = sub.add_parser("reconcile", help="a source-of-truth table against delivered messages")
    rec.add_argument("--source", required=True, help="parquet/CSV/JSON path, SQLite file, or a Spark table name")
    rec.add_argument("--source-format", choices=["parquet", "csv", "json", "sqlite", "table"], default=None)
    rec.add_argument("--source-table", default=None, help="the table inside a SQLite file")
    rec.add_argument("--source-key", required=True, help="the source column that matches the message key")
    rec.add_argument("--where", default=None, help="SQL filter selecting the committed source rows")
    rec.add_argument("--topics", required=True, help="comma-separated topics whose messages are reconciled")
    rec.add_argument("--key", default="keys", help="keys (default), msg_id, tags, property:NAME or json:FIELD")
    where = rec.add_mutually_exclusive_group(required=True)
    where.add_argument("--namesrv", default=None, help="read the topics through the broker (host:port)")
    where.add_argument("--store", default=None, help="read the topics from a store folder")
    rec.add_argument("--out", default=None, help="write missing/unexpected/duplicates parquet and summary.json")
    rec.add_argument("--json", action="store_true", help="print the summary as JSON")
    _common(rec)
    rec.set_defaults(func=_guarded(cmd_reconcile))

    pkg = sub.add_parser("package", help="txmq.zip, the spark-submit application and the executors' requirements")
    pkg.add_argument("--out", default="dist/spark", help="output folder (default dist/spark)")
    pkg.set_defaults(func=cmd_package)

    clu = sub.add_parser("cluster", help="a Spark standalone master and workers (and Spark Connect) on loopback")
    clu.add_argument("--work-dir", default="spark-cluster", help="logs and executors' folders (default spark-cluster)")
    clu.add_argument("--workers", type=int, default=1)
    clu.add_argument("--cores", type=int, default=1, help="cores per worker (default 1)")
    clu.add_argument("--memory", default="1g", help="executor memory per worker (default 1g)")
    clu.add_argument("--connect", action="store_true", help="also a Spark Connect server running on the cluster")
    clu.add_argument("--connect-port", type=int, default=15002, help="its port (default 15002)")
    clu.add_argument("--executor-python", default=None, help="the Python of the Connect server's workers")
    clu.set_defaults(func=cmd_cluster)


def _guarded(fn: Any) -> Any:
    """TxmqSparkError is a TxmqError, which ``txmq`` prints in one line; anything Spark-shaped is unwrapped first."""

    def run(args: argparse.Namespace) -> int:
        from txmq.spark.errors import clear_errors

        with clear_errors():
            return int(fn(args))

    return run


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``spark-submit .../txmq/cli/spark.py audit ...``."""
    from txmq.cli import main as txmq_main

    return txmq_main(["spark", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
