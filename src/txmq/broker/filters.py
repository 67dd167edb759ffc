"""SQL92 property filters on the broker: compiled expressions cached per group/topic, and the store-side test.

RocketMQ keeps a ``ConsumerFilterData`` per (topic, group) built from heartbeats; txmq compiles the heartbeat's
(or the pull's) expression on first use and keeps the result, a filter or the compile error, in a bounded cache
keyed by (group, topic, type, expression), so a changed subscription compiles once and then hits the cache.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable

from txmq.errors import FilterExpressionError, RecordDecodeError
from txmq.filter import SQL92, SqlFilter, compile_sql92
from txmq.protocol.record import decode_record

log = logging.getLogger("txmq.broker")

# RocketMQ's remarks, word for word (PullMessageProcessor, ClientManageProcessor).
PARSE_FAILED_REMARK = "parse the consumer's subscription failed"
FILTER_DATA_NOT_EXIST_REMARK = "The broker's consumer filter data is not exist!Your expression may be wrong!"


def unsupported_remark(expression_type: str) -> str:
    return f"The broker does not support consumer to filter message by {expression_type}"


def compile_expression(expression_type: str, expression: str | None) -> SqlFilter:
    """Compile an expression of a non-TAG type; an unknown type is an error, as in RocketMQ's FilterFactory."""
    if expression_type != SQL92:
        raise FilterExpressionError(
            f"unknown filter expression type {expression_type!r}: the broker filters by TAG or SQL92", expression
        )
    return compile_sql92(expression)


class ConsumerFilters:
    """Compiled filters by (group, topic, type, expression); failed compiles are cached too."""

    def __init__(self, max_entries: int = 4096) -> None:
        self.max_entries = max_entries
        self._cache: OrderedDict[tuple[str, str, str, str], SqlFilter | FilterExpressionError] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, group: str, topic: str, expression_type: str, expression: str | None) -> SqlFilter:
        """The compiled filter; raises :class:`FilterExpressionError` (cached) for a malformed expression."""
        key = (group, topic, expression_type, expression or "")
        with self._lock:
            found = self._cache.get(key)
            if found is not None:
                self._cache.move_to_end(key)
        if found is None:
            try:
                found = compile_expression(expression_type, expression)
            except FilterExpressionError as exc:
                log.warning("consumer %s cannot filter %s: %s", group, topic, exc)
                found = exc
            with self._lock:
                self._cache[key] = found
                while len(self._cache) > self.max_entries:
                    self._cache.popitem(last=False)
        if isinstance(found, FilterExpressionError):
            raise found
        return found

    def __len__(self) -> int:
        return len(self._cache)


def record_filter(sql: SqlFilter) -> Callable[[bytes], bool]:
    """The store's per-record test: decode the record's properties (every one, system properties such as TAGS
    included, as RocketMQ's MessageEvaluationContext sees them) and evaluate."""

    def matches(data: bytes) -> bool:
        try:
            properties = decode_record(data, check_crc=False, with_body=False).properties
        except RecordDecodeError:
            return False
        return sql.matches(properties)

    return matches
