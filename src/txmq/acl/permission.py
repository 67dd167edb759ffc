"""Permission bits and RocketMQ's permission check (rocketmq-wire.md §5.4)."""

from __future__ import annotations

from txmq.protocol.topics import RETRY_GROUP_TOPIC_PREFIX as RETRY_PREFIX

DENY = 1
ANY = 2
PUB = 4
SUB = 8

# The strings plain_acl.yml may use; RocketMQ silently reads anything else as DENY, txmq rejects it instead.
PERM_STRINGS: dict[str, int] = {"DENY": DENY, "PUB": PUB, "SUB": SUB, "PUB|SUB": PUB | SUB, "SUB|PUB": PUB | SUB}


def parse_perm(text: str | None) -> int:
    """RocketMQ's reading: a known string gives its bits; anything else (or nothing) is DENY."""
    if text is None:
        return DENY
    return PERM_STRINGS.get(text.strip(), DENY)


def is_valid_perm(text: str) -> bool:
    return text.strip() in PERM_STRINGS


def perm_name(bits: int) -> str:
    if bits & DENY:
        return "DENY"
    names = [n for n, b in (("PUB", PUB), ("SUB", SUB)) if bits & b]
    return "|".join(names) or "DENY"


def check_perm(needed: int, owned: int) -> bool:
    """Whether ``owned`` grants ``needed``: DENY wins, ANY wants PUB or SUB, else any common bit."""
    if owned & DENY:
        return False
    if needed & ANY:
        return bool(owned & (PUB | SUB))
    return bool(needed & owned)


def is_group_resource(resource: str) -> bool:
    """Groups are stored as their retry topic, ``%RETRY%<group>``."""
    return resource.startswith(RETRY_PREFIX)


def describe_resource(resource: str) -> str:
    """``topic:T`` or ``group:G``, RocketMQ's wording in denials."""
    if is_group_resource(resource):
        return f"group:{resource[len(RETRY_PREFIX) :]}"
    return f"topic:{resource}"
