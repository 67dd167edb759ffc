"""Transaction audit: one row per transaction found in a store folder, with summaries and anomalies.

It follows the on-disk conventions of docs/transactions.md §4: a transaction is its half record (H = its commit-log
offset) in ``RMQ_SYS_TRANS_HALF_TOPIC``; op markers (tag ``d``, ``TXMQ_DECISION``, ``TXMQ_HALF_PHYS``, body = half
queue offset) decide it, ``txmq_resume`` records put a DISCARDED one back in doubt; a COMMIT stores a copy in the
real topic with sysFlag COMMIT type and PREPARED TX OFFSET = H; a discard copies the half message to
``TRANS_CHECK_MAX_TIME_TOPIC``. Checks sent are counted from ``config/transactionJournal.log`` (``C <H> <ms>`` lines;
the older ``transactionChecks.json`` is read when there is no journal).

Classification (§4.3): the first COMMIT, ROLLBACK or UNKNOWN marker in commit-log order decides; UNKNOWN (a marker
written by RocketMQ) is a COMMIT when a committed copy exists, else a ROLLBACK. Without a decision, the last of the
DISCARD markers and resume records says DISCARDED or back in doubt; an undecided transaction with a committed copy is
a COMMIT whose marker was lost to a crash; anything else is PENDING. The resolution time is the deciding marker's
BORNTIMESTAMP (the broker's clock when it decided); the prepare time is the half record's STORETIMESTAMP.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from txmq.spark.errors import TxmqSparkError
from txmq.txn.journal import JOURNAL_NAME, LEGACY_CHECKS_NAME, parse_journal, parse_legacy_checks
from txmq.txn.rebuild import RESUME as REPLAY_RESUME
from txmq.txn.rebuild import Folded, OpEvent, fold

RESOLUTIONS = ("COMMIT", "ROLLBACK", "DISCARDED", "PENDING")
AUDIT_COLUMNS = (
    "producer_group",
    "real_topic",
    "transaction_id",
    "uniq_key",
    "half_commit_log_offset",
    "prepared_at",
    "resolved_at",
    "resolution",
    "checks_sent",
    "time_to_resolution_ms",
    "delivered_msg_id",
    "deliveries",
    "messages",  # how many messages the transaction holds (txmq: several in one transaction)
    "messages_delivered",  # how many of them have a committed copy
    "max_deliveries",  # the most copies any one of them has
)


def deciding_event(actions: tuple[str, ...]) -> tuple[int, str] | None:
    """Which of a transaction's op events (their actions in log order: COMMIT, ROLLBACK, DISCARD, UNKNOWN, RESUME,
    or a decision txmq does not know) is in force once :func:`txmq.txn.rebuild.fold` has replayed them all, and its
    action as the fold reads it; None when none is (in doubt). The fold looks at nothing but the actions, so one
    answer serves every transaction with the same sequence."""
    folded = Folded()
    for i, action in enumerate(actions):
        fold(folded, OpEvent(i, action, 0))
    decided = folded.decision
    return None if decided is None else (decided.seq, decided.action)


def transaction_decisions(spark: SparkSession, ops: DataFrame) -> DataFrame:
    """(half_phys, decision, decision_ms) per transaction with op records: the decision in force (COMMIT, ROLLBACK,
    UNKNOWN, or DISCARD while discarded) and its marker's born time.

    Each transaction's events are gathered and sorted in Spark; the distinct action sequences (a handful: "COMMIT",
    "ROLLBACK", "DISCARD", "DISCARD,RESUME,COMMIT", ...) come to the driver, where the broker's own fold decides
    each once, and the answers are joined back. No Python runs per transaction, and the executors run none here.
    This runs one Spark job (the distinct sequences) when called."""
    col = F.col
    action = F.when(col("kind") == "RESUME", F.lit(REPLAY_RESUME)).otherwise(
        F.coalesce(col("decision"), F.lit("UNKNOWN"))
    )
    event = F.struct(col("commit_log_offset").alias("o"), action.alias("a"), col("born_timestamp").alias("t"))
    per_tx = (
        ops.filter(col("half_phys").isNotNull())
        .groupBy("half_phys")
        .agg(F.array_sort(F.collect_list(event)).alias("events"))
        .withColumn("actions", F.concat_ws(",", F.transform("events", lambda e: e["a"])))
    )
    answers = []
    for row in per_tx.select("actions").distinct().collect():
        found = deciding_event(tuple(row["actions"].split(",")))
        answers.append((row["actions"], *(found if found is not None else (None, None))))
    table = spark.createDataFrame(answers, "actions string, pick int, decided string")
    return per_tx.join(F.broadcast(table), "actions", "left").select(
        "half_phys",
        col("decided").alias("decision"),
        F.get(col("events"), col("pick"))["t"].alias("decision_ms"),
    )


def transaction_events(spark: SparkSession, store: str) -> DataFrame:
    """The store's transaction-related records (format ``txmq-store``, view ``transactions``)."""
    return spark.read.format("txmq-store").option("view", "transactions").load(store)


