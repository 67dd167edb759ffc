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
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from txmq.spark import audit_ranges
from txmq.spark.errors import TxmqSparkError
from txmq.spark.store_source import DEFAULT_SPLIT_BYTES, commitlog_dir
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


# The columns of the transactions view that the per-transaction pass reads (one shuffle of these, by half_phys).
PASS_INPUT = (
    "kind",
    "commit_log_offset",
    "half_phys",
    "producer_group",
    "topic",
    "transaction_id",
    "uniq_key",
    "offset_msg_id",
    "decision",
    "born_timestamp",
    "store_timestamp",
    "tx_seq",
)
# What it writes: a row per half message (orphan false) with how it was decided and delivered, and a row per half
# commit-log offset that has committed copies but no half message in the store (orphan true).
PASS_SCHEMA = (
    "orphan boolean, half_phys bigint, producer_group string, real_topic string, transaction_id string,"
    " uniq_key string, prepared_ms bigint, tx_seq int, decision string, decision_ms bigint, deliveries int,"
    " delivered_msg_id string, delivered_ms bigint"
)
_SEP = "\x1f"
_ARROW_TYPES = {"boolean": pa.bool_(), "bigint": pa.int64(), "string": pa.string(), "int": pa.int32()}
PASS_ARROW = pa.schema(
    [pa.field(n, _ARROW_TYPES[t]) for n, t in (f.strip().split(" ") for f in PASS_SCHEMA.split(","))]
)


def per_transaction(batches: Iterator[Any]) -> Iterator[Any]:
    """The per-transaction pass, run by ``mapInArrow`` over a partition that holds every record of its half messages
    (the events are shuffled by ``half_phys``): pyarrow groups and joins, no Python per row.

    - decisions: each half message's op events sorted in commit-log order, their actions joined into a sequence
      ("COMMIT", "DISCARD,RESUME,COMMIT", ...); the few distinct sequences are replayed once each through the
      broker's own fold (:func:`deciding_event`), which also says which event's born time is the decision's;
    - deliveries: count, the first copy's offsetMsgId and the earliest store time;
    - orphans: committed copies whose half message is not in the store."""
    schema = PASS_ARROW
    got = list(batches)
    if not got or not sum(b.num_rows for b in got):
        return
    table = pa.Table.from_batches(got).combine_chunks()
    kind = table["kind"]
    first = pc.ScalarAggregateOptions(skip_nulls=False)
    every = pc.CountOptions(mode="all")

    ops = table.filter(pc.is_in(kind, value_set=pa.array(["OP", "RESUME"])))
    action = pc.if_else(
        pc.equal(ops["kind"], "RESUME"), pa.scalar(REPLAY_RESUME), pc.coalesce(ops["decision"], pa.scalar("UNKNOWN"))
    )
    events = pa.table(
        {"half_phys": ops["half_phys"], "o": ops["commit_log_offset"], "a": action, "t": ops["born_timestamp"]}
    ).sort_by([("half_phys", "ascending"), ("o", "ascending"), ("a", "ascending"), ("t", "ascending")])
    grouped = events.group_by("half_phys", use_threads=False).aggregate([("a", "list"), ("t", "list")])
    grouped = grouped.combine_chunks()
    sequences = pc.binary_join(grouped["a_list"], _SEP)  # a unit separator: a decision's text may hold a comma
    distinct = pc.unique(sequences)
    answers = [deciding_event(tuple(seq.split(_SEP))) for seq in distinct.to_pylist()]
    where = pc.index_in(sequences, value_set=distinct)
    pick = pc.take(pa.array([None if a is None else a[0] for a in answers], pa.int64()), where)
    decided = pc.take(pa.array([None if a is None else a[1] for a in answers], pa.string()), where)
    borns = grouped["t_list"].combine_chunks() if isinstance(grouped["t_list"], pa.ChunkedArray) else grouped["t_list"]
    starts = pc.cast(borns.offsets.slice(0, len(borns)), pa.int64())
    decision_ms = pc.take(borns.values, pc.add(starts, pick))
    decisions = pa.table({"half_phys": grouped["half_phys"], "decision": decided, "decision_ms": decision_ms})

    copies = (
        table.filter(pc.equal(kind, "DELIVERY"))
        .select(
            [
                "half_phys",
                "commit_log_offset",
                "offset_msg_id",
                "store_timestamp",
                "producer_group",
                "topic",
                "uniq_key",
            ]
        )
        .sort_by([("half_phys", "ascending"), ("commit_log_offset", "ascending")])
    )
    delivered = copies.group_by("half_phys", use_threads=False).aggregate(
        [
            ("commit_log_offset", "count", every),
            ("offset_msg_id", "first", first),
            ("store_timestamp", "min"),
            ("producer_group", "first", first),
            ("topic", "first", first),
            ("uniq_key", "first", first),
        ]
    )
    delivered = pa.table(
        {
            "half_phys": delivered["half_phys"],
            "deliveries": pc.cast(delivered["commit_log_offset_count"], pa.int32()),
            "delivered_msg_id": delivered["offset_msg_id_first"],
            "delivered_ms": delivered["store_timestamp_min"],
            "d_group": delivered["producer_group_first"],
            "d_topic": delivered["topic_first"],
            "d_uniq": delivered["uniq_key_first"],
        }
    )

    halves = table.filter(pc.equal(kind, "HALF"))
    halves = pa.table(
        {
            "half_phys": halves["half_phys"],
            "producer_group": halves["producer_group"],
            "real_topic": halves["topic"],
            "transaction_id": halves["transaction_id"],
            "uniq_key": halves["uniq_key"],
            "prepared_ms": halves["store_timestamp"],
            "tx_seq": halves["tx_seq"],
        }
    )
    rows = halves.join(decisions, "half_phys", join_type="left outer", use_threads=False).join(
        delivered.drop_columns(["d_group", "d_topic", "d_uniq"]), "half_phys", join_type="left outer", use_threads=False
    )
    n = rows.num_rows
    out = pa.table(
        {
            "orphan": pa.repeat(pa.scalar(False), n),
            **{c: rows[c] for c in schema.names[1:] if c != "deliveries"},
            "deliveries": pc.coalesce(rows["deliveries"], pa.scalar(0, pa.int32())),
        }
    ).select(schema.names)
    yield from out.cast(schema).to_batches()

    orphans = delivered.join(halves.select(["half_phys"]), "half_phys", join_type="left anti", use_threads=False)
    m = orphans.num_rows
    if m:
        nothing = {name: pa.nulls(m, schema.field(name).type) for name in schema.names}
        lone = pa.table(
            {
                **nothing,
                "orphan": pa.repeat(pa.scalar(True), m),
                "half_phys": orphans["half_phys"],
                "producer_group": orphans["d_group"],
                "real_topic": orphans["d_topic"],
                "uniq_key": orphans["d_uniq"],
                "deliveries": orphans["deliveries"],
                "delivered_msg_id": orphans["delivered_msg_id"],
                "delivered_ms": orphans["delivered_ms"],
            }
        ).select(schema.names)
        yield from lone.cast(schema).to_batches()


