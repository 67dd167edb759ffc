"""The hot path's public functions as operations on plain values, run the same way in two processes.

The test process runs them on whatever build it loaded (compiled when the install compiled the hot path); a child
started with ``TXMQ_PURE_PYTHON=1`` (``python hotpath_ops.py``) runs them on the ``.py`` sources and answers calls
sent over its stdin. Each operation takes and returns plain values (bytes, str, int, tuples, dicts), so the two
answers compare with ``==`` and no object crosses between the two builds' classes. A raised exception becomes
``("raised", class, message)``: both builds must refuse the same input with the same error and the same words.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
from collections.abc import Callable
from typing import Any

if __name__ == "__main__":
    # The child: its own directory is first on sys.path; txmq comes from the parent's checkout (PYTHONPATH).
    os.environ.setdefault("TXMQ_PURE_PYTHON", "1")

from txmq import _hotpath
from txmq.client import wire
from txmq.protocol import headers
from txmq.protocol.frame import FrameDecoder, RemotingCommand, decode_frame, encode_frame, encode_frame_parts
from txmq.protocol.record import (
    BatchEntry,
    MessageRecord,
    RecordView,
    WalkResult,
    decode_batch,
    decode_offset_msg_id,
    decode_properties,
    decode_record,
    encode_batch,
    encode_offset_msg_id,
    encode_parts,
    encode_properties,
    encode_record,
    join_properties,
    property_value,
    record_starts,
    tags_code,
    walk_segment,
)
from txmq.protocol.record.txcolumns import TxColumns
from txmq.store.entry import encode_entry, entry_from_bytes

RECORD_FIELDS = (
    "topic",
    "body",
    "queue_id",
    "flag",
    "queue_offset",
    "physical_offset",
    "sys_flag",
    "born_timestamp",
    "born_host",
    "store_timestamp",
    "store_host",
    "reconsume_times",
    "prepared_transaction_offset",
    "properties",
    "body_crc",
    "store_size",
)


def _command(cmd: RemotingCommand) -> tuple[Any, ...]:
    return (
        cmd.code,
        cmd.opaque,
        cmd.flag,
        cmd.remark,
        dict(cmd.ext_fields),
        bytes(cmd.body),
        cmd.language,
        cmd.version,
        cmd.serialize_type,
        cmd.is_response,
        cmd.is_oneway,
    )


def _record(rec: MessageRecord) -> tuple[Any, ...]:
    return (
        *[getattr(rec, name) for name in RECORD_FIELDS],
        rec.tags,
        rec.keys,
        rec.uniq_key,
        int(rec.transaction_type),
        rec.offset_msg_id if rec.store_host[0] else None,
    )


def _view(view: RecordView) -> tuple[Any, ...]:
    return (
        view.offset,
        view.store_size,
        view.sys_flag,
        view.body_crc,
        view.queue_id,
        view.flag,
        view.queue_offset,
        view.physical_offset,
        view.born_timestamp,
        view.born_host,
        view.store_timestamp,
        view.store_host,
        view.reconsume_times,
        view.prepared_transaction_offset,
        int(view.transaction_type),
        view.needs_consume_queue,
        view.body,
        view.body_len,
        view.topic_bytes,
        view.topic,
        view.properties_bytes,
        view.properties_text,
        view.properties,
        view.tags,
        view.keys,
        view.uniq_key,
        view.offset_msg_id,
        view.crc_ok(),
        view.raw(),
        _record(view.to_record()),
        _record(view.to_record(with_body=False)),
    )


# -- frames ----------------------------------------------------------------------------------------------------------


def op_encode_frame(fields: dict[str, Any]) -> tuple[bytes, bytes, bytes]:
    cmd = RemotingCommand(**fields)
    head, body = encode_frame_parts(cmd)
    return encode_frame(cmd), head, body


def op_feed(chunks: list[bytes], max_frame_size: int) -> list[Any]:
    """Feed the chunks to one decoder, then one more byte after the last (a failed decoder stays failed)."""
    decoder = FrameDecoder(max_frame_size=max_frame_size)
    out: list[Any] = []
    for chunk in [*chunks, b"\x00"]:
        try:
            out.append([_command(c) for c in decoder.feed(chunk)])
        except Exception as exc:
            out.append(_raised(exc))
        out.append((decoder.buffered, decoder.failed))
    return out


def op_decode_frame(data: bytes, max_frame_size: int) -> tuple[Any, ...]:
    return _command(decode_frame(data, max_frame_size=max_frame_size))


# -- records ---------------------------------------------------------------------------------------------------------


def op_encode_record(fields: dict[str, Any], properties_text: str | None, max_body: int | None) -> tuple[Any, ...]:
    record = MessageRecord(**fields)
    buf, sys_flag = encode_parts(record, max_body, properties_text)
    return bytes(buf), sys_flag, bytes(encode_record(MessageRecord(**fields), properties_text))


def op_decode_record(data: bytes, offset: int, check_crc: bool) -> tuple[Any, ...]:
    return _record(decode_record(data, offset, check_crc=check_crc))


def op_view(data: bytes, offset: int, check_crc: bool) -> tuple[Any, ...]:
    return _view(RecordView(data, offset, check_crc=check_crc))


def op_walk(data: bytes, options: dict[str, Any]) -> tuple[Any, ...]:
    result = WalkResult()
    skipped: list[tuple[int, str]] = []
    items: list[Any] = []
    walk = walk_segment(data, result=result, on_skip=lambda at, _size, why: skipped.append((at, why)), **options)
    try:
        for item in walk:
            items.append(_view(item) if options.get("views") else item)
    except Exception as exc:
        items.append(_raised(exc))
    finally:
        # A walk left by an exception of the caller's (decoding a view) fills ``result`` when it is closed. CPython
        # closes an interpreted generator as soon as it is dropped, a compiled one only when asked: ask.
        walk.close()
    fields = (result.start, result.end, result.reason, result.clean_end, result.blank)
    return (*fields, result.records, result.bytes, result.skipped, items, skipped)


def op_tx_columns(data: bytes, base: int, pos: int, stop: int, chunk: int, max_rows: int) -> tuple[Any, ...]:
    """The audit's walker over ``data`` (a segment whose first byte is ``base``), given pieces of ``chunk`` bytes and
    batches of ``max_rows`` rows, as ``transaction_batches`` drives it: every column, dictionary and stop."""
    cols = TxColumns()
    out: list[Any] = []
    at = pos
    piece = data[at : at + chunk]
    for _ in range(10_000):
        pos = cols.walk(piece, at, pos, base, len(data), stop, max_rows)
        out.append((pos, cols.need, cols.reason, cols.clean, cols.end, cols.damaged, list(cols.skipped)))
        out.append([list(c) for c in (cols.kinds, cols.offsets, cols.halves, cols.half_qos, cols.groups, cols.topics,
                    cols.qids, cols.qos, cols.tx_ids, cols.uniqs, cols.host_ids, cols.decisions, cols.checks,
                    cols.borns, cols.storeds, cols.seqs)])  # fmt: skip
        cols.clear()
        cols.skipped.clear()
        if cols.reason is not None:
            break
        if cols.need:
            at, piece = pos, data[pos : pos + max(chunk, cols.need)]
    return (*out, list(cols.names), list(cols.hosts))


def op_record_starts(data: bytes, points: list[int], start: int) -> list[int]:
    return record_starts(data, sorted(points), start=start)


def op_properties(text: str, key: str, other: str) -> tuple[Any, ...]:
    decoded = decode_properties(text)
    return decoded, encode_properties(decoded), property_value(text, key), join_properties(text, other)


def op_encode_properties(properties: dict[str, str]) -> str:
    return encode_properties(properties)


def op_batch(entries: list[tuple[bytes, int, str]]) -> bytes:
    return encode_batch([BatchEntry(body=b, flag=f, properties=p) for b, f, p in entries])


def op_decode_batch(data: bytes) -> list[tuple[bytes, int, str]]:
    return [(e.body, e.flag, e.properties) for e in decode_batch(data)]


def op_msg_id(text: str) -> tuple[Any, ...]:
    host, offset = decode_offset_msg_id(text)
    return host, offset, encode_offset_msg_id(host, offset)


def op_tags_code(tags: str | None) -> int:
    return tags_code(tags)


def _entry(entry: tuple[Any, ...]) -> tuple[Any, ...]:
    return (bytes(entry[0]), *entry[1:])


def op_encode_entry(fields: dict[str, Any], max_body: int, delay_levels: list[int]) -> tuple[Any, ...]:
    return _entry(encode_entry(MessageRecord(**fields), max_body, delay_levels))


def op_entry_from_bytes(data: bytes, max_body: int, delay_levels: list[int]) -> tuple[Any, ...]:
    return _entry(entry_from_bytes(data, max_body, delay_levels, ("10.0.0.1", 10911)))


# -- request headers ---------------------------------------------------------------------------------------------


def _header(h: headers.Header) -> tuple[Any, ...]:
    import dataclasses

    return (type(h).__name__, tuple((f.name, getattr(h, f.name)) for f in dataclasses.fields(h)))  # type: ignore[arg-type]


def op_header(name: str, ext: dict[str, str], code: int) -> tuple[Any, ...]:
    """The header parsed from ``ext`` (explicitly for the hot ones, and by the generic loop over its fields), and the
    request frame of the parsed header written back (V2 letters for a send)."""
    cls = getattr(headers, name)
    parsed = cls.from_ext(ext)
    try:
        generic: Any = _header(cls.parse_fields(ext))
    except headers.HeaderError as exc:
        generic = _raised(exc)
    written = parsed.to_v2_ext() if isinstance(parsed, headers.SendMessageRequestHeader) else parsed.to_ext()
    frame = encode_frame(RemotingCommand(code=code, opaque=1, ext_fields=written))
    return _header(parsed), generic, written, frame


# -- the client's per-message requests and answers (txmq.client.wire) ----------------------------------------------


def op_send_request(send: tuple[Any, ...], body: bytes, oneway: bool, opaque: int) -> tuple[Any, ...]:
    """SEND_MESSAGE_V2's extFields from ``send`` (send_v2_ext's arguments), its command and frame."""
    ext = wire.send_v2_ext(*send)
    cmd = wire.request_command(310, ext, body, oneway)
    cmd.opaque = opaque
    return list(ext.items()), _command(cmd), encode_frame(cmd)


def op_send_template(
    head: tuple[str, str, int], message: tuple[Any, ...], compress: tuple[int, int], oneway: bool
) -> tuple[Any, ...]:
    """A topic's SendTemplate (group, topic, template queue count) and the command and frame it makes of
    ``message`` (queue id, body, properties, flag, born timestamp)."""
    cmd = wire.SendTemplate(*head).command(*message, *compress, oneway)
    cmd.opaque = 9
    return _command(cmd), encode_frame(cmd)


def op_end_request(end: tuple[Any, ...], oneway: bool, opaque: int) -> tuple[Any, ...]:
    """END_TRANSACTION's extFields from ``end`` (end_transaction_ext's arguments), its command and frame."""
    ext = wire.end_transaction_ext(*end)
    cmd = wire.request_command(37, ext, b"", oneway)
    cmd.opaque = opaque
    return list(ext.items()), _command(cmd), encode_frame(cmd)


def op_send_result(frame: bytes, mq: tuple[str, str, int], uniq_key: str, addr: str) -> tuple[Any, ...]:
    """A send's answer (a frame, decoded as the client's connection does) read into a SendResult, as plain values."""
    from txmq.client.message import MessageQueue

    r = wire.send_result(decode_frame(frame), MessageQueue(*mq), uniq_key, addr)
    fields = (r.msg_id, r.offset_msg_id, tuple(r.message_queue), r.queue_offset, r.transaction_id, r.region_id)
    return (r.status.value, *fields, r.trace_on)


def op_lenient_int(raw: str | None, default: int) -> int:
    return wire.lenient_int(raw, default)


# -- topics (protocol.topics, broker.topics: every send's checks) ---------------------------------------------------


def op_topic(name: str, read: int, write: int, perm: int) -> tuple[Any, ...]:
    """What the send path asks of a topic name and its config."""
    from txmq.broker import topics
    from txmq.protocol.topics import group_of

    cfg = topics.TopicConfig(name, read, write, perm)
    return (
        topics.validate_topic(name),
        topics.validate_group(name),
        cfg.queue_count,
        cfg.writable,
        cfg.readable,
        cfg.to_json(),
        group_of(name),
        topics.is_writable(perm),
        topics.is_readable(perm),
    )


def op_key_entries(
    records: list[tuple[str, int, int, int, int, str | None, str | None]], progress: int, slot_count: int
) -> tuple[Any, ...]:
    """The key index's entries of ``records`` (topic, physical offset, size, store time, sys flag, KEYS, UNIQ_KEY)
    past ``progress``, sorted, and the arrays they are written into."""
    from array import array

    from txmq.store.dispatch import DispatchRequest
    from txmq.store.key_entries import key_entries, write_entries

    dispatches = [
        DispatchRequest(t, 0, 0, phys, size, 0, ts, flag, keys, uniq) for t, phys, size, ts, flag, keys, uniq in records
    ]
    entries: list[tuple[int, int, int]] = []
    end = key_entries(dispatches, progress, entries)
    entries.sort()  # a record's names are a set: their order is the process's string hashing
    n = len(entries) + 1
    arrays = (
        array("I", [0] * slot_count),
        array("Q", [0] * n),
        array("q", [0] * n),
        array("q", [0] * n),
        array("I", [0] * n),
    )
    count, low, high = write_entries(
        tuple(memoryview(a) for a in arrays),  # type: ignore[arg-type]
        slot_count,
        entries,
        0,
        len(entries),
        0,
        entries[0][2] if entries else 0,
        entries[0][2] if entries else 0,
    )
    return end, entries, [a.tolist() for a in arrays], count, low, high


def op_plan_puts(records: list[tuple[str, int, int, int, int, int, int]], maxes: dict[str, int]) -> tuple[Any, ...]:
    """The consume queues' plan of ``records`` (topic, queue id, queue offset, physical offset, size, tags code, sys
    flag), each queue starting at ``maxes[topic]``: the entries per queue, the unusual ones, the batch's end."""
    from types import SimpleNamespace

    from txmq.store.cq_plan import Plan, plan_puts
    from txmq.store.dispatch import DispatchRequest

    dispatches = [DispatchRequest(t, q, qo, phys, size, tags, 0, flag) for t, q, qo, phys, size, tags, flag in records]
    plans: dict[tuple[str, int], Plan] = {}
    unusual: list[tuple[Any, ...]] = []

    def on_unusual(plan: Plan, offset: int, raw: bytes, next_offset: int) -> None:
        unusual.append((plan.queue.key, offset, raw, next_offset))

    end = plan_puts(dispatches, plans, lambda key: SimpleNamespace(key=key, max=maxes.get(key[0], 0)), on_unusual)
    planned = sorted((key, p.base, p.entries, p.truncate, p.reset) for key, p in plans.items())
    return end, planned, unusual