def check_counts(spark: SparkSession, store: str) -> DataFrame:
    """Checks sent per half message, as (half_phys, checks): ``C`` lines of ``config/transactionJournal.log`` (an
    unterminated last line is a torn append and is ignored), else the older ``transactionChecks.json``."""
    config = os.path.join(store, "config")
    journal = os.path.join(config, JOURNAL_NAME)
    try:
        with open(journal, "rb") as f:
            attempts = parse_journal(f.read()).attempts
    except FileNotFoundError:
        legacy = os.path.join(config, LEGACY_CHECKS_NAME)
        try:
            with open(legacy, "rb") as f:
                attempts = parse_legacy_checks(f.read())
        except FileNotFoundError:
            attempts = {}
        except (OSError, ValueError) as exc:
            raise TxmqSparkError(f"transaction check counts {legacy} are unreadable: {exc}") from None
    except OSError as exc:
        raise TxmqSparkError(f"transaction journal {journal} is unreadable: {exc}") from None
    counts = {phys: len(checks) for phys, checks in attempts.items()}
    return spark.createDataFrame(list(counts.items()), "half_phys bigint, journal_checks int")


def transaction_audit(spark: SparkSession, store: str, events: DataFrame | None = None) -> DataFrame:
    """One row per transaction in ``store`` (see AUDIT_COLUMNS): a half message, or the messages of a transaction
    of several together; lazily evaluated but for two small jobs (whether the store has op markers written by
    RocketMQ, and the distinct op sequences, see :func:`transaction_decisions`).

    ``events`` defaults to :func:`transaction_events`, which several steps of the plan read; pass a cached or
    materialised copy (as :func:`run_audit` does) to scan the store once."""
    ev = events if events is not None else transaction_events(spark, store)
    col = F.col
    halves = ev.filter(col("kind") == "HALF").select(
        "half_phys",
        "half_queue_offset",
        "producer_group",
        col("topic").alias("real_topic"),
        "transaction_id",
        "uniq_key",
        col("store_timestamp").alias("prepared_ms"),
        "tx_seq",
    )
    by_queue_offset = halves.select(col("half_queue_offset").alias("q"), col("half_phys").alias("hp"))
    op_columns = ("kind", "decision", "commit_log_offset", "born_timestamp")
    all_ops = ev.filter(col("kind").isin("OP", "RESUME"))
    ops = all_ops.filter(col("half_phys").isNotNull()).select("half_phys", *op_columns)
    # txmq's markers name their half message's commit-log offset. RocketMQ's do not (a store that RocketMQ wrote):
    # they are matched to their half message by its queue offset, which costs a join over every half message, made
    # only when the store has such markers (one small job looks).
    anonymous = all_ops.filter(col("half_phys").isNull())
    if anonymous.limit(1).count():
        ops = ops.unionByName(
            anonymous.join(by_queue_offset, col("half_queue_offset") == col("q"), "left").select(
                col("hp").alias("half_phys"), *op_columns
            )
        )
    # How each transaction ended: its op records replayed in log order through the broker's own fold.
    decisions = transaction_decisions(spark, ops)
    deliveries = (
        ev.filter(col("kind") == "DELIVERY")
        .groupBy("half_phys")
        .agg(
            F.count(F.lit(1)).alias("deliveries"),
            F.min_by("offset_msg_id", "commit_log_offset").alias("delivered_msg_id"),
            F.min("store_timestamp").alias("delivered_ms"),
        )
    )
    discard_checks = (
        ev.filter((col("kind") == "DISCARD_COPY") & col("uniq_key").isNotNull())
        .groupBy(col("uniq_key").alias("dk"), col("producer_group").alias("dg"))
        .agg(F.max("checks").alias("discard_checks"))
    )
    joined = (
        halves.join(decisions, "half_phys", "left")
        .join(deliveries, "half_phys", "left")
        .join(check_counts(spark, store), "half_phys", "left")
        .join(discard_checks, (col("uniq_key") == col("dk")) & (col("producer_group") == col("dg")), "left")
        .withColumn("deliveries", F.coalesce(col("deliveries"), F.lit(0)))
    )
    decision = col("decision")
    resolution = (
        F.when(decision == "COMMIT", F.lit("COMMIT"))
        .when(decision == "ROLLBACK", F.lit("ROLLBACK"))
        .when((decision == "UNKNOWN") & (col("deliveries") > 0), F.lit("COMMIT"))  # a RocketMQ marker, copy stored
        .when(decision == "UNKNOWN", F.lit("ROLLBACK"))
        .when(decision == "DISCARD", F.lit("DISCARDED"))
        .when(col("deliveries") > 0, F.lit("COMMIT"))  # copy stored, marker lost to a crash
        .otherwise(F.lit("PENDING"))
    )
    resolved_ms = F.when(decision.isNotNull(), col("decision_ms")).when(col("deliveries") > 0, col("delivered_ms"))
    checks = F.coalesce(
        col("journal_checks"),
        F.when(col("resolution") == "DISCARDED", col("discard_checks")),
        F.when(col("resolution").isin("PENDING", "DISCARDED"), F.lit(0)),
    )
    per_half = (
        joined.withColumn("resolution", resolution)
        .withColumn("resolved_ms", resolved_ms)
        .select(
            "producer_group",
            "real_topic",
            "transaction_id",
            "uniq_key",
            col("half_phys").alias("half_commit_log_offset"),
            F.timestamp_millis("prepared_ms").alias("prepared_at"),
            F.timestamp_millis("resolved_ms").alias("resolved_at"),
            "resolution",
            checks.cast("int").alias("checks_sent"),
            (col("resolved_ms") - col("prepared_ms")).alias("time_to_resolution_ms"),
            "delivered_msg_id",
            col("deliveries").cast("int").alias("deliveries"),
            "tx_seq",
        )
    )
    return _one_row_per_transaction(per_half)