def transaction_events(spark: SparkSession, store: str) -> DataFrame:
    """The store's transaction-related records (format ``txmq-store``, view ``transactions``)."""
    return spark.read.format("txmq-store").option("view", "transactions").load(store)


def journal_checks(store: str) -> pa.Table:
    """Checks sent per half message, as a table (half_phys int64, journal_checks int32): ``C`` lines of
    ``config/transactionJournal.log`` (an unterminated last line is a torn append and is ignored), else the older
    ``transactionChecks.json``. Read where this runs (the driver)."""
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
    return pa.table(
        {
            "half_phys": pa.array(list(attempts), pa.int64()),
            "journal_checks": pa.array([len(c) for c in attempts.values()], pa.int32()),
        }
    )


def discard_checks(copies: DataFrame) -> pa.Table:
    """The discard copies' check counts (TRANSACTION_CHECK_TIMES), the largest per (uniq_key, producer_group), as a
    table collected to the driver: a DISCARDED transaction the journal says nothing of takes its count from there."""
    col = F.col
    found = (
        copies.filter(col("uniq_key").isNotNull() & col("producer_group").isNotNull())
        .groupBy("uniq_key", "producer_group")
        .agg(F.max("checks").alias("discard_checks"))
        .collect()
    )
    return pa.table(
        {
            "uniq_key": pa.array([r["uniq_key"] for r in found], pa.string()),
            "producer_group": pa.array([r["producer_group"] for r in found], pa.string()),
            "discard_checks": pa.array([r["discard_checks"] for r in found], pa.int32()),
        }
    )


# A half message's audit row before the grouping of transactions of several messages: times in epoch ms.
PER_HALF_SCHEMA = (
    "producer_group string, real_topic string, transaction_id string, uniq_key string, half_commit_log_offset bigint,"
    " prepared_ms bigint, resolved_ms bigint, resolution string, checks_sent int, time_to_resolution_ms bigint,"
    " delivered_msg_id string, deliveries int, tx_seq int"
)
PER_HALF_ARROW = pa.schema(
    [pa.field(n, _ARROW_TYPES[t]) for n, t in (f.strip().split(" ") for f in PER_HALF_SCHEMA.split(","))]
)


