"""Message filters evaluated by the broker: RocketMQ's SQL92 selectors over message properties (no IO).

``compile_sql92("a > 5 AND b = 'x'")`` returns a :class:`SqlFilter` whose ``matches(properties)`` decides one
message. A malformed expression raises :class:`txmq.errors.FilterExpressionError`. See ``docs/filters.md``.
"""

from __future__ import annotations

from txmq.errors import FilterExpressionError
from txmq.filter.sql92 import SQL92, TAG, SqlFilter, compile_sql92, is_tag_type
from txmq.filter.values import EvaluationError

__all__ = ["SQL92", "TAG", "EvaluationError", "FilterExpressionError", "SqlFilter", "compile_sql92", "is_tag_type"]
