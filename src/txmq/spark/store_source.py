"""``spark.read.format("txmq-store")``: a broker's store folder read directly, with no broker running.

One partition per ``splitBytes`` (64 MiB) of each commit-log segment. Records never span segments (a segment ends with
a blank filler), so a partition walks its segment from the first byte by TOTALSIZE to its range, then decodes. A
record is taken when its header, field lengths and PHYSICALOFFSET check out and its body CRC matches; a record whose
CRC alone fails is skipped with a warning (its size still chains to the next one). A segment ends at zeros (the end of
data), at a blank, or at the first record that does not chain (the torn tail of a store copied from a killed broker).
Nothing is written to the folder.

Two views (option ``view``): ``messages`` (default), every record, half and op records included, as the ``txmq``
columns plus ``commit_log_offset`` and ``store_size``; ``transactions``, one compact row per transaction-related record
(half message, op marker, committed delivery, discard copy), which is what the transaction audit joins.
"""

from __future__ import annotations

import array
import contextlib
import logging
import mmap
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from txmq.errors import RecordDecodeError
from txmq.protocol.record import MessageRecord, RecordView, WalkResult, record_starts, walk_segment
from txmq.protocol.record.txcolumns import KINDS, NULL, TxColumns
from txmq.protocol.topics import TRANS_CHECK_MAX_TIME_TOPIC as DISCARD_TOPIC
from txmq.protocol.topics import TRANS_HALF_TOPIC as HALF_TOPIC
from txmq.protocol.topics import TRANS_OP_HALF_TOPIC as OP_TOPIC
from txmq.spark.common import STORE_COLUMNS, STORE_SCHEMA, bool_option, check_options, message_row, topics_option
from txmq.spark.errors import TxmqSparkError

log = logging.getLogger("txmq.spark")

__all__ = ["DISCARD_TOPIC", "HALF_TOPIC", "OP_TOPIC", "TxmqStoreDataSource", "list_segments", "scan_segment"]

TX_COLUMNS = (
    ("kind", "string"),  # HALF, OP, RESUME, DELIVERY, DISCARD_COPY
    ("commit_log_offset", "bigint"),
    ("half_phys", "bigint"),  # the half message's commit-log offset (null on an op marker written by RocketMQ)
    ("half_queue_offset", "bigint"),
    ("producer_group", "string"),
    ("topic", "string"),  # REAL_TOPIC of a half message / the topic of a delivery
    ("queue_id", "int"),
    ("queue_offset", "bigint"),
    ("transaction_id", "string"),
    ("uniq_key", "string"),
    ("offset_msg_id", "string"),
    ("decision", "string"),  # op markers: COMMIT, ROLLBACK, DISCARD or UNKNOWN
    ("checks", "int"),  # discard copies: TRANSACTION_CHECK_TIMES
    ("born_timestamp", "bigint"),
    ("store_timestamp", "bigint"),
    ("tx_seq", "int"),  # a message of a transaction of several (TXMQ_TX_SEQ; its TXMQ_TX_ID is transaction_id)
)
TX_SCHEMA = ", ".join(f"{n} {t}" for n, t in TX_COLUMNS)

KNOWN_OPTIONS = {"path", "view", "topics", "topic", "withBody", "batchRows", "splitBytes"}
_ARROW = {
    "string": pa.string(),
    "int": pa.int32(),
    "bigint": pa.int64(),
    "binary": pa.binary(),
    "map<string,string>": pa.map_(pa.string(), pa.string()),
}
DEFAULT_SPLIT_BYTES = 64 << 20  # a partition per 64 MiB of commit log (a 1 GiB segment gives 16)


def arrow_schema(columns: tuple[tuple[str, str], ...]) -> pa.Schema:
    return pa.schema([pa.field(n, _ARROW[t]) for n, t in columns])


def commitlog_dir(path: str) -> str:
    """``<store>/commitlog`` for a store root, or ``path`` itself when it already is the commit-log folder."""
    candidate = os.path.join(path, "commitlog")
    if os.path.isdir(candidate):
        return candidate
    if os.path.isdir(path) and any(n.isdigit() and len(n) == 20 for n in os.listdir(path)):
        return path
    if not os.path.exists(path):
        raise TxmqSparkError(f"store folder {path} does not exist")
    raise TxmqSparkError(f"{path} is not a txmq/RocketMQ store: no commitlog folder and no commit-log segments in it")