def classify(rows: pa.Table, journal: pa.Table, discards: pa.Table) -> pa.Table:
    """The audit's rules (module docstring, docs/transactions.md §4.3) for the pass's rows of half messages (rows
    of PASS_ARROW with ``orphan`` false), in PER_HALF_ARROW: the resolution from the decision and the copies, when
    it was resolved, and the checks sent (the journal's count, else for a DISCARDED one its discard copy's, else 0
    for one PENDING or DISCARDED)."""
    t = rows.join(journal, "half_phys", join_type="left outer", use_threads=False)
    t = t.join(discards, ["uniq_key", "producer_group"], join_type="left outer", use_threads=False)
    deliveries = pc.coalesce(t["deliveries"], pa.scalar(0, pa.int32()))
    delivered = pc.greater(deliveries, 0)
    decision = t["decision"]

    def said(text: str) -> pa.Array:
        return pc.fill_null(pc.equal(decision, text), False)

    unknown = said("UNKNOWN")
    cases = [
        (said("COMMIT"), "COMMIT"),
        (said("ROLLBACK"), "ROLLBACK"),
        (pc.and_(unknown, delivered), "COMMIT"),  # a RocketMQ marker, copy stored
        (unknown, "ROLLBACK"),
        (said("DISCARD"), "DISCARDED"),
        (delivered, "COMMIT"),  # copy stored, marker lost to a crash
    ]
    resolution = pc.case_when(
        pc.make_struct(*[c for c, _ in cases], field_names=[str(i) for i in range(len(cases))]),
        *[pa.scalar(v) for _, v in cases],
        pa.scalar("PENDING"),
    )
    none = pa.scalar(None, pa.int64())
    resolved_ms = pc.if_else(pc.is_valid(decision), t["decision_ms"], pc.if_else(delivered, t["delivered_ms"], none))
    discarded = pc.equal(resolution, "DISCARDED")
    unresolved = pc.is_in(resolution, value_set=pa.array(["PENDING", "DISCARDED"]))
    nothing = pa.scalar(None, pa.int32())
    checks = pc.coalesce(
        t["journal_checks"],
        pc.if_else(discarded, t["discard_checks"], nothing),
        pc.if_else(unresolved, pa.scalar(0, pa.int32()), nothing),
    )
    return pa.table(
        {
            "producer_group": t["producer_group"],
            "real_topic": t["real_topic"],
            "transaction_id": t["transaction_id"],
            "uniq_key": t["uniq_key"],
            "half_commit_log_offset": t["half_phys"],
            "prepared_ms": t["prepared_ms"],
            "resolved_ms": resolved_ms,
            "resolution": resolution,
            "checks_sent": checks,
            "time_to_resolution_ms": pc.subtract(resolved_ms, t["prepared_ms"]),
            "delivered_msg_id": t["delivered_msg_id"],
            "deliveries": deliveries,
            "tx_seq": t["tx_seq"],
        },
        schema=PER_HALF_ARROW,
    )


# What run_audit's pass by range hands Spark (txmq.spark.audit_ranges.audit_pass): rows of PER_HALF_SCHEMA of
# transactions of several messages (to be grouped) and of the oldest in doubt, counts per group, topic and resolution,
# and per anomaly, and the range's times to resolution (an Arrow IPC stream in ``times``; the roles of
# txmq.spark.audit_ranges).
REST_ARROW = pa.schema([*PER_HALF_ARROW, pa.field("role", pa.string()), pa.field("count", pa.int64()),
                        pa.field("anomaly", pa.string()), pa.field("times", pa.binary())])  # fmt: skip

AUDIT_ARROW = pa.schema(
    [
        *(PER_HALF_ARROW.field(c) for c in ("producer_group", "real_topic", "transaction_id", "uniq_key")),
        pa.field("half_commit_log_offset", pa.int64()),
        pa.field("prepared_at", pa.timestamp("us", tz="UTC")),
        pa.field("resolved_at", pa.timestamp("us", tz="UTC")),
        *(PER_HALF_ARROW.field(c) for c in ("resolution", "checks_sent", "time_to_resolution_ms", "delivered_msg_id")),
        *(pa.field(c, pa.int32()) for c in ("deliveries", "messages", "messages_delivered", "max_deliveries")),
    ]
)


_DDL = {pa.string(): "string", pa.int64(): "bigint", pa.int32(): "int", pa.timestamp("us", tz="UTC"): "timestamp"}
AUDIT_SCHEMA = ", ".join(f"{f.name} {_DDL[f.type]}" for f in AUDIT_ARROW)  # audit.parquet's, read without a job


