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

import contextlib
import logging
import mmap
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from txmq.errors import RecordDecodeError
from txmq.protocol.op_marker import OP_TAG, RESUME_TAG, parse_marker
from txmq.protocol.record import MessageRecord, Prop, RecordView, WalkResult, walk_segment
from txmq.protocol.topics import TRANS_CHECK_MAX_TIME_TOPIC as DISCARD_TOPIC
from txmq.protocol.topics import TRANS_HALF_TOPIC as HALF_TOPIC
from txmq.protocol.topics import TRANS_OP_HALF_TOPIC as OP_TOPIC
from txmq.spark.common import STORE_COLUMNS, STORE_SCHEMA, bool_option, check_options, message_row, topics_option
from txmq.spark.errors import TxmqSparkError

log = logging.getLogger("txmq.spark")

__all__ = ["DISCARD_TOPIC", "HALF_TOPIC", "OP_TOPIC", "TxmqStoreDataSource", "list_segments", "scan_segment"]
TX_COMMIT_TYPE = 0x8
TX_MASK = 0xC

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
    """Records of one segment file whose start lies in ``[start + lo, start + hi)``."""

    path: str
    start: int
    lo: int
    hi: int

    def __init__(self, path: str, start: int, lo: int = 0, hi: int = 1 << 62) -> None:
        self.path = path
        self.start = start
        self.lo = lo
        self.hi = hi


def list_segments(path: str, split_bytes: int | None = None) -> list[Segment]:
    """The segments of a store, each cut into byte ranges of ``split_bytes`` (whole segments when None)."""
    directory = commitlog_dir(path)
    names = sorted(n for n in os.listdir(directory) if n.isdigit() and len(n) == 20)
    out = []
    for name in names:
        file = os.path.join(directory, name)
        if not split_bytes:
            out.append(Segment(file, int(name)))
            continue
        size = os.path.getsize(file)
        for lo in range(0, max(size, 1), split_bytes):
            out.append(Segment(file, int(name), lo, lo + split_bytes))
    return out


def scan_segment(seg: Segment, *, with_body: bool = True) -> Iterator[MessageRecord]:
    """The valid records of one segment (range), decoded, in order."""
    return scan(seg, lambda view: view.to_record(with_body=with_body))


def scan(seg: Segment, decode: Callable[[RecordView], Any]) -> Iterator[Any]:
    """``decode(view)`` for every valid record of ``seg`` whose start lies in its range (None results dropped).

    A range that does not start at the segment's beginning hops from record to record by TOTALSIZE to its first
    record (records cannot be found from an arbitrary byte); the hop stops, like the walk, at anything odd. A record
    whose body CRC alone fails is skipped with a warning; anything else odd ends the segment.
    """
    try:
        fd = os.open(seg.path, os.O_RDONLY)
    except FileNotFoundError:
        log.warning("segment %s vanished (retention?); skipped", seg.path)
        return
    try:
        size = os.fstat(fd).st_size
        if size < 8 or seg.lo >= size:
            return
        mm = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    finally:
        os.close(fd)

    def skipped(phys: int, size: int, why: str) -> None:
        log.warning("%s: damaged record at commit-log offset %d (%d bytes) skipped: %s", seg.path, phys, size, why)

    result = WalkResult()
    views = walk_segment(
        mm,
        base=seg.start,
        tail_room=0,
        hop_to=seg.start + seg.lo,
        stop_at=seg.start + seg.hi,
        skip_bad_crc=True,
        on_skip=skipped,
        views=True,
        result=result,
    )
    try:
        for view in views:
            try:
                item = decode(view)
            except RecordDecodeError as exc:  # topic or properties that are not UTF-8
                log.warning("%s: stopped at %d (damaged record: %s)", seg.path, view.physical_offset, exc)
                return
            if item is not None:
                yield item
        if not result.clean_end:
            log.warning("%s: stopped at %d (torn or damaged record: %s)", seg.path, result.end, result.reason)
    finally:
        views.close()  # releases the walk's buffer export, so the map can close
        mm.close()


_HALF = HALF_TOPIC.encode()
_OP = OP_TOPIC.encode()
_DISCARD = DISCARD_TOPIC.encode()


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return None


