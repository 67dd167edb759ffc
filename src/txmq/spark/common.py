"""Shared pieces of txmq's Spark sources: the message schema, rows from records, option parsing, offset keys.

Nothing here imports pyspark, so the planner and the workers import it cheaply and the rules are unit-testable.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from txmq.protocol.record import MessageRecord, Prop
from txmq.spark.errors import TxmqSparkError

MESSAGE_COLUMNS = (
    ("topic", "string"),
    ("queue_id", "int"),
    ("queue_offset", "bigint"),
    ("msg_id", "string"),
    ("offset_msg_id", "string"),
    ("keys", "string"),
    ("tags", "string"),
    ("body", "binary"),
    ("properties", "map<string,string>"),
    ("born_timestamp", "bigint"),
    ("store_timestamp", "bigint"),
    ("born_host", "string"),
    ("store_host", "string"),
    ("reconsume_times", "int"),
    ("sys_flag", "int"),
    ("prepared_transaction_offset", "bigint"),
)
MESSAGE_SCHEMA = ", ".join(f"{name} {kind}" for name, kind in MESSAGE_COLUMNS)

# The store source adds where each record sits in the commit log.
STORE_COLUMNS = (*MESSAGE_COLUMNS, ("commit_log_offset", "bigint"), ("store_size", "int"))
STORE_SCHEMA = ", ".join(f"{name} {kind}" for name, kind in STORE_COLUMNS)


def host_text(host: tuple[str, int]) -> str:
    ip, port = host
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def message_row(record: MessageRecord, body: bytes | None = None) -> tuple[Any, ...]:
    """A row of MESSAGE_SCHEMA; ``msg_id`` is the UNIQ_KEY (the offsetMsgId when the message has none)."""
    props = record.properties
    offset_msg_id = record.offset_msg_id
    return (
        record.topic,
        record.queue_id,
        record.queue_offset,
        props.get(Prop.UNIQ_KEY) or offset_msg_id,
        offset_msg_id,
        props.get(Prop.KEYS),
        props.get(Prop.TAGS),
        record.body if body is None else body,
        props,
        record.born_timestamp,
        record.store_timestamp,
        host_text(record.born_host),
        host_text(record.store_host),
        record.reconsume_times,
        record.sys_flag,
        record.prepared_transaction_offset,
    )


# ---------------------------------------------------------------------------------------------------------------
# Options


def check_options(fmt: str, options: Mapping[str, str], known: set[str]) -> dict[str, str]:
    """Lower-cased options; an unknown one is an error naming the known ones (``known`` as users spell them)."""
    out = {str(k).lower(): str(v) for k, v in options.items()}
    lowered = {k.lower() for k in known}
    unknown = sorted(k for k in out if k not in lowered)
    if unknown:
        names = ", ".join(sorted(known, key=str.lower))
        raise TxmqSparkError(f"unknown option {unknown[0]!r} for format {fmt!r}; known options: {names}")
    return out


def int_option(options: Mapping[str, str], name: str, default: int | None, *, minimum: int = 0) -> int | None:
    raw = options.get(name.lower())
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise TxmqSparkError(f"option {name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise TxmqSparkError(f"option {name} must be >= {minimum}, got {value}")
    return value


def bool_option(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name.lower())
    if raw is None or raw == "":
        return default
    if raw.lower() in ("true", "1", "yes"):
        return True
    if raw.lower() in ("false", "0", "no"):
        return False
    raise TxmqSparkError(f"option {name} must be true or false, got {raw!r}")


def topics_option(options: Mapping[str, str], *, required: bool = True) -> list[str]:
    raw = options.get("topics") or options.get("topic") or ""
    topics = [t.strip() for t in raw.split(",") if t.strip()]
    if required and not topics:
        raise TxmqSparkError("option topics is required (a comma-separated list of topic names)")
    return topics


def queue_key(topic: str, queue_id: int, broker: str | None = None) -> str:
    """The offset key of a queue: ``topic/queueId``, or ``topic/broker/queueId`` for a topic on several brokers."""
    return f"{topic}/{queue_id}" if broker is None else f"{topic}/{broker}/{queue_id}"


def offsets_option(options: Mapping[str, str], name: str) -> str | dict[str, int] | None:
    """``earliest``, ``latest`` or a JSON object of per-queue offsets ``{"T/0": 5}``; None when absent."""
    raw = options.get(name.lower())
    if raw is None or raw.strip() == "":
        return None
    text = raw.strip()
    if text in ("earliest", "latest"):
        return text
    try:
        data = json.loads(text)
    except ValueError:
        raise TxmqSparkError(
            f'option {name} must be "earliest", "latest" or JSON like {{"TopicA/0": 5}}, got {raw!r}'
        ) from None
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and "/" in k and isinstance(v, int) and not isinstance(v, bool) and v >= -2
        for k, v in data.items()
    ):
        raise TxmqSparkError(
            f'option {name} must map "topic/queueId" to an offset (-2 earliest, -1 latest), got {raw!r}'
        )
    return dict(data)


def dumps_offsets(offsets: Mapping[str, int]) -> dict[str, int]:
    """Offsets as Spark wants them: string keys in sorted order (Spark compares the JSON text)."""
    return {k: int(offsets[k]) for k in sorted(offsets)}