def single_rows(per_half: pa.Table) -> pa.Table:
    """Rows of PER_HALF_ARROW of transactions of one message (``tx_seq`` null) as audit.parquet rows (AUDIT_ARROW):
    what :func:`transaction_audit` gives for them."""
    n = per_half.num_rows
    deliveries = per_half["deliveries"]

    def at(name: str) -> pa.Array:
        return pc.cast(pc.multiply(per_half[name], 1000), pa.timestamp("us", tz="UTC"))

    return pa.table(
        {
            **{c: per_half[c] for c in AUDIT_COLUMNS[:5]},
            "prepared_at": at("prepared_ms"),
            "resolved_at": at("resolved_ms"),
            **{c: per_half[c] for c in AUDIT_COLUMNS[7:12]},
            "messages": pa.repeat(pa.scalar(1, pa.int32()), n),
            "messages_delivered": pc.cast(pc.greater(deliveries, 0), pa.int32()),
            "max_deliveries": deliveries,
        },
        schema=AUDIT_ARROW,
    )


PASS_PARTITION_BYTES = 128 << 20  # the per-transaction pass: a partition per this much commit log


def pass_partitions(store: str) -> int:
    """How many partitions the per-transaction pass runs in: one per PASS_PARTITION_BYTES of commit log (at least
    2), so that each Python task holds a few hundred thousand events whatever the store's size."""
    try:
        folder = commitlog_dir(store)
        size = sum(e.stat().st_size for e in os.scandir(folder) if e.is_file())
    except (OSError, TxmqSparkError):
        size = 0
    return max(2, -(-size // PASS_PARTITION_BYTES))


@dataclass
class TransactionPass:
    """The per-transaction pass over a store's events (:func:`per_transaction` after one shuffle by half_phys), and
    whether any transaction holds several messages (then the audit groups those rows once more)."""

    rows: DataFrame  # PASS_SCHEMA
    several: bool


def transaction_pass(spark: SparkSession, store: str, events: DataFrame) -> TransactionPass:
    """Plan the pass; runs one small job over ``events`` (whether op markers written by RocketMQ, which name no half
    commit-log offset, or transactions of several messages are present)."""
    col = F.col
    is_op = col("kind").isin("OP", "RESUME")
    facts = events.select(
        F.max((is_op & col("half_phys").isNull()).cast("int")).alias("anonymous"),
        F.max(((col("kind") == "HALF") & col("tx_seq").isNotNull()).cast("int")).alias("several"),
    ).first()
    anonymous = bool(facts is not None and facts["anonymous"])
    several = bool(facts is not None and facts["several"])
    keyed = events.filter(col("half_phys").isNotNull()).select(*PASS_INPUT)
    if anonymous:
        # RocketMQ's markers are matched to their half message by its queue offset: a join over every half message,
        # made only when the store has such markers.
        halves = events.filter(col("kind") == "HALF").select(
            col("half_queue_offset").alias("q"), col("half_phys").alias("hp")
        )
        found = (
            events.filter(is_op & col("half_phys").isNull())
            .join(halves, col("half_queue_offset") == col("q"))
            .withColumn("half_phys", col("hp"))
            .select(*PASS_INPUT)
        )
        keyed = keyed.unionByName(found)
    rows = _slim(keyed).repartition(pass_partitions(store), "half_phys").mapInArrow(per_transaction, PASS_SCHEMA)
    return TransactionPass(rows, several)


def _slim(keyed: DataFrame) -> DataFrame:
    """The pass's input with only what it reads of each kind of record (the rest null), which shuffles a third less:
    the born time of op records, the store time, transaction id and place of half messages, the offsetMsgId and
    store time of copies (with their group, topic and key, named when a copy has no half message)."""
    col = F.col
    kind = col("kind")
    op = kind.isin("OP", "RESUME")
    return keyed.select(
        "kind",
        "commit_log_offset",
        "half_phys",
        "producer_group",
        "topic",
        F.when(kind == "HALF", col("transaction_id")).alias("transaction_id"),
        "uniq_key",
        F.when(kind == "DELIVERY", col("offset_msg_id")).alias("offset_msg_id"),
        "decision",
        F.when(op, col("born_timestamp")).alias("born_timestamp"),
        F.when(~op, col("store_timestamp")).alias("store_timestamp"),
        F.when(kind == "HALF", col("tx_seq")).alias("tx_seq"),
    )


def transaction_audit(
    spark: SparkSession, store: str, events: DataFrame | None = None, prepared: TransactionPass | None = None
) -> DataFrame:
    """One row per transaction in ``store`` (see AUDIT_COLUMNS): a half message, or the messages of a transaction
    of several together; lazily evaluated but for two small jobs (see :func:`transaction_pass`; the discard copies'
    check counts, collected for :func:`classify`). :func:`run_audit` gives the same rows by commit-log range.

    ``events`` defaults to :func:`transaction_events`, which several steps of the plan read; pass a cached or
    materialised copy to scan the store once. ``prepared`` is the pass over them when the caller reuses it."""
    ev = events if events is not None else transaction_events(spark, store)
    done = prepared if prepared is not None else transaction_pass(spark, store, ev)
    journal, discards = journal_checks(store), discard_checks(ev.filter(F.col("kind") == "DISCARD_COPY"))

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        for batch in batches:
            yield from classify(pa.Table.from_batches([batch]), journal, discards).to_batches()

    per_half = with_times(done.rows.filter(~F.col("orphan")).mapInArrow(run, PER_HALF_SCHEMA))
    return _one_row_per_transaction(per_half, several=done.several)


_PER_HALF = AUDIT_COLUMNS[: AUDIT_COLUMNS.index("messages")]


def with_times(per_half: DataFrame) -> DataFrame:
    """Rows of PER_HALF_SCHEMA with their times as timestamps: the per-half audit rows."""
    col = F.col
    return per_half.select(
        *AUDIT_COLUMNS[:5],
        F.timestamp_millis("prepared_ms").alias("prepared_at"),
        F.timestamp_millis("resolved_ms").alias("resolved_at"),
        *AUDIT_COLUMNS[7:12],
        col("tx_seq"),
    )


def _one_row_per_transaction(per_half: DataFrame, *, several: bool) -> DataFrame:
    """A transaction of one message is its half message's row. The messages of a transaction of several (same
    producer group and TXMQ_TX_ID) become one row: the first message's, with the count of messages, of those
    delivered, and every delivery. ``several``: whether the store has any (else the grouping is left out)."""
    col = F.col
    delivered = (col("deliveries") > 0).cast("int")
    single = (
        per_half.filter(col("tx_seq").isNull())
        .withColumn("messages", F.lit(1))
        .withColumn("messages_delivered", delivered)
        .withColumn("max_deliveries", col("deliveries"))
        .select(*AUDIT_COLUMNS)
    )
    if not several:
        return single
    grouped = (
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
    return single.unionByName(grouped)


# ---------------------------------------------------------------------------------------------------------------
# Summaries


def resolution_counts(audit: DataFrame, counted: DataFrame | None = None) -> list[dict[str, Any]]:
    """Transactions per producer group, topic and resolution, one job: a row per (group, topic) in that order (nulls
    first), with a count per resolution (0 when none), as ``summary.json``'s ``by_group_topic``. ``counted``: rows
    (producer_group, real_topic, resolution, count) of transactions counted elsewhere, added."""
    keys = ("producer_group", "real_topic", "resolution")
    grouped = audit.groupBy(*keys).count()
    if counted is not None:
        grouped = grouped.unionByName(counted).groupBy(*keys).agg(F.sum("count").alias("count"))
    return by_group_topic(
        (r["producer_group"], r["real_topic"], r["resolution"], r["count"]) for r in grouped.collect()
    )


def by_group_topic(counts: Iterable[tuple[Any, Any, str, int]]) -> list[dict[str, Any]]:
    """(producer group, topic, resolution, count) summed as :func:`resolution_counts` gives them: a row per (group,
    topic) in that order (nulls first), with a count per resolution."""
    table: dict[tuple[Any, Any], dict[str, Any]] = {}
    for group, topic, resolution, count in counts:
        key = (group, topic)
        row = table.setdefault(key, {"producer_group": group, "real_topic": topic, **dict.fromkeys(RESOLUTIONS, 0)})
        row[resolution] += int(count)

    def order(key: tuple[Any, Any]) -> tuple[bool, str, bool, str]:
        return (key[0] is not None, key[0] or "", key[1] is not None, key[1] or "")

    return [table[k] for k in sorted(table, key=order)]


def latency_percentiles(audit: DataFrame) -> DataFrame:
    """Time from prepare to decision (ms) per resolution: count, p50, p90, p99, max (Spark's ``percentile_approx``;
    :func:`latency_summary` gives the exact values from counts)."""
    lat = F.col("time_to_resolution_ms")
    q = F.col("q")
    return (
        audit.filter(F.col("resolution") != "PENDING")
        .groupBy("resolution")
        .agg(
            F.count(F.lit(1)).alias("count"),
            F.percentile_approx(lat, [0.5, 0.9, 0.99]).alias("q"),  # one sketch, read three times
            F.max(lat).alias("max_ms"),
        )
        .select("resolution", "count", q[0].alias("p50_ms"), q[1].alias("p90_ms"), q[2].alias("p99_ms"), "max_ms")
        .orderBy("resolution")
    )


LATENCY_QUANTILES = (("p50_ms", 0.5), ("p90_ms", 0.9), ("p99_ms", 0.99))


def latency_summary(times: Iterable[tuple[str, int | None, int]]) -> list[dict[str, Any]]:
    """:func:`latency_percentiles`' rows from (resolution, time_to_resolution_ms, how many transactions took it),
    the percentiles exact: the smallest time such that at least that fraction of the resolution's times are at or
    below it (the nearest rank, ``ceil(q * n)``, which ``percentile_approx`` approximates). Null times are counted,
    not ranked. A resolution without transactions has no row."""
    counted: dict[str, int] = {}
    by_time: dict[str, dict[int, int]] = {}
    for resolution, ms, count in times:
        counted[resolution] = counted.get(resolution, 0) + count
        if ms is not None:
            seen = by_time.setdefault(resolution, {})
            seen[ms] = seen.get(ms, 0) + count
    rows = []
    for resolution in sorted(r for r, n in counted.items() if n):
        ordered = sorted(by_time.get(resolution, {}).items())
        ranked = sum(n for _ms, n in ordered)
        row: dict[str, Any] = {"resolution": resolution, "count": counted[resolution]}
        for name, q in LATENCY_QUANTILES:
            rank, below, found = max(1, math.ceil(q * ranked)), 0, None
            for ms, n in ordered:
                below += n
                if below >= rank:
                    found = ms
                    break
            row[name] = found
        row["max_ms"] = ordered[-1][0] if ordered else None
        rows.append(row)
    return rows


def oldest_in_doubt(audit: DataFrame, limit: int = 20, now_ms: int | None = None) -> DataFrame:
    now = int(time.time() * 1000) if now_ms is None else now_ms
    return (
        audit.filter(F.col("resolution") == "PENDING")
        .withColumn("age_ms", F.lit(now) - F.unix_millis("prepared_at"))
        .orderBy("prepared_at", "half_commit_log_offset")  # the log order breaks ties: the same list every run
        .limit(limit)
    )


def anomalies(audit: DataFrame, events: DataFrame | TransactionPass) -> DataFrame:
    """COMMIT_WITHOUT_DELIVERY, PARTIAL_DELIVERY (some messages of a transaction of several delivered, not all),
    DOUBLE_DELIVERY and DELIVERY_WITHOUT_COMMIT (including deliveries whose half message
    is not in the store at all): (anomaly, producer_group, real_topic, uniq_key, half_commit_log_offset, resolution,
    deliveries, delivered_msg_id). ``events``: the store's events, or the audit's :class:`TransactionPass` over them
    (whose orphan rows are those copies without a half message)."""
    flagged = _flagged(audit)
    if isinstance(events, TransactionPass):
        rows = events.rows
    else:  # only the half messages and their copies matter here
        keyed = events.filter(F.col("kind").isin("HALF", "DELIVERY")).select(*PASS_INPUT)
        rows = _slim(keyed).repartition("half_phys").mapInArrow(per_transaction, PASS_SCHEMA)
    return flagged.unionByName(_orphans(rows.withColumnRenamed("half_phys", "half_commit_log_offset")))


def _flagged(audit: DataFrame) -> DataFrame:
    """The audit rows that are anomalies, as rows of :func:`anomalies`."""
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
    return audit.select(
        F.when((col("resolution") == "COMMIT") & (col("deliveries") == 0), F.lit("COMMIT_WITHOUT_DELIVERY"))
        .when(
            (col("messages_delivered") > 0) & (col("messages_delivered") < col("messages")), F.lit("PARTIAL_DELIVERY")
        )
        .when(col("max_deliveries") > 1, F.lit("DOUBLE_DELIVERY"))
        .when((col("resolution") != "COMMIT") & (col("deliveries") > 0), F.lit("DELIVERY_WITHOUT_COMMIT"))
        .alias("anomaly"),
        *cols,
    ).filter(col("anomaly").isNotNull())


def _orphans(rows: DataFrame) -> DataFrame:
    """DELIVERY_WITHOUT_COMMIT rows of the copies whose half message is not in the store (``orphan`` true)."""
    col = F.col
    return rows.filter(col("orphan")).select(
        F.lit("DELIVERY_WITHOUT_COMMIT").alias("anomaly"),
        "producer_group",
        "real_topic",
        "uniq_key",
        "half_commit_log_offset",
        F.lit(None).cast("string").alias("resolution"),
        "deliveries",
        "delivered_msg_id",
    )


def _anonymous_markers(
    spark: SparkSession, ranges: list[audit_ranges.Range], markers: DataFrame, events: DataFrame
) -> DataFrame:
    """RocketMQ's op markers (no half commit-log offset) given the half message of the same queue offset and the
    range that half message lies in (``target``, NO_RANGE when none), as rows of the scan's side output."""
    col = F.col
    halves = events.filter(col("kind") == "HALF").select(
        col("half_queue_offset").alias("q"), col("half_phys").alias("hp")
    )
    spans = spark.createDataFrame([(i, *r.span) for i, r in enumerate(ranges)], "i int, lo bigint, hi bigint")
    found = markers.join(halves, col("half_queue_offset") == col("q")).withColumn("half_phys", col("hp"))
    placed = found.join(F.broadcast(spans), (col("half_phys") >= col("lo")) & (col("half_phys") < col("hi")), "left")
    return placed.withColumn("target", F.coalesce(col("i"), F.lit(audit_ranges.NO_RANGE))).select(*markers.columns)


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
    split_bytes: int = DEFAULT_SPLIT_BYTES,
) -> AuditResult:
    """Write ``events.parquet`` (the store's transaction records), ``audit.parquet``, ``anomalies.parquet``,
    ``summary.json`` and, optionally, ``report.html`` with its charts. ``phase_clock`` measures the phases (wall
    time by default; the benchmark passes the CPU time of the processes doing the work). ``split_bytes``: the size
    of the commit-log ranges the store is read in (as ``txmq-store``'s option ``splitBytes``)."""
    from txmq.spark.errors import clear_errors

    started = time.perf_counter()
    phase_start = phase_clock()
    phases: dict[str, float] = {}

    def lap(name: str) -> None:
        phases[name] = phase_clock() - phase_start - sum(phases.values())

    os.makedirs(out_dir, exist_ok=True)
    with clear_errors():
        # The store is scanned once, a task per commit-log range: each writes its part of events.parquet itself and
        # hands back only the events that belong to another range's transactions (txmq.spark.audit_ranges).
        events_path = os.path.join(out_dir, "events.parquet")
        written = audit_ranges.PassOutputs(
            os.path.join(out_dir, "audit.parquet"), os.path.join(out_dir, "anomalies.parquet")
        )
        outputs = {
            events_path: audit_ranges.EVENTS_SCHEMA,
            written.audit: AUDIT_ARROW,
            written.anomalies: audit_ranges.ANOMALY_ARROW,
        }
        ranges = audit_ranges.plan(spark, store, outputs, split_bytes)
        side = _to_arrow(audit_ranges.scan(spark, ranges, events_path), audit_ranges.SIDE_ARROW)
        lap("scan")
        kind = side["kind"]
        several = bool(pc.any(side["several"]).as_py())
        routed = side.filter(
            pc.fill_null(pc.and_(pc.is_valid(side["target"]), pc.is_in(kind, value_set=_ROUTED)), False)
        )
        anonymous = side.filter(pc.and_(pc.equal(kind, "OP"), pc.is_null(side["half_phys"])))
        if anonymous.num_rows:
            markers = spark.createDataFrame(
                [tuple(r.values()) for r in anonymous.to_pylist()], audit_ranges.SIDE_SCHEMA
            )
            placed = _anonymous_markers(spark, ranges, markers, spark.read.parquet(events_path))
            routed = pa.concat_tables([routed, _to_arrow(placed, audit_ranges.SIDE_ARROW)])
        # Each range's transactions in one pass (its own events from its part file, and those of its half messages
        # that other ranges found), classified, written to audit.parquet and anomalies.parquet by the pass's tasks;
        # what comes back is what the summaries need of them, and the transactions of several messages (grouped
        # here).
        journal = journal_checks(store)
        discards = discard_table(side.filter(pc.equal(kind, "DISCARD_COPY")))
        rest = audit_ranges.audit_pass(spark, ranges, events_path, written, routed, journal, discards)
        role = F.col("role")
        if several:
            rest = rest.persist(StorageLevel.MEMORY_AND_DISK)
            kept = _to_arrow(rest.filter(role != audit_ranges.SEVERAL), REST_ARROW)
        else:
            kept = _to_arrow(rest, REST_ARROW)
        try:
            found = _summary_rows(kept)
            if several:
                grouped = _one_row_per_transaction(with_times(rest.filter(role == audit_ranges.SEVERAL)), several=True)
                grouped.write.mode("append").parquet(written.audit)
                _flagged(grouped).write.mode("append").parquet(written.anomalies)
                found.add_several(spark.read.parquet(written.anomalies), grouped)
            lap("audit")
            # The summaries from what the pass handed back.
            summary = {
                "store": os.path.abspath(store),
                "transactions": sum(found.by_resolution().values()),
                "by_resolution": found.by_resolution(),
                "anomalies": found.anomalies,
                "by_group_topic": found.by_group_topic(),
                "latency_ms": latency_summary(found.times),
                "oldest_in_doubt": found.oldest_in_doubt(),
            }
        finally:
            if several:
                rest.unpersist()
        with open(os.path.join(out_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2, default=str)
        lap("summaries")
        html = None
        if report:
            from txmq.spark.report import latency_buckets, write_report

            audit = spark.read.schema(AUDIT_SCHEMA).parquet(written.audit)
            anomaly_rows = spark.read.parquet(written.anomalies) if sum(summary["anomalies"].values()) else None
            html = write_report(spark, audit, anomaly_rows, summary, out_dir, latency_buckets(found.times))
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


_ROUTED = pa.array(["OP", "RESUME", "DELIVERY"])


def _to_arrow(df: DataFrame, schema: pa.Schema) -> pa.Table:
    """``df`` collected to the driver as an Arrow table of ``schema`` (one job)."""
    return df.toArrow().select(schema.names).cast(schema)


def discard_table(copies: pa.Table) -> pa.Table:
    """:func:`discard_checks` of discard copies (rows of the transactions view) in pyarrow."""
    keyed = copies.filter(pc.and_(pc.is_valid(copies["uniq_key"]), pc.is_valid(copies["producer_group"])))
    found = keyed.group_by(["uniq_key", "producer_group"], use_threads=False).aggregate([("checks", "max")])
    return pa.table(
        {
            "uniq_key": found["uniq_key"],
            "producer_group": found["producer_group"],
            "discard_checks": pc.cast(found["checks_max"], pa.int32()),
        }
    )


@dataclass
class _SummaryRows:
    """What run_audit's summaries are made of: counts (group, topic, resolution, count), anomaly counts, the
    oldest transactions in doubt as ``summary.json`` lists them, each with its (prepare time, commit-log offset),
    and how many decided transactions took each time (resolution, time_to_resolution_ms, count)."""

    counts: list[tuple[Any, Any, str, int]]
    anomalies: dict[str, int]
    oldest: list[tuple[tuple[int, int], dict[str, Any]]]
    times: list[tuple[str, int | None, int]]

    def by_group_topic(self) -> list[dict[str, Any]]:
        return by_group_topic(self.counts)

    def by_resolution(self) -> dict[str, int]:
        totals = dict.fromkeys(RESOLUTIONS, 0)
        for _group, _topic, resolution, count in self.counts:
            totals[resolution] += count
        return totals

    def oldest_in_doubt(self, limit: int = audit_ranges.OLDEST_KEPT) -> list[dict[str, Any]]:
        return [entry for _key, entry in sorted(self.oldest, key=lambda e: e[0])[:limit]]

    def add_several(self, found: DataFrame, grouped: DataFrame) -> None:
        """Add the transactions of several messages (``grouped``, audit rows) and the anomalies among them."""
        keys = ("producer_group", "real_topic", "resolution")
        self.counts += [(r[0], r[1], r[2], r[3]) for r in grouped.groupBy(*keys).count().collect()]
        decided = grouped.filter(F.col("resolution") != "PENDING").groupBy("resolution", "time_to_resolution_ms")
        self.times += [(r[0], r[1], r[2]) for r in decided.count().collect()]
        self.anomalies = {r["anomaly"]: int(r["count"]) for r in found.groupBy("anomaly").count().collect()}
        now = int(time.time() * 1000)
        pending = (
            oldest_in_doubt(grouped, now_ms=now).drop("resolved_at").withColumn("ms", F.unix_millis("prepared_at"))
        )
        for r in pending.collect():
            entry = r.asDict()
            ms = entry.pop("ms")
            self.oldest.append(((ms, entry["half_commit_log_offset"]), {**entry, "prepared_at": str(r["prepared_at"])}))


def _summary_rows(rest: pa.Table) -> _SummaryRows:
    """The pass's rows other than SEVERAL (REST_ARROW) as :class:`_SummaryRows`."""
    from pyspark.sql.types import TimestampType

    role = rest["role"]
    counted = rest.filter(pc.equal(role, audit_ranges.COUNT)).to_pylist()
    kinds: dict[str, int] = {}
    for r in rest.filter(pc.equal(role, audit_ranges.ANOMALY)).to_pylist():
        kinds[r["anomaly"]] = kinds.get(r["anomaly"], 0) + r["count"]
    now = int(time.time() * 1000)
    timestamp = TimestampType()
    oldest = []
    for r in rest.filter(pc.equal(role, audit_ranges.OLDEST)).to_pylist():
        entry = {c: r[c] for c in AUDIT_COLUMNS[:5]}
        entry["prepared_at"] = str(timestamp.fromInternal(r["prepared_ms"] * 1000))  # as collect() gives it
        entry |= {c: r[c] for c in AUDIT_COLUMNS[7:12]}
        deliveries = r["deliveries"]
        entry |= {"messages": 1, "messages_delivered": int(deliveries > 0), "max_deliveries": deliveries}
        entry["age_ms"] = now - r["prepared_ms"]
        oldest.append(((r["prepared_ms"], r["half_commit_log_offset"]), entry))
    times: list[tuple[str, int | None, int]] = []
    for blob in rest.filter(pc.equal(role, audit_ranges.LATENCY))["times"].to_pylist():
        timed = audit_ranges.read_times(blob)
        columns = (timed[c].to_pylist() for c in ("resolution", "time_to_resolution_ms", "count"))
        times += zip(*columns, strict=True)
    return _SummaryRows(
        [(r["producer_group"], r["real_topic"], r["resolution"], r["count"]) for r in counted], kinds, oldest, times
    )
