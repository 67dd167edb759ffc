"""ACL on the gRPC door: the ``authorization`` metadata of RocketMQ 5 clients, checked by :mod:`txmq.acl`'s
decision against the same accounts and permissions as the 4.x door.

``authorization: MQv2-HMAC-SHA1 Credential=<accessKey>[/...], SignedHeaders=x-mq-date-time, Signature=<hex>`` where
the signature is the lowercase hex of HMAC-SHA1(secretKey, the ``x-mq-date-time`` header).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from txmq.acl.decision import AclState, Denial, decide_access

ALGORITHM = "MQv2-HMAC-SHA1"
DATE_TIME = "x-mq-date-time"


@dataclass(frozen=True, slots=True)
class Authorization:
    access_key: str
    signed_headers: tuple[str, ...]
    signature: str


def parse_authorization(text: str) -> Authorization | None:
    """The parts of an ``authorization`` value, or None when it is not RocketMQ 5's form."""
    algorithm, _, rest = text.strip().partition(" ")
    if algorithm != ALGORITHM:
        return None
    fields: dict[str, str] = {}
    for part in rest.split(","):
        name, sep, value = part.strip().partition("=")
        if sep:
            fields[name.strip()] = value.strip()
    credential = fields.get("Credential", "")
    return Authorization(
        access_key=credential.split("/", 1)[0],
        signed_headers=tuple(h.strip().lower() for h in fields.get("SignedHeaders", "").split(";") if h.strip()),
        signature=fields.get("Signature", "").lower(),
    )


def signature(secret_key: str, date_time: str) -> str:
    return hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1).hexdigest()


def check(
    state: AclState, peer_ip: str, metadata: Mapping[str, str], rpc: str, needed: Sequence[tuple[str, int]]
) -> Denial | None:
    """Allow (None) or deny one call; ``needed`` are the (resource, permission) pairs it touches."""
    auth = parse_authorization(metadata.get("authorization", ""))
    date_time = metadata.get(DATE_TIME, "")

    def signature_ok(secret_key: str) -> bool:
        if auth is None or not date_time:
            return False
        return hmac.compare_digest(signature(secret_key, date_time), auth.signature)

    return decide_access(
        state,
        peer_ip,
        auth.access_key if auth is not None else "",
        signature_ok,
        admin_only=False,
        what=rpc,
        resources=lambda: needed,
    )
