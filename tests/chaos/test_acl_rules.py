"""The ACL matrix's expected outcomes (written from rocketmq-wire.md §5) on cells checked by hand, so that the
matrix compares the broker with RocketMQ's rules and not with itself."""

from __future__ import annotations

import pytest

from txmq.chaos.acl_matrix import PROFILES, _families, expected_allowed, sign

P = {p.name: p for p in PROFILES}
F = {f.name: f for f in _families()}


@pytest.mark.parametrize(
    ("credential", "whitelist", "profile", "family", "allowed"),
    [
        ("none", "global", "DENY", "UPDATE_AND_CREATE_TOPIC", True),  # 1. global whitelist: anything
        ("none", "account", "admin", "GET_BROKER_RUNTIME_INFO", False),  # 2. no AccessKey
        ("unknown key", "account", "admin", "SEND_MESSAGE", False),  # 3. no such account
        ("wrong signature", "account", "DENY", "PULL_MESSAGE", True),  # 4. account whitelist skips all checks
        ("wrong signature", "none", "admin", "GET_BROKER_RUNTIME_INFO", False),  # 5.
        ("right key", "none", "PUB", "SEND_MESSAGE_V2", True),
        ("right key", "none", "SUB", "SEND_MESSAGE", False),
        ("right key", "none", "SUB", "PULL_MESSAGE", True),
        ("right key", "none", "PUB", "PULL_MESSAGE", False),
        ("right key", "none", "DENY", "SEND_BATCH_MESSAGE", True),  # no resources: signature only
        ("right key", "none", "DENY", "QUERY_CONSUMER_OFFSET", True),
        ("right key", "none", "PUB", "UPDATE_AND_CREATE_TOPIC", False),  # admin-only
        ("right key", "none", "admin", "DELETE_SUBSCRIPTIONGROUP", True),
        ("right key", "none", "default perm", "SEND_MESSAGE", True),  # defaultTopicPerm=PUB
        ("right key", "none", "default perm", "HEART_BEAT", False),  # the topic needs SUB
        ("right key", "none", "default perm", "GET_CONSUMER_LIST_BY_GROUP", True),  # defaultGroupPerm=SUB
        ("replayed", "none", "PUB", "SEND_MESSAGE", True),  # RocketMQ 4.x has no replay protection
    ],
)
def test_expected_outcomes(credential: str, whitelist: str, profile: str, family: str, allowed: bool) -> None:
    assert expected_allowed(credential, whitelist, P[profile], F[family]) is allowed


def test_the_signature_follows_section_5_1() -> None:
    # values sorted by key (a, b), no separators, then the body; HMAC-SHA1 with the secret, Base64
    import base64
    import hashlib
    import hmac

    want = base64.b64encode(hmac.new(b"secret", b"12body", hashlib.sha1).digest()).decode()
    assert sign({"b": "2", "a": "1", "Signature": "old"}, b"body", "secret") == want