class TransactionColumns:
    """The ``transactions`` view (TX_COLUMNS) built column by column from record views: a half message, one row per
    decision of an op marker (a marker may hold several) or resume record, a committed delivery, a discard copy.
    Any other record is skipped from its topic and sysFlag alone, before anything else is decoded.

    The hot loop of the audit: per record one header read, one properties parse, and the offsetMsgId from the
    store host's hex (kept per host) and the offset, with no record object or row tuple in between."""

    def __init__(self) -> None:
        self.columns: tuple[list[Any], ...] = tuple([] for _ in TX_COLUMNS)
        self._prefix: dict[bytes, str] = {}  # store host bytes -> their upper-case hex

    def __len__(self) -> int:
        return len(self.columns[0])

    def add(self, view: RecordView) -> None:
        topic = view.topic_bytes
        sys_flag = view.sys_flag
        if topic == _HALF:
            kind = "HALF"
        elif topic == _OP:
            kind = "OP"
        elif topic == _DISCARD:
            kind = "DISCARD_COPY"
        elif sys_flag & TX_MASK == TX_COMMIT_TYPE:
            kind = "DELIVERY"
        else:
            return
        _size, _magic, _crc, queue_id, _flag, queue_offset, phys, _sys, born = view.head()
        props = view.properties
        host = view.store_host_bytes
        prefix = self._prefix.get(host)
        if prefix is None:
            prefix = self._prefix[host] = host.hex().upper()
        msg_id = f"{prefix}{phys:016X}"
        stored = view.store_timestamp
        uniq = props.get(Prop.UNIQ_KEY)
        several = props.get(Prop.TX_ID)
        seq = _int(props.get(Prop.TX_SEQ)) if several else None
        (kinds, offsets, halves, half_qos, groups, topics, qids, qos, tx_ids, uniqs, msg_ids, decisions, checks, borns,
         storeds, seqs) = self.columns  # fmt: skip
        if kind == "OP":
            tag = props.get(Prop.TAGS)
            if tag != OP_TAG and tag != RESUME_TAG:
                return
            try:
                marked = parse_marker(view.body, props)
            except ValueError:
                return  # a malformed marker is ignored, as the broker does
            keys = (props.get(Prop.KEYS) or "").split(" ")
            if len(keys) != len(marked):  # txmq markers list the transactions' UNIQ_KEYs in KEYS, in order
                keys = [uniq] * len(marked)
            is_op = tag == OP_TAG
            for m, key in zip(marked, keys, strict=True):
                kinds.append("OP" if is_op else "RESUME")
                offsets.append(phys)
                halves.append(m.half_phys)
                half_qos.append(m.half_queue_offset)
                groups.append(None)
                topics.append(None)
                qids.append(None)
                qos.append(queue_offset)
                tx_ids.append(None)
                uniqs.append(key or None)
                msg_ids.append(msg_id)
                decisions.append(m.decision if is_op else None)
                checks.append(None)
                borns.append(born)
                storeds.append(stored)
                seqs.append(None)
            return
        kinds.append(kind)
        offsets.append(phys)
        msg_ids.append(msg_id)
        uniqs.append(uniq)
        decisions.append(None)
        borns.append(born)
        storeds.append(stored)
        seqs.append(seq)
        if kind == "HALF":
            halves.append(phys)
            half_qos.append(queue_offset)
            groups.append(props.get(Prop.PGROUP))
            topics.append(props.get(Prop.REAL_TOPIC))
            qids.append(_int(props.get(Prop.REAL_QID)))
            qos.append(None)
            tx_ids.append(several or props.get(Prop.TRANSACTION_ID) or uniq)
            checks.append(None)
        elif kind == "DISCARD_COPY":
            halves.append(None)
            half_qos.append(None)
            groups.append(props.get(Prop.PGROUP))
            topics.append(props.get(Prop.REAL_TOPIC))
            qids.append(_int(props.get(Prop.REAL_QID)))
            qos.append(queue_offset)
            tx_ids.append(props.get(Prop.TRANSACTION_ID) or uniq)
            checks.append(_int(props.get(Prop.TRANSACTION_CHECK_TIMES)))
        else:  # DELIVERY: a committed copy in the real topic, pointing at its half message
            halves.append(view.prepared_transaction_offset)
            half_qos.append(None)
            groups.append(props.get(Prop.PGROUP))
            topics.append(view.topic)
            qids.append(queue_id)
            qos.append(queue_offset)
            tx_ids.append(several or props.get(Prop.TRANSACTION_ID) or uniq)
            checks.append(None)

    def batch(self, schema: pa.Schema) -> pa.RecordBatch:
        """The rows added so far as one Arrow batch; the columns start empty again."""
        arrays = [pa.array(col, type=f.type) for f, col in zip(schema, self.columns, strict=True)]
        for col in self.columns:
            col.clear()
        return pa.RecordBatch.from_arrays(arrays, schema=schema)


def transaction_batches(seg: Segment, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """The ``transactions`` view of one segment (range), in Arrow batches of about ``batch_rows`` rows."""
    schema = arrow_schema(TX_COLUMNS)
    cols = TransactionColumns()
    add = cols.add
    with contextlib.closing(scan(seg, _same)) as views:
        for view in views:  # each view is used before the walk moves on (its map closes with the walk)
            try:
                add(view)
            except RecordDecodeError as exc:  # topic or properties that are not UTF-8
                log.warning("%s: stopped at %d (damaged record: %s)", seg.path, view.physical_offset, exc)
                break
            if len(cols) >= batch_rows:
                yield cols.batch(schema)
    if len(cols):
        yield cols.batch(schema)


def _same(view: RecordView) -> RecordView:
    return view


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