@dataclass
class Segment(InputPartition):
    """Records of one segment file whose start lies in ``[start + lo, start + hi)``. ``first``, when known (>= 0), is
    where the first of them begins (found on the driver by :func:`list_segments`), so the walk starts there instead
    of hopping from the segment's first record."""

    path: str
    start: int
    lo: int
    hi: int
    first: int

    def __init__(self, path: str, start: int, lo: int = 0, hi: int = 1 << 62, first: int = -1) -> None:
        self.path = path
        self.start = start
        self.lo = lo
        self.hi = hi
        self.first = first


def list_segments(path: str, split_bytes: int | None = None) -> list[Segment]:
    """The segments of a store, each cut into byte ranges of ``split_bytes`` (whole segments when None). A segment
    cut into several ranges is chained once here, by TOTALSIZE, to find where each range's first record starts; a
    range the chain does not reach (past the end of the data, or past a break) holds nothing and is left out: the
    store is read as it was when the job was planned."""
    directory = commitlog_dir(path)
    names = sorted(n for n in os.listdir(directory) if n.isdigit() and len(n) == 20)
    out = []
    for name in names:
        file = os.path.join(directory, name)
        if not split_bytes:
            out.append(Segment(file, int(name)))
            continue
        size = os.path.getsize(file)
        los = list(range(0, max(size, 1), split_bytes))
        firsts = _first_records(file, los) if len(los) > 1 else [0]
        for lo, first in zip(los, firsts, strict=True):
            if first >= 0:  # past the end of the data (or a break in the chain) when the job was planned: empty
                out.append(Segment(file, int(name), lo, lo + split_bytes, first))
    return out


