"""Bodies in fastjson's dialect, where a map keyed by MessageQueue is written with JSON objects as keys.

Java admin tooling (mqadmin, the dashboard) parses
``{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:{..}}}``, which is not standard JSON, so these bodies
are assembled by hand. Key order inside the object key is alphabetical.
"""

from __future__ import annotations

from typing import Any

import orjson


def mq_key(topic: str, broker_name: str, queue_id: int) -> str:
    return orjson.dumps({"brokerName": broker_name, "queueId": queue_id, "topic": topic}).decode()


def object_keyed_map(entries: list[tuple[str, Any]]) -> str:
    """``{<key json>:<value json>,...}`` where each key is already JSON text (an object)."""
    return "{" + ",".join(f"{k}:{orjson.dumps(v).decode()}" for k, v in entries) + "}"


def with_object_map(field: str, entries: list[tuple[str, Any]], rest: dict[str, Any]) -> bytes:
    """A JSON object whose ``field`` is an object-keyed map, followed by the ordinary fields of ``rest``."""
    parts = [f'"{field}":{object_keyed_map(entries)}']
    parts.extend(f"{orjson.dumps(k).decode()}:{orjson.dumps(v).decode()}" for k, v in rest.items())
    return ("{" + ",".join(parts) + "}").encode()
