"""Request signatures (rocketmq-wire.md §5.1, Appendix A), shared by the broker and txmq's client.

content = the values of every extField except ``Signature``, ordered by key (Java's String order), concatenated
with no separator, UTF-8, followed by the raw body; signature = Base64(HMAC-SHA1(secretKey, content)). The C++
client's ``OnsChannel`` is just another field and is signed like the rest.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Iterable, Mapping

from txmq.protocol.frame import RemotingCommand, _stringify_ext

ACCESS_KEY = "AccessKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"
ONS_CHANNEL = "OnsChannel"
UNIQUE_KEY_QUERY = "_UNIQUE_KEY_QUERY"


def _java_order(key: str) -> bytes:
    # Java's String.compareTo compares UTF-16 code units; this differs from Python's order only beyond the BMP.
    return key.encode("utf-16-be")


def signing_content(ext: Mapping[str, str], body: bytes = b"", *, exclude: Iterable[str] = (SIGNATURE,)) -> bytes:
    """The bytes that get signed: sorted values (without the excluded keys), then the body."""
    skip = set(exclude)
    keys = sorted((k for k in ext if k not in skip), key=_java_order)
    text = "".join(ext[k] for k in keys)
    return text.encode("utf-8") + bytes(body)


def calculate_signature(content: bytes, secret_key: str) -> str:
    """Base64 (standard alphabet, padded) of HMAC-SHA1 keyed with the UTF-8 secret key."""
    digest = hmac.new(secret_key.encode("utf-8"), content, hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


def sign_request(cmd: RemotingCommand, access_key: str, secret_key: str) -> None:
    """Add ``AccessKey`` and ``Signature`` to ``cmd.ext_fields`` in place (the client's RPC hook).

    Values are first turned into the strings the frame encoder will send, so that the signature covers exactly
    what goes on the wire.
    """
    ext = dict(_stringify_ext(cmd.ext_fields))  # a copy: callers may share one header dict between requests
    ext.pop(SIGNATURE, None)
    ext[ACCESS_KEY] = access_key
    ext[SIGNATURE] = calculate_signature(signing_content(ext, cmd.body), secret_key)
    cmd.ext_fields = ext


def verify_signature(ext: Mapping[str, str], body: bytes, secret_key: str) -> bool:
    """The broker's check. ``_UNIQUE_KEY_QUERY`` is left out as RocketMQ's broker does, but a signature that
    covers it (what Java clients send for QUERY_MESSAGE, apache/rocketmq#5310) is accepted too."""
    given = ext.get(SIGNATURE)
    if not given:
        return False
    expected = calculate_signature(signing_content(ext, body, exclude=(SIGNATURE, UNIQUE_KEY_QUERY)), secret_key)
    if hmac.compare_digest(expected, given):
        return True
    if UNIQUE_KEY_QUERY in ext:
        expected = calculate_signature(signing_content(ext, body), secret_key)
        return hmac.compare_digest(expected, given)
    return False
