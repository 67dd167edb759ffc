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
EVENTS_DICTIONARY = ["kind", "producer_group", "topic", "decision"]  # the columns of few distinct values


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


def write_part(table: pa.Table, folder: str, index: int, dictionary: list[str] | None = None) -> None:
    """``table`` as ``folder/part-<index>.parquet``, written under a hidden name (which Spark does not read) and
    renamed: a retried task replaces its own part. ``dictionary``: the columns to dictionary-encode (those whose
    values repeat; by default all, which costs the time of trying it on columns of unique values and giving up)."""
    final = part_path(folder, index)
    temporary = os.path.join(folder, f".{os.path.basename(final)}.{os.getpid()}.tmp")
    pq.write_table(table, temporary, use_dictionary=True if dictionary is None else dictionary)
    os.replace(temporary, final)


def one_task_threads() -> None:
    """Arrow's thread pools sized to the cores Spark gave this task (``spark.task.cpus``, 1 by default): with a
    pool per core in every Python worker, the tasks running side by side take turns on the same cores, and a read
    or a join spent two to three times the CPU it does in one thread."""
    from pyspark import TaskContext

    context = TaskContext.get()
    cores = max(1, context.cpus()) if context is not None else 1
    pa.set_cpu_count(cores)
    pa.set_io_thread_count(cores)


def plan(spark: Any, store: str, outputs: dict[str, pa.Schema], split_bytes: int = DEFAULT_SPLIT_BYTES) -> list[Range]:
    """:func:`plan_ranges`, run where the scan's tasks run: by the driver itself when the session is local (its
    executor is this machine), else by an executor, which sees the store and the output folders as the scan's tasks
    do (on a cluster, or through Spark Connect, the driver or the client may not)."""
    if runs_here(spark):
        return plan_ranges(store, outputs, split_bytes)
    fields = [
        ("path", pa.string()),
        ("start", pa.int64()),
        ("lo", pa.int64()),
        ("hi", pa.int64()),
        ("first", pa.int64()),
    ]

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        one_task_threads()
        for _ in batches:
            pass
        ranges = plan_ranges(store, outputs, split_bytes)
        yield pa.RecordBatch.from_pylist([vars(r) for r in ranges], schema=pa.schema(fields))

    rows = spark.range(0, 1, 1, 1).mapInArrow(run, RANGES_SCHEMA).collect()
    return [Range(r["path"], r["start"], r["lo"], r["hi"], r["first"]) for r in rows]


def spark_schema(schema: pa.Schema) -> Any:
    """``schema`` as Spark's StructType, made in Python: a DDL string would be parsed by the JVM, which costs a
    third of a second on a session's first query."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)


def runs_here(spark: Any) -> bool:
    """Whether ``spark``'s tasks run on this machine: a classic session (not Spark Connect) of a ``local`` master."""
    context = getattr(spark, "_sc", None)  # a Spark Connect session has none
    return context is not None and str(context.master).startswith("local")


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
    write_part(table, events_path, index, EVENTS_DICTIONARY)
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
        one_task_threads()
        for batch in batches:
            for index in batch.column(0).to_pylist():
                yield from scan_range(ranges, index, events_path).to_batches()

    return spark.range(0, n, 1, max(n, 1)).mapInArrow(run, spark_schema(SIDE_ARROW))


def range_pass(ranges: list[Range], events_path: str, index: int, side: pa.Table, columns: tuple[str, ...]) -> pa.Table:
    """Step 3's events for range ``index`` (NO_RANGE: the events whose half message lies in no range): its own
    events from its part file, with the rows of ``side`` (SIDE_ARROW) routed to it, through :func:`per_transaction`:
    its rows of PASS_ARROW."""
    from txmq.spark.audit import PASS_ARROW, per_transaction

    schema = pa.schema([EVENTS_SCHEMA.field(c) for c in columns])  # Spark may say a column holds no null
    routed = pc.and_(pc.is_in(side["kind"], value_set=_ROUTED_KINDS), pc.equal(side["target"], index))
    parts = [side.filter(pc.fill_null(routed, False)).select(list(columns)).cast(schema)]
    if index != NO_RANGE:
        own = pq.read_table(part_path(events_path, index), columns=list(columns))
        lo, hi = ranges[index].span
        hp = own["half_phys"]
        parts.insert(0, own.filter(pc.and_(pc.greater_equal(hp, lo), pc.less(hp, hi))).cast(schema))
    table = pa.concat_tables(parts)
    return pa.Table.from_batches(list(per_transaction(iter(table.to_batches()))), PASS_ARROW)