OPS: dict[str, Callable[..., Any]] = {
    name.removeprefix("op_"): fn for name, fn in list(globals().items()) if name.startswith("op_")
}


def _raised(exc: BaseException) -> tuple[str, str, str]:
    return ("raised", f"{type(exc).__module__}.{type(exc).__qualname__}", str(exc))


def run(name: str, args: tuple[Any, ...]) -> Any:
    """``("ok", answer)`` or ``("raised", class, message)``."""
    try:
        return ("ok", OPS[name](*args))
    except Exception as exc:
        return _raised(exc)


def build() -> dict[str, Any]:
    """Which build of each hot module this process runs."""
    return {
        "state": (_hotpath.STATE.compiled, _hotpath.STATE.reason),
        "files": {m: sys.modules[m].__file__ for m in _hotpath.STATE.modules if m in sys.modules},
    }


_LEN = struct.Struct(">I")


def _serve() -> None:
    """Answer pickled ``(name, args)`` calls on stdin with pickled results on stdout, length-prefixed."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while head := stdin.read(4):
        (size,) = _LEN.unpack(head)
        name, args = pickle.loads(stdin.read(size))
        answer = pickle.dumps(build() if name == "build" else run(name, args))
        stdout.write(_LEN.pack(len(answer)) + answer)
        stdout.flush()


if __name__ == "__main__":
    _serve()