_PER_HALF = AUDIT_COLUMNS[: AUDIT_COLUMNS.index("messages")]


def _one_row_per_transaction(per_half: DataFrame) -> DataFrame:
    """A transaction of one message is its half message's row. The messages of a transaction of several (same
    producer group and TXMQ_TX_ID) become one row: the first message's, with the count of messages, of those
    delivered, and every delivery."""
    col = F.col
    delivered = (col("deliveries") > 0).cast("int")
    single = (
        per_half.filter(col("tx_seq").isNull())
        .withColumn("messages", F.lit(1))
        .withColumn("messages_delivered", delivered)
        .withColumn("max_deliveries", col("deliveries"))
        .select(*AUDIT_COLUMNS)
    )
    several = (
        per_half.filter(col("tx_seq").isNotNull())
        .groupBy("producer_group", "transaction_id")
        .agg(
            F.min_by(F.struct(*[c for c in _PER_HALF if c != "deliveries"]), col("tx_seq")).alias("first"),
            F.sum("deliveries").cast("int").alias("deliveries"),
            F.count(F.lit(1)).cast("int").alias("messages"),
            F.sum(delivered).cast("int").alias("messages_delivered"),
            F.max("deliveries").cast("int").alias("max_deliveries"),
        )
        .select("first.*", "deliveries", "messages", "messages_delivered", "max_deliveries")
        .select(*AUDIT_COLUMNS)
    )
    return single.unionByName(several)


