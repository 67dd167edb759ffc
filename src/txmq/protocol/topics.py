"""System topic names, the retry/DLQ prefixes and topic permission bits: the one place every package takes them from.

Values are RocketMQ 4.x's (``TopicValidator``, ``MixAll``, ``PermName``; wire reference §6 and §7).
"""

from __future__ import annotations

import re

# -- topics the broker creates or uses itself -------------------------------------------------------------------
AUTO_CREATE_TOPIC_KEY = "TBW102"  # the template a send to an unknown topic borrows when autoCreateTopicEnable
SELF_TEST_TOPIC = "SELF_TEST_TOPIC"
BENCHMARK_TOPIC = "BenchmarkTest"
OFFSET_MOVED_EVENT = "OFFSET_MOVED_EVENT"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"  # delay levels: queue = level - 1
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
TRANS_CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
SYSTEM_TOPIC_PREFIX = "rmq_sys_"  # compared case-insensitively

# The consumer group whose offsets in the half and op queues record the transaction service's progress.
SYS_TRANS_GROUP = "CID_RMQ_SYS_TRANS"

RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"

# Clients may not send to these directly (NO_PERMISSION, wire §2.3 step 2).
NOT_ALLOWED_SEND_TOPICS = frozenset(
    {
        SCHEDULE_TOPIC,
        TRANS_HALF_TOPIC,
        TRANS_OP_HALF_TOPIC,
        TRANS_CHECK_MAX_TIME_TOPIC,
        SELF_TEST_TOPIC,
        OFFSET_MOVED_EVENT,
    }
)

# -- topic permission bits (PermName) ---------------------------------------------------------------------------
PERM_PRIORITY = 8
PERM_READ = 4
PERM_WRITE = 2
PERM_INHERIT = 1

TOPIC_NAME_RE = re.compile(r"^[%|a-zA-Z0-9_-]+$")
MAX_TOPIC_LENGTH = 127


def reply_topic(cluster: str) -> str:
    """Where request-reply's replies go (``<cluster>_REPLY_TOPIC``): every broker of ``cluster`` has it."""
    return f"{cluster}_REPLY_TOPIC"


def retry_topic(group: str) -> str:
    """``%RETRY%<group>``: where a consumer group's rejected messages come back."""
    return RETRY_GROUP_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    """``%DLQ%<group>``: where a consumer group's messages go after ``maxReconsumeTimes``."""
    return DLQ_GROUP_TOPIC_PREFIX + group


def is_retry_topic(topic: str) -> bool:
    return topic.startswith(RETRY_GROUP_TOPIC_PREFIX)


def is_dlq_topic(topic: str) -> bool:
    return topic.startswith(DLQ_GROUP_TOPIC_PREFIX)


def group_of(topic: str) -> str | None:
    """The consumer group of a ``%RETRY%`` or ``%DLQ%`` topic, None for any other topic."""
    for prefix in (RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX):
        if topic.startswith(prefix):
            return topic[len(prefix) :]
    return None


def is_readable(perm: int) -> bool:
    return bool(perm & PERM_READ)


def is_writable(perm: int) -> bool:
    return bool(perm & PERM_WRITE)


def is_inherited(perm: int) -> bool:
    return bool(perm & PERM_INHERIT)
