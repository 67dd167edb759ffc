"""Subscriptions: tags (``"TagA || TagB"``) or SQL92 selectors, and the SubscriptionData JSON heartbeats carry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from txmq.errors import MQClientError
from txmq.protocol.record import java_string_hash

SUB_ALL = "*"


@dataclass(frozen=True, slots=True)
class Subscription:
    topic: str
    expression: str = SUB_ALL
    tags: frozenset[str] = frozenset()
    sub_version: int = 0
    expression_type: str = "TAG"

    @classmethod
    def parse(cls, topic: str, expression: str | None, sub_version: int, expression_type: str = "TAG") -> Subscription:
        """``*`` or blank subscribes to everything; otherwise tags separated by ``||``. With ``SQL92`` the
        expression is a selector over message properties that the broker evaluates (``docs/filters.md``)."""
        if expression_type == "SQL92":
            if not (expression or "").strip():
                raise MQClientError("an SQL92 subscription needs an expression, such as a > 5")
            return cls(topic, expression or "", frozenset(), sub_version, expression_type)
        if expression_type != "TAG":
            raise MQClientError(f"subscriptions are TAG or SQL92, not {expression_type}")
        expr = (expression or "").strip()
        if not expr or expr == SUB_ALL:
            return cls(topic, SUB_ALL, frozenset(), sub_version)
        tags = frozenset(t.strip() for t in expr.split("||") if t.strip())
        if not tags:
            return cls(topic, SUB_ALL, frozenset(), sub_version)
        return cls(topic, expr, tags, sub_version)

    @property
    def matches_all(self) -> bool:
        return not self.tags

    def matches(self, tag: str | None) -> bool:
        return not self.tags or (tag is not None and tag in self.tags)

    def to_json(self) -> dict[str, Any]:
        tags = sorted(self.tags)
        return {
            "topic": self.topic,
            "subString": self.expression,
            "tagsSet": tags,
            "codeSet": [java_string_hash(t) for t in tags],
            "subVersion": self.sub_version,
            "expressionType": self.expression_type,
            "classFilterMode": False,
        }