# ---------------------------------------------------------------------------------------------------------------
# Summaries


def resolutions_by_group_topic(audit: DataFrame) -> DataFrame:
    return (
        audit.groupBy("producer_group", "real_topic")
        .pivot("resolution", list(RESOLUTIONS))
        .count()
        .fillna(0)
        .orderBy("producer_group", "real_topic")
    )


def latency_percentiles(audit: DataFrame) -> DataFrame:
    """Time from prepare to decision (ms) per resolution: count, p50, p90, p99, max."""
    lat = F.col("time_to_resolution_ms")
    return (
        audit.filter(F.col("resolution") != "PENDING")
        .groupBy("resolution")
        .agg(
            F.count(F.lit(1)).alias("count"),
            F.percentile_approx(lat, 0.5).alias("p50_ms"),
            F.percentile_approx(lat, 0.9).alias("p90_ms"),
            F.percentile_approx(lat, 0.99).alias("p99_ms"),
            F.max(lat).alias("max_ms"),
        )
        .orderBy("resolution")
    )


def oldest_in_doubt(audit: DataFrame, limit: int = 20, now_ms: int | None = None) -> DataFrame:
    now = int(time.time() * 1000) if now_ms is None else now_ms
    return (
        audit.filter(F.col("resolution") == "PENDING")
        .withColumn("age_ms", F.lit(now) - F.unix_millis("prepared_at"))
        .orderBy("prepared_at")
        .limit(limit)
    )


def anomalies(audit: DataFrame, events: DataFrame) -> DataFrame:
    """COMMIT_WITHOUT_DELIVERY, PARTIAL_DELIVERY (some messages of a transaction of several delivered, not all),
    DOUBLE_DELIVERY and DELIVERY_WITHOUT_COMMIT (including deliveries whose half message
    is not in the store at all): (anomaly, producer_group, real_topic, uniq_key, half_commit_log_offset, resolution,
    deliveries, delivered_msg_id)."""
    col = F.col
    cols = [
        "producer_group",
        "real_topic",
        "uniq_key",
        "half_commit_log_offset",
        "resolution",
        "deliveries",
        "delivered_msg_id",
    ]
    flagged = audit.select(
        F.when((col("resolution") == "COMMIT") & (col("deliveries") == 0), F.lit("COMMIT_WITHOUT_DELIVERY"))
        .when(
            (col("messages_delivered") > 0) & (col("messages_delivered") < col("messages")), F.lit("PARTIAL_DELIVERY")
        )
        .when(col("max_deliveries") > 1, F.lit("DOUBLE_DELIVERY"))
        .when((col("resolution") != "COMMIT") & (col("deliveries") > 0), F.lit("DELIVERY_WITHOUT_COMMIT"))
        .alias("anomaly"),
        *cols,
    ).filter(col("anomaly").isNotNull())
    halves = events.filter(col("kind") == "HALF").select(col("half_phys").alias("hp"))
    orphans = (
        events.filter(col("kind") == "DELIVERY")
        .join(halves, col("half_phys") == col("hp"), "left_anti")
        .groupBy("half_phys")
        .agg(
            F.first("producer_group").alias("producer_group"),
            F.first("topic").alias("real_topic"),
            F.first("uniq_key").alias("uniq_key"),
            F.count(F.lit(1)).cast("int").alias("deliveries"),
            F.min_by("offset_msg_id", "commit_log_offset").alias("delivered_msg_id"),
        )
        .select(
            F.lit("DELIVERY_WITHOUT_COMMIT").alias("anomaly"),
            "producer_group",
            "real_topic",
            "uniq_key",
            col("half_phys").alias("half_commit_log_offset"),
            F.lit(None).cast("string").alias("resolution"),
            "deliveries",
            "delivered_msg_id",
        )
    )
    return flagged.unionByName(orphans)