_ROUTED_KINDS = pa.array(["OP", "RESUME", "DELIVERY"])


def local_pass_rows(
    ranges: list[Range], events_path: str, side: pa.Table, columns: tuple[str, ...]
) -> Iterator[tuple[int, pa.Table]]:
    """:func:`range_pass` for each range named in ``side`` (rows of SIDE_ARROW): (range, its rows of PASS_ARROW)."""
    for index in pc.unique(side["target"]).drop_null().to_pylist():
        yield index, range_pass(ranges, events_path, index, side, columns)


# The roles of the rows the audit pass hands Spark (column ``role`` of txmq.spark.audit.REST_ARROW).
SEVERAL = "SEVERAL"  # a half message of a transaction of several messages: grouped in Spark
OLDEST = "OLDEST"  # one of the range's oldest PENDING transactions of one message (OLDEST_KEPT of them)
COUNT = "COUNT"  # how many transactions of one message the range has per group, topic and resolution
ANOMALY = "ANOMALY"  # how many anomalies of a kind (column ``anomaly``) the range wrote to anomalies.parquet
LATENCY = "LATENCY"  # how many of its decided transactions of one message took each time to resolve (``times``)
OLDEST_KEPT = 20  # txmq.spark.audit.oldest_in_doubt's default limit

# anomalies.parquet's rows (txmq.spark.audit.anomalies), as the pass writes its part of them.
ANOMALY_ARROW = pa.schema(
    [
        pa.field("anomaly", pa.string()),
        pa.field("producer_group", pa.string()),
        pa.field("real_topic", pa.string()),
        pa.field("uniq_key", pa.string()),
        pa.field("half_commit_log_offset", pa.int64()),
        pa.field("resolution", pa.string()),
        pa.field("deliveries", pa.int32()),
        pa.field("delivered_msg_id", pa.string()),
    ]
)
COMMIT_WITHOUT_DELIVERY = "COMMIT_WITHOUT_DELIVERY"
DOUBLE_DELIVERY = "DOUBLE_DELIVERY"
DELIVERY_WITHOUT_COMMIT = "DELIVERY_WITHOUT_COMMIT"


def single_anomalies(singles: pa.Table) -> pa.Table:
    """The anomalies among transactions of one message (rows of PER_HALF_ARROW), by the rules of
    :func:`txmq.spark.audit.anomalies` in their order (a transaction of one message is never a PARTIAL_DELIVERY),
    as rows of ANOMALY_ARROW."""
    deliveries = singles["deliveries"]
    committed = pc.equal(singles["resolution"], "COMMIT")
    cases = [
        (pc.and_(committed, pc.equal(deliveries, 0)), COMMIT_WITHOUT_DELIVERY),
        (pc.greater(deliveries, 1), DOUBLE_DELIVERY),
        (pc.and_(pc.invert(committed), pc.greater(deliveries, 0)), DELIVERY_WITHOUT_COMMIT),
    ]
    anomaly = pc.case_when(
        pc.make_struct(*[c for c, _ in cases], field_names=[str(i) for i in range(len(cases))]),
        *[pa.scalar(name) for _, name in cases],
    )
    flagged = singles.append_column("anomaly", anomaly).filter(pc.is_valid(anomaly))
    return flagged.select(ANOMALY_ARROW.names).cast(ANOMALY_ARROW)


def orphan_anomalies(lone: pa.Table) -> pa.Table:
    """The copies whose half message is not in the store (rows of PASS_ARROW with ``orphan`` true) as
    DELIVERY_WITHOUT_COMMIT rows of ANOMALY_ARROW (no resolution)."""
    n = lone.num_rows
    return pa.table(
        {
            "anomaly": pa.repeat(pa.scalar(DELIVERY_WITHOUT_COMMIT), n),
            **{c: lone[c] for c in ("producer_group", "real_topic", "uniq_key")},
            "half_commit_log_offset": lone["half_phys"],
            "resolution": pa.nulls(n, pa.string()),
            "deliveries": lone["deliveries"],
            "delivered_msg_id": lone["delivered_msg_id"],
        },
        schema=ANOMALY_ARROW,
    )