def _first_records(file: str, points: list[int]) -> list[int]:
    """Where the first record at or past each point starts (-1: the chain does not reach it)."""
    try:
        with open(file, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm:
            return record_starts(mm, points)
    except (OSError, ValueError):  # vanished, or emptied, since it was listed
        return [-1] * len(points)


def scan_segment(seg: Segment, *, with_body: bool = True) -> Iterator[MessageRecord]:
    """The valid records of one segment (range), decoded, in order."""
    return scan(seg, lambda view: view.to_record(with_body=with_body))


@contextlib.contextmanager
def segment_views(seg: Segment) -> Iterator[tuple[Iterator[RecordView], WalkResult]]:
    """The walk over the valid records of ``seg`` whose start lies in its range (:class:`RecordView` s, each valid
    until the walk moves on), and the :class:`WalkResult` it fills; an empty walk for a vanished segment.

    A range walks from its first record (found by :func:`list_segments`), or hops from the segment's first record
    by TOTALSIZE when that is not known (records cannot be found from an arbitrary byte); the hop stops, like the
    walk, at anything odd. A record whose body CRC alone fails is skipped with a warning; anything else odd ends
    the segment, with a warning when the walk is over."""
    result = WalkResult()
    try:
        fd = os.open(seg.path, os.O_RDONLY)
    except FileNotFoundError:
        log.warning("segment %s vanished (retention?); skipped", seg.path)
        yield iter(()), result
        return
    try:
        size = os.fstat(fd).st_size
        mm = mmap.mmap(fd, size, prot=mmap.PROT_READ) if size >= 8 and seg.lo < size else None
    finally:
        os.close(fd)
    if mm is None:
        yield iter(()), result
        return

    def skipped(phys: int, size: int, why: str) -> None:
        log.warning("%s: damaged record at commit-log offset %d (%d bytes) skipped: %s", seg.path, phys, size, why)

    views = walk_segment(
        mm,
        base=seg.start,
        start=seg.first if 0 <= seg.first < size else 0,
        tail_room=0,
        hop_to=seg.start + seg.lo,
        stop_at=seg.start + seg.hi,
        skip_bad_crc=True,
        on_skip=skipped,
        views=True,
        result=result,
    )
    try:
        yield views, result
        if not result.clean_end:
            log.warning("%s: stopped at %d (torn or damaged record: %s)", seg.path, result.end, result.reason)
    finally:
        views.close()  # releases the walk's buffer export, so the map can close
        mm.close()


def scan(seg: Segment, decode: Callable[[RecordView], Any]) -> Iterator[Any]:
    """``decode(view)`` for every valid record of ``seg`` whose start lies in its range (None results dropped); see
    :func:`segment_views`. A record whose topic or properties are not UTF-8 ends the segment, with a warning."""
    with segment_views(seg) as (views, _result):
        for view in views:
            try:
                item = decode(view)
            except RecordDecodeError as exc:  # topic or properties that are not UTF-8
                log.warning("%s: stopped at %d (damaged record: %s)", seg.path, view.physical_offset, exc)
                return
            if item is not None:
                yield item


_KIND_NAMES = pa.array(KINDS, type=pa.string())
_NO_ID = pa.scalar(None, type=pa.int32())


def _ids(values: list[int], dictionary: pa.Array) -> pa.Array:
    """Indices into ``dictionary`` (-1: null) as the values they stand for."""
    ids = _ints(values, "i", pa.int32())
    return dictionary.take(pc.if_else(pc.less(ids, 0), _NO_ID, ids))


def tx_batch(cols: TxColumns, schema: pa.Schema) -> pa.RecordBatch:
    """The rows of ``cols`` as one Arrow batch of the ``transactions`` view (TX_COLUMNS); ``cols`` starts empty
    again. Repeated strings go through their dictionaries; the offsetMsgId is the store host's hex and the
    commit-log offset's (16 hex digits, non-negative: the walk checked it is the record's position), joined in bulk.
    The int columns are copied into Arrow in one piece each (:func:`_ints`), not value by value.
    pyarrow alone (the executors' Python may hold nothing else: txmq.spark.package)."""
    names = pa.array(cols.names, type=pa.string())
    hosts = pa.array([h.hex().upper() for h in cols.hosts], type=pa.string())
    msg_ids = pc.binary_join_element_wise(_ids(cols.host_ids, hosts), _hex16(cols.offsets), "")
    i64, i32 = pa.int64(), pa.int32()
    arrays = [
        _KIND_NAMES.take(_ints(cols.kinds, "b", pa.int8())),
        _ints(cols.offsets, "q", i64),
        _ints(cols.halves, "q", i64, nullable=True),
        _ints(cols.half_qos, "q", i64, nullable=True),
        _ids(cols.groups, names),
        _ids(cols.topics, names),
        _ints(cols.qids, "q", i64, nullable=True).cast(i32),
        _ints(cols.qos, "q", i64, nullable=True),
        pa.array(cols.tx_ids, type=pa.string()),
        pa.array(cols.uniqs, type=pa.string()),
        msg_ids,
        _ids(cols.decisions, names),
        _ints(cols.checks, "q", i64, nullable=True).cast(i32),
        _ints(cols.borns, "q", i64),
        _ints(cols.storeds, "q", i64),
        _ints(cols.seqs, "q", i64, nullable=True).cast(i32),
    ]
    cols.clear()
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _ints(values: list[int], code: str, kind: pa.DataType, *, nullable: bool = False) -> pa.Array:
    """``values`` as an Arrow array of ``kind`` (whose width the ``array`` type ``code`` has), copied in one piece
    (``pa.array`` converts value by value, at several times the cost); with ``nullable``, :data:`NULL` is null."""
    data = pa.py_buffer(array.array(code, values))
    out = pa.Array.from_buffers(kind, len(values), [None, data])
    if not nullable:
        return out
    valid = pc.not_equal(out, pa.scalar(NULL, type=kind))  # no nulls in ``out``: its values are the validity bitmap
    if valid.true_count == len(values):
        return out
    return pa.Array.from_buffers(kind, len(values), [valid.buffers()[1], data])


def _hex16(offsets: list[int]) -> pa.Array:
    """Non-negative ints as 16 upper-case hex digits each, in bulk: their big-endian bytes in one ``hex()``."""
    raw = array.array("q", offsets)
    if sys.byteorder == "little":
        raw.byteswap()
    text = raw.tobytes().hex().upper().encode()
    ends = array.array("i", range(0, 16 * len(offsets) + 1, 16))
    return pa.Array.from_buffers(pa.string(), len(offsets), [None, pa.py_buffer(ends), pa.py_buffer(text)])


CHUNK_BYTES = 8 << 20  # the transactions view reads a range in pieces of this size


def transaction_batches(seg: Segment, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """The ``transactions`` view of one segment (range), in Arrow batches of about ``batch_rows`` rows: the range's
    bytes read in pieces and walked by :meth:`TxColumns.walk` (the checks of :func:`segment_views`' walk)."""
    schema = arrow_schema(TX_COLUMNS)
    cols = TxColumns()
    try:
        f = open(seg.path, "rb")  # noqa: SIM115 (closed below, after the generator's last batch)
    except FileNotFoundError:
        log.warning("segment %s vanished (retention?); skipped", seg.path)
        return
    with f:
        size = os.fstat(f.fileno()).st_size
        if size < 8 or seg.lo >= size:
            return
        pos = seg.first if 0 <= seg.first < size else _hop(f, size, seg.lo)
        if pos < 0:
            return
        stop = min(size, seg.hi)
        at, data = pos, _read(f, pos, CHUNK_BYTES)
        while True:
            pos = cols.walk(data, at, pos, seg.start, size, stop, batch_rows)
            for phys, why in cols.skipped:
                log.warning("%s: record at %d skipped: %s", seg.path, phys, why)
            cols.skipped.clear()
            if len(cols) >= batch_rows or (cols.reason is not None and len(cols)):
                yield tx_batch(cols, schema)
            if cols.reason is not None:
                break
            if cols.need:  # the piece ended mid-record: read on from its start
                at, data = pos, _read(f, pos, max(CHUNK_BYTES, cols.need))
                if len(data) < cols.need:  # the file shrank under the reader (retention): what was read stays
                    log.warning("%s: cut short at %d while it was read", seg.path, seg.start + pos)
                    return
    if cols.damaged is not None:
        log.warning("%s: stopped at %d (damaged record: %s)", seg.path, cols.damaged[0], cols.damaged[1])
    elif not cols.clean:
        log.warning("%s: stopped at %d (torn or damaged record: %s)", seg.path, seg.start + cols.end, cols.reason)


def _hop(f: Any, size: int, lo: int) -> int:
    """Where the first record at or past ``lo`` starts, chained by TOTALSIZE from the segment's start (-1: the chain
    does not reach it, and the range holds nothing)."""
    if lo == 0:
        return 0
    with mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as mm:
        return record_starts(mm, [lo])[0]


def _read(f: Any, pos: int, count: int) -> bytes:
    f.seek(pos)
    return f.read(count)  # type: ignore[no-any-return]


def _batches(rows: Iterator[tuple[Any, ...]], schema: pa.Schema, batch_rows: int) -> Iterator[pa.RecordBatch]:
    width = len(schema)
    chunk: list[tuple[Any, ...]] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) >= batch_rows:
            yield _to_batch(chunk, schema, width)
            chunk = []
    if chunk:
        yield _to_batch(chunk, schema, width)


def _to_batch(chunk: list[tuple[Any, ...]], schema: pa.Schema, width: int) -> pa.RecordBatch:
    columns = list(zip(*chunk, strict=True)) if chunk else [() for _ in range(width)]
    arrays = []
    for f, col in zip(schema, columns, strict=True):
        if pa.types.is_map(f.type):
            arrays.append(pa.array([list(d.items()) for d in col], type=f.type))
        else:
            arrays.append(pa.array(col, type=f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


class TxmqStoreDataSource(DataSource):
    """Format ``txmq-store``: a store folder (``option("path", ...)`` or ``load(path)``)."""

    @classmethod
    def name(cls) -> str:
        return "txmq-store"

    def _parse(self) -> dict[str, str]:
        opts = check_options("txmq-store", dict(self.options), KNOWN_OPTIONS)
        if not opts.get("path"):
            raise TxmqSparkError('format "txmq-store" needs the store folder: .option("path", DIR) or .load(DIR)')
        view = opts.get("view", "messages")
        if view not in ("messages", "transactions"):
            raise TxmqSparkError(f'option view must be "messages" or "transactions", got {view!r}')
        commitlog_dir(opts["path"])
        return opts

    def schema(self) -> str:
        opts = self._parse()
        return TX_SCHEMA if opts.get("view") == "transactions" else STORE_SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        return TxmqStoreReader(self._parse())


class TxmqStoreReader(DataSourceReader):
    def __init__(self, opts: dict[str, str]) -> None:
        self.path = opts["path"]
        self.view = opts.get("view", "messages")
        self.topics = frozenset(topics_option(opts, required=False))
        self.with_body = bool_option(opts, "withBody", True)
        raw_rows = opts.get("batchrows", "65536")
        if not raw_rows.isdigit() or int(raw_rows) < 1:
            raise TxmqSparkError(f"option batchRows must be a positive integer, got {raw_rows!r}")
        self.batch_rows = int(raw_rows)
        raw_split = opts.get("splitbytes", str(DEFAULT_SPLIT_BYTES))
        if not raw_split.isdigit() or int(raw_split) < 4096:
            raise TxmqSparkError(f"option splitBytes must be an integer >= 4096, got {raw_split!r}")
        self.split_bytes = int(raw_split)

    def partitions(self) -> list[Segment]:
        segments = list_segments(self.path, self.split_bytes)
        return segments or [Segment("", -1)]

    def read(self, partition: Segment) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        if partition.start < 0:
            return iter(())
        if self.view == "transactions":
            return transaction_batches(partition, self.batch_rows)
        topics = self.topics
        rows = (
            (*message_row(rec), rec.physical_offset, rec.store_size)
            for rec in scan_segment(partition, with_body=self.with_body)
            if not topics or rec.topic in topics
        )
        return _batches(rows, arrow_schema(STORE_COLUMNS), self.batch_rows)
