"""The audit's scan and per-transaction pass by commit-log range: how :func:`txmq.spark.audit.run_audit` reads a
store without handing every transaction record to Spark.

A half message's op records and copies are written after it, almost always a few records later, so nearly every
event of a transaction lies in the same commit-log range (a ``txmq-store`` partition, 64 MiB) as its half message.

1. :func:`plan` (one Python task): the ranges of the store's segments (:func:`list_segments`), and empty
   ``events.parquet`` and ``audit.parquet`` folders.
2. :func:`scan` (a task per range): the range's ``transactions`` view (:func:`transaction_batches`) is written by
   the task itself, with pyarrow, as ``events.parquet/part-<range>.parquet``; what goes to Spark is only what
   other ranges need: the op records and copies whose half message lies in another range ("foreign", with the
   range it lies in), RocketMQ's op markers that name no half message, the discard copies (for their check
   counts), and one row per range saying it was read and whether it holds transactions of several messages.
3. :func:`audit_pass` (a task per few ranges, after a shuffle of that small output by range): each range's own
   events read back from its part file (the columns the pass reads), with the foreign events that belong to its
   half messages, go through :func:`txmq.spark.audit.per_transaction` (:func:`local_pass_rows`) and
   :func:`txmq.spark.audit.classify`; the transactions of one message are written as
   ``audit.parquet/part-<range>.parquet``, and what the summaries need of them goes to Spark (the roles below).
   Events whose half message lies in no range (retention removed it) meet in a group of their own and come out as
   orphan copies.

Only a few rows per range cross into the JVM. The part files are named by range, written to a hidden name and
renamed, so a retried task replaces its own file.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from txmq.spark.store_source import (
    DEFAULT_SPLIT_BYTES,
    TX_COLUMNS,
    Segment,
    arrow_schema,
    list_segments,
    transaction_batches,
)

EVENTS_SCHEMA = arrow_schema(TX_COLUMNS)
# The side output of the scan: rows of the transactions view, the range ("target") whose pass needs each, and on a
# range's own row (kind RANGE) whether it holds a half message of a transaction of several.
SIDE_COLUMNS = (*TX_COLUMNS, ("target", "int"), ("several", "boolean"))
SIDE_SCHEMA = ", ".join(f"{n} {t}" for n, t in SIDE_COLUMNS)
SIDE_ARROW = pa.schema([*EVENTS_SCHEMA, pa.field("target", pa.int32()), pa.field("several", pa.bool_())])
RANGES_SCHEMA = "path string, start bigint, lo bigint, hi bigint, first bigint"
NO_RANGE = -1  # the target of events whose half message lies in no range of the store
SCAN_BATCH_ROWS = 1 << 18


@dataclass(frozen=True)
class Range:
    """A ``txmq-store`` partition (:class:`Segment`) and the commit-log offsets it spans."""

    path: str
    start: int
    lo: int
    hi: int
    first: int

    @property
    def span(self) -> tuple[int, int]:
        return self.start + self.lo, self.start + self.hi

    def segment(self) -> Segment:
        return Segment(self.path, self.start, self.lo, self.hi, self.first)


def part_path(folder: str, index: int) -> str:
    return os.path.join(folder, f"part-{index:05d}.parquet")


def plan_ranges(store: str, outputs: dict[str, pa.Schema], split_bytes: int = DEFAULT_SPLIT_BYTES) -> list[Range]:
    """The store's ranges; each folder of ``outputs`` emptied (the tasks fill them, a part file per range), or
    given one empty part file of its schema when the store holds no data (so that it reads as an empty table)."""
    ranges = [Range(s.path, s.start, s.lo, s.hi, s.first) for s in list_segments(store, split_bytes)]
    for folder, schema in outputs.items():
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder, exist_ok=True)
        if not ranges:
            write_part(schema.empty_table(), folder, 0)
    return ranges


def write_part(table: pa.Table, folder: str, index: int) -> None:
    """``table`` as ``folder/part-<index>.parquet``, written under a hidden name (which Spark does not read) and
    renamed: a retried task replaces its own part."""
    final = part_path(folder, index)
    temporary = os.path.join(folder, f".{os.path.basename(final)}.{os.getpid()}.tmp")
    pq.write_table(table, temporary)
    os.replace(temporary, final)


def plan(spark: Any, store: str, outputs: dict[str, pa.Schema], split_bytes: int = DEFAULT_SPLIT_BYTES) -> list[Range]:
    """:func:`plan_ranges`, run by an executor (which sees the store and the output folders as the scan's tasks do;
    through Spark Connect the client may not)."""
    fields = [
        ("path", pa.string()),
        ("start", pa.int64()),
        ("lo", pa.int64()),
        ("hi", pa.int64()),
        ("first", pa.int64()),
    ]

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for _ in batches:
            pass
        ranges = plan_ranges(store, outputs, split_bytes)
        yield pa.RecordBatch.from_pylist([vars(r) for r in ranges], schema=pa.schema(fields))

    rows = spark.range(0, 1, 1, 1).mapInArrow(run, RANGES_SCHEMA).collect()
    return [Range(r["path"], r["start"], r["lo"], r["hi"], r["first"]) for r in rows]


def targets(half_phys: pa.Array, spans: list[tuple[int, int]]) -> pa.Array:
    """The index of the span each half commit-log offset lies in (NO_RANGE: none; null stays null)."""
    out = pc.if_else(pc.is_null(half_phys), pa.scalar(None, pa.int32()), pa.scalar(NO_RANGE, pa.int32()))
    for i, (lo, hi) in enumerate(spans):
        inside = pc.and_(pc.greater_equal(half_phys, lo), pc.less(half_phys, hi))
        out = pc.if_else(pc.fill_null(inside, False), pa.scalar(i, pa.int32()), out)
    return out


def scan_range(ranges: list[Range], index: int, events_path: str, batch_rows: int = SCAN_BATCH_ROWS) -> pa.Table:
    """Step 2 for range ``index``: its part file written, its side output returned (SIDE_ARROW)."""
    table = pa.Table.from_batches(list(transaction_batches(ranges[index].segment(), batch_rows)), EVENTS_SCHEMA)
    write_part(table, events_path, index)
    return side_rows(table, ranges, index)


def side_rows(table: pa.Table, ranges: list[Range], index: int) -> pa.Table:
    """What range ``index``, whose events are ``table`` (EVENTS_SCHEMA), hands Spark (SIDE_ARROW): the op records
    and copies whose half message lies outside it, with the range it lies in; RocketMQ's markers (no half message
    named); the discard copies; and its RANGE row."""
    kind = table["kind"]
    lo, hi = ranges[index].span
    hp = table["half_phys"]
    is_op = pc.is_in(kind, value_set=pa.array(["OP", "RESUME"]))
    follows = pc.or_(is_op, pc.equal(kind, "DELIVERY"))  # the records that name their half message
    outside = pc.invert(pc.fill_null(pc.and_(pc.greater_equal(hp, lo), pc.less(hp, hi)), False))
    anonymous = pc.and_(pc.equal(kind, "OP"), pc.is_null(hp))  # RocketMQ's: matched by queue offset later
    wanted = pc.or_(pc.and_(follows, outside), pc.equal(kind, "DISCARD_COPY"))
    side = table.filter(pc.or_(wanted, anonymous))
    spans = [r.span for r in ranges]
    side = side.append_column("target", targets(side["half_phys"], spans))
    side = side.append_column("several", pa.nulls(side.num_rows, pa.bool_()))
    halves = pc.equal(kind, "HALF")
    several = pc.any(pc.and_(halves, pc.is_valid(table["tx_seq"]))).as_py() or False
    marker = {name: pa.nulls(1, f.type) for name, f in zip(SIDE_ARROW.names, SIDE_ARROW, strict=True)}
    marker |= {
        "kind": pa.array(["RANGE"]),
        "target": pa.array([index], pa.int32()),
        "several": pa.array([several]),
    }
    return pa.concat_tables([side.cast(SIDE_ARROW), pa.table(marker, schema=SIDE_ARROW)])


def scan(spark: Any, ranges: list[Range], events_path: str) -> Any:
    """Step 2 as a DataFrame (SIDE_SCHEMA): a task per range (``spark.range`` of one row per partition)."""
    n = len(ranges)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for index in batch.column(0).to_pylist():
                yield from scan_range(ranges, index, events_path).to_batches()

    return spark.range(0, n, 1, max(n, 1)).mapInArrow(run, SIDE_SCHEMA)


def local_pass_rows(
    ranges: list[Range], events_path: str, side: pa.Table, columns: tuple[str, ...]
) -> Iterator[tuple[int, pa.Table]]:
    """Step 3 for the ranges named in ``side`` (rows of SIDE_ARROW, grouped by ``target``): each range's own events
    from its part file and its share of ``side``, through :func:`per_transaction`, one range at a time: (range, its
    rows of PASS_ARROW)."""
    from txmq.spark.audit import PASS_ARROW, per_transaction

    schema = pa.schema([EVENTS_SCHEMA.field(c) for c in columns])  # Spark may say a column holds no null
    events = side.filter(pc.is_in(side["kind"], value_set=pa.array(["OP", "RESUME", "DELIVERY"])))
    for index in pc.unique(side["target"]).to_pylist():
        mine = events.filter(pc.equal(events["target"], index)).select(list(columns)).cast(schema)
        parts = [mine]
        if index != NO_RANGE:
            own = pq.read_table(part_path(events_path, index), columns=list(columns))
            lo, hi = ranges[index].span
            hp = own["half_phys"]
            parts.insert(0, own.filter(pc.and_(pc.greater_equal(hp, lo), pc.less(hp, hi))))
        table = pa.concat_tables(parts)
        yield index, pa.Table.from_batches(list(per_transaction(iter(table.to_batches()))), PASS_ARROW)


# The roles of the rows the audit pass hands Spark (column ``role`` of txmq.spark.audit.REST_SCHEMA).
SEVERAL = "SEVERAL"  # a half message of a transaction of several messages: grouped in Spark
ORPHAN = "ORPHAN"  # copies whose half message is not in the store
ODD = "ODD"  # a transaction of one message that is an anomaly (anything but one copy of a COMMIT, none otherwise)
OLDEST = "OLDEST"  # one of the range's oldest PENDING transactions of one message (OLDEST_KEPT of them)
COUNT = "COUNT"  # how many transactions of one message the range has per group, topic and resolution
OLDEST_KEPT = 20  # txmq.spark.audit.oldest_in_doubt's default limit


def audit_pass_rows(
    ranges: list[Range],
    events_path: str,
    audit_path: str,
    side: pa.Table,
    journal: pa.Table,
    discards: pa.Table,
) -> Iterator[pa.RecordBatch]:
    """Step 3 with the audit's rules (:func:`txmq.spark.audit.classify`): each range's transactions of one message
    written as ``audit_path/part-<range>.parquet``; yielded (rows of REST_ARROW) what the summaries and the
    anomalies need of them, and the rest (see the roles above)."""
    from txmq.spark.audit import PASS_INPUT, REST_ARROW, classify, single_rows

    for index, rows in local_pass_rows(ranges, events_path, side, PASS_INPUT):
        orphan = rows["orphan"]
        halves = classify(rows.filter(pc.invert(orphan)), journal, discards)
        single = pc.is_null(halves["tx_seq"])
        singles = halves.filter(single)
        if index != NO_RANGE:
            write_part(single_rows(singles), audit_path, index)
        committed = pc.equal(singles["resolution"], "COMMIT")
        normal = pc.equal(singles["deliveries"], pc.if_else(committed, 1, 0))
        pending = singles.filter(pc.equal(singles["resolution"], "PENDING"))
        order = [("prepared_ms", "ascending"), ("half_commit_log_offset", "ascending")]
        counts = singles.group_by(["producer_group", "real_topic", "resolution"], use_threads=False).aggregate(
            [("resolution", "count", pc.CountOptions(mode="all"))]
        )
        lone = rows.filter(orphan)
        parts = [
            _role(halves.filter(pc.invert(single)), SEVERAL),
            _role(singles.filter(pc.invert(normal)), ODD),
            _role(pending.sort_by(order).slice(0, OLDEST_KEPT), OLDEST),
            _role(
                pa.table({c: counts[c] for c in ("producer_group", "real_topic", "resolution")}),
                COUNT,
                count=counts["resolution_count"],
            ),
            _role(
                pa.table(
                    {
                        **{c: lone[c] for c in ("producer_group", "real_topic", "uniq_key", "deliveries")},
                        "half_commit_log_offset": lone["half_phys"],
                        "delivered_msg_id": lone["delivered_msg_id"],
                    }
                ),
                ORPHAN,
            ),
        ]
        yield from pa.concat_tables([p.cast(REST_ARROW) for p in parts]).to_batches()


def _role(rows: pa.Table, role: str, count: pa.Array | None = None) -> pa.Table:
    """``rows`` (some columns of REST_ARROW) as rows of REST_ARROW with ``role`` (and ``count``)."""
    from txmq.spark.audit import REST_ARROW

    n = rows.num_rows
    columns = {f.name: rows[f.name] if f.name in rows.column_names else pa.nulls(n, f.type) for f in REST_ARROW}
    columns["role"] = pa.repeat(pa.scalar(role), n)
    if count is not None:
        columns["count"] = count
    return pa.table(columns, schema=REST_ARROW)


def audit_pass(
    spark: Any,
    ranges: list[Range],
    events_path: str,
    audit_path: str,
    side: Any,
    journal: pa.Table,
    discards: pa.Table,
) -> Any:
    """Step 3 as a DataFrame (txmq.spark.audit.REST_SCHEMA; its tasks write audit.parquet's parts): ``side`` (with
    every range's RANGE row, and the foreign events with their ``target``) shuffled by ``target`` into a partition
    per range (hash partitioning: a partition may get two ranges, another none)."""
    from pyspark.sql import functions as F

    from txmq.spark.audit import REST_SCHEMA

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        got = list(batches)
        if got:
            side = pa.Table.from_batches(got)
            yield from audit_pass_rows(ranges, events_path, audit_path, side, journal, discards)

    routed = side.filter(F.col("target").isNotNull() & (F.col("kind") != "DISCARD_COPY"))
    return routed.repartition(max(len(ranges), 1), "target").mapInArrow(run, REST_SCHEMA)