@dataclass
class AuditResult:
    out_dir: str
    transactions: int
    by_resolution: dict[str, int]
    anomalies: int
    seconds: float
    report: str | None
    # Seconds per phase (of run_audit's phase_clock): "scan" (the store read, events.parquet written), "audit" (the
    # joins and the fold, audit.parquet written), "summaries" (anomalies and summary.json), "report".
    phases: dict[str, float] = field(default_factory=dict)


def run_audit(
    spark: SparkSession,
    store: str,
    out_dir: str,
    *,
    report: bool = True,
    phase_clock: Callable[[], float] = time.perf_counter,
) -> AuditResult:
    """Write ``events.parquet`` (the store's transaction records), ``audit.parquet``, ``anomalies.parquet``,
    ``summary.json`` and, optionally, ``report.html`` with its charts. ``phase_clock`` measures the phases (wall
    time by default; the benchmark passes the CPU time of the processes doing the work)."""
    from txmq.spark.errors import clear_errors

    started = time.perf_counter()
    phase_start = phase_clock()
    phases: dict[str, float] = {}

    def lap(name: str) -> None:
        phases[name] = phase_clock() - phase_start - sum(phases.values())

    os.makedirs(out_dir, exist_ok=True)
    with clear_errors():
        # The store is scanned once: the events land in parquet, and every later step reads that.
        events_path = os.path.join(out_dir, "events.parquet")
        transaction_events(spark, store).write.mode("overwrite").parquet(events_path)
        lap("scan")
        events = spark.read.parquet(events_path)
        audit_path = os.path.join(out_dir, "audit.parquet")
        transaction_audit(spark, store, events).write.mode("overwrite").parquet(audit_path)
        lap("audit")
        audit = spark.read.parquet(audit_path)
        counts = {r["resolution"]: int(r["count"]) for r in audit.groupBy("resolution").count().collect()}
        found = anomalies(audit, events)
        found.write.mode("overwrite").parquet(os.path.join(out_dir, "anomalies.parquet"))
        anomaly_rows = spark.read.parquet(os.path.join(out_dir, "anomalies.parquet"))
        by_group = resolutions_by_group_topic(audit)
        latency = latency_percentiles(audit)
        oldest = oldest_in_doubt(audit)
        summary = {
            "store": os.path.abspath(store),
            "transactions": sum(counts.values()),
            "by_resolution": {r: counts.get(r, 0) for r in RESOLUTIONS},
            "anomalies": {r["anomaly"]: int(r["count"]) for r in anomaly_rows.groupBy("anomaly").count().collect()},
            "by_group_topic": [r.asDict() for r in by_group.collect()],
            "latency_ms": [r.asDict() for r in latency.collect()],
            "oldest_in_doubt": [
                {**r.asDict(), "prepared_at": str(r["prepared_at"])} for r in oldest.drop("resolved_at").collect()
            ],
        }
        with open(os.path.join(out_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2, default=str)
        lap("summaries")
        html = None
        if report:
            from txmq.spark.report import write_report

            html = write_report(spark, audit, anomaly_rows, summary, out_dir)
            lap("report")
    return AuditResult(
        out_dir=out_dir,
        transactions=summary["transactions"],
        by_resolution=summary["by_resolution"],
        anomalies=sum(summary["anomalies"].values()),
        seconds=time.perf_counter() - started,
        report=html,
        phases=phases,
    )