@dataclass(frozen=True)
class PassOutputs:
    """Where the audit pass writes: ``audit.parquet`` and ``anomalies.parquet``'s folders."""

    audit: str
    anomalies: str


def audit_pass_rows(
    ranges: list[Range],
    events_path: str,
    outputs: PassOutputs,
    index: int,
    side: pa.Table,
    journal: pa.Table,
    discards: pa.Table,
) -> pa.Table:
    """Step 3 with the audit's rules (:func:`txmq.spark.audit.classify`) for range ``index`` (or NO_RANGE): its
    transactions of one message written as ``audit.parquet/part-<range>.parquet``, its anomalies (theirs and the
    copies without a half message) as ``anomalies.parquet/part-<range>.parquet`` (NO_RANGE's after the ranges');
    returned (rows of REST_ARROW): its counts, its oldest in doubt, its anomaly counts, and the half messages of
    transactions of several messages (see the roles above)."""
    from txmq.spark.audit import PASS_INPUT, classify, single_rows

    rows = range_pass(ranges, events_path, index, side, PASS_INPUT)
    orphan = rows["orphan"]
    halves = classify(rows.filter(pc.invert(orphan)), journal, discards)
    single = pc.is_null(halves["tx_seq"])
    singles = halves.filter(single)
    if index != NO_RANGE:
        write_part(single_rows(singles), outputs.audit, index)
    found = pa.concat_tables([single_anomalies(singles), orphan_anomalies(rows.filter(orphan))])
    write_part(found, outputs.anomalies, len(ranges) if index == NO_RANGE else index)
    pending = singles.filter(pc.equal(singles["resolution"], "PENDING"))
    order = [("prepared_ms", "ascending"), ("half_commit_log_offset", "ascending")]
    keys = ["producer_group", "real_topic", "resolution"]
    counts = singles.group_by(keys, use_threads=False).aggregate([("resolution", "count", pc.CountOptions(mode="all"))])
    kinds = found.group_by("anomaly", use_threads=False).aggregate([("anomaly", "count", pc.CountOptions(mode="all"))])
    timed = ["resolution", "time_to_resolution_ms"]  # a row per distinct time: exact percentiles from few rows
    decided = singles.filter(pc.not_equal(singles["resolution"], "PENDING"))
    times = decided.group_by(timed, use_threads=False).aggregate([("resolution", "count", pc.CountOptions(mode="all"))])
    times = times.rename_columns([*timed, "count"])
    parts = [
        _role(halves.filter(pc.invert(single)), SEVERAL),
        _role(pending.sort_by(order).slice(0, OLDEST_KEPT), OLDEST),
        _role(counts.select(keys), COUNT, count=counts["resolution_count"]),
        _role(kinds.select(["anomaly"]), ANOMALY, count=kinds["anomaly_count"]),
        _role(pa.table({"times": [write_times(times)]}), LATENCY),  # one row: thousands cost the JVM a second
    ]
    return pa.concat_tables(parts)


def write_times(times: pa.Table) -> bytes:
    """``times`` (resolution, time_to_resolution_ms, count) as the bytes of an Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, times.schema) as writer:
        writer.write_table(times)
    return sink.getvalue().to_pybytes()


def read_times(blob: bytes) -> pa.Table:
    """What :func:`write_times` wrote."""
    return pa.ipc.open_stream(blob).read_all()


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
    outputs: PassOutputs,
    side: pa.Table,
    journal: pa.Table,
    discards: pa.Table,
) -> Any:
    """Step 3 as a DataFrame (txmq.spark.audit.REST_ARROW; its tasks write audit.parquet's and anomalies.parquet's
    parts): a task per range, and one for the events whose half message lies in no range when there are any.
    ``side``: the events the scan routed to another range than their own (rows of SIDE_ARROW with their
    ``target``), shipped with the tasks (a few per cent of the store's events: each task takes its own)."""
    from txmq.spark.audit import REST_ARROW

    indices = list(range(len(ranges)))
    if pc.any(pc.equal(side["target"], NO_RANGE)).as_py():
        indices.append(NO_RANGE)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        one_task_threads()
        for batch in batches:
            for k in batch.column(0).to_pylist():
                summary = audit_pass_rows(ranges, events_path, outputs, indices[k], side, journal, discards)
                yield from summary.to_batches()

    return spark.range(0, len(indices), 1, max(len(indices), 1)).mapInArrow(run, spark_schema(REST_ARROW))
