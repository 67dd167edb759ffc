"""The request signer against signatures real clients produce (rocketmq-wire.md §5.1 and Appendix A).

The two C++ frames below were captured from the official C++ client (PyPI `rocketmq` 0.4.4) with
``set_session_credentials("AccessKeyCpp", "SecretKeyCpp123", "ALIYUN")``. Expected signatures are recomputed here
with hmac/hashlib/base64 over content strings written out by hand, not with the code under test.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from txmq.acl.signer import calculate_signature, sign_request, signing_content, verify_signature
from txmq.protocol.frame import RemotingCommand, decode_frame, encode_frame

CPP_SECRET = "SecretKeyCpp123"

# GET_ROUTEINFO_BY_TOPIC (105) to the name server.
CPP_ROUTE_FRAME = bytes.fromhex(
    "000000cc000000c87b22636f6465223a3130352c226578744669656c6473223a7b224163636573734b6579223a224163636573734b6579"
    "437070222c224f6e734368616e6e656c223a22414c4959554e222c225369676e6174757265223a2241344264626e51676338316878596379"
    "477867506354505075376b3d222c22746f706963223a2241636c546f706963227d2c22666c6167223a302c226c616e6775616765223a2243"
    "5050222c226f7061717565223a302c2272656d61726b223a22222c2276657273696f6e223a36337d0a"
)
# SEND_MESSAGE (10) with the long header names, JSON numbers among the values, and the body "hello-0".
CPP_SEND_FRAME = bytes.fromhex(
    "000002170000020c7b22636f6465223a31302c226578744669656c6473223a7b224163636573734b6579223a224163636573734b65794370"
    "70222c224f6e734368616e6e656c223a22414c4959554e222c225369676e6174757265223a22746d436a534a2f77374b7453374b3667617a"
    "4f68385a61426177513d222c226261746368223a2230222c22626f726e54696d657374616d70223a2231373935323237363430323539222c"
    "2264656661756c74546f706963223a22544257313032222c2264656661756c74546f70696351756575654e756d73223a342c22666c616722"
    "3a302c2270726f647563657247726f7570223a2274786d715f6370705f70726f6475636572222c2270726f70657274696573223a224b4559"
    "535c75303030316b315c7530303032544147535c7530303031546167415c7530303032554e49515f4b45595c753030303130313030303037"
    "463030303042363143303030303433343444443643303130305c7530303032574149545c7530303031747275655c7530303032222c227175"
    "6575654964223a302c227265636f6e73756d6554696d6573223a2230222c22737973466c6167223a302c22746f706963223a2241636c546f"
    "706963222c22756e69744d6f6465223a2230227d2c22666c6167223a302c226c616e6775616765223a22435050222c226f7061717565223a"
    "322c2272656d61726b223a22222c2276657273696f6e223a36337d0a68656c6c6f2d30"
)


def hmac_b64(secret: str, content: bytes) -> str:
    return base64.b64encode(hmac.new(secret.encode(), content, hashlib.sha1).digest()).decode()


def test_captured_cpp_route_request_verifies() -> None:
    cmd = decode_frame(CPP_ROUTE_FRAME)
    assert cmd.ext_fields["Signature"] == "A4BdbnQgc81hxYcyGxgPcTPPu7k="
    # Sorted keys: AccessKey, OnsChannel, (Signature skipped), topic.
    assert hmac_b64(CPP_SECRET, b"AccessKeyCppALIYUNAclTopic") == cmd.ext_fields["Signature"]
    assert verify_signature(cmd.ext_fields, cmd.body, CPP_SECRET)
    assert not verify_signature(cmd.ext_fields, cmd.body, "SecretKeyCpp124")


def test_captured_cpp_send_with_numbers_and_body_verifies() -> None:
    cmd = decode_frame(CPP_SEND_FRAME)
    ext = cmd.ext_fields
    # The C++ client wrote these as JSON numbers; the codec turned them into Java's strings.
    assert (ext["defaultTopicQueueNums"], ext["queueId"], ext["sysFlag"], ext["flag"]) == ("4", "0", "0", "0")
    assert cmd.body == b"hello-0"
    properties = "KEYS\x01k1\x02TAGS\x01TagA\x02UNIQ_KEY\x010100007F0000B61C00004344DD6C0100\x02WAIT\x01true\x02"
    content = (
        (
            "AccessKeyCpp"  # AccessKey
            "ALIYUN"  # OnsChannel
            "0"  # batch
            "1795227640259"  # bornTimestamp
            "TBW102"  # defaultTopic
            "4"  # defaultTopicQueueNums (a JSON number on the wire)
            "0"  # flag
            "txmq_cpp_producer" + properties + "0"  # producerGroup  # queueId
            "0"  # reconsumeTimes
            "0"  # sysFlag
            "AclTopic"  # topic
            "0"  # unitMode
        ).encode()
        + b"hello-0"
    )
    assert hmac_b64(CPP_SECRET, content) == ext["Signature"] == "tmCjSJ/w7KtS7K6gazOh8ZaBawQ="
    assert signing_content(ext, cmd.body) == content
    assert verify_signature(ext, cmd.body, CPP_SECRET)
    # Any change to a signed value or to the body breaks it.
    assert not verify_signature(ext, b"hello-1", CPP_SECRET)
    assert not verify_signature({**ext, "queueId": "1"}, cmd.body, CPP_SECRET)
    assert not verify_signature({**ext, "OnsChannel": "LOCAL"}, cmd.body, CPP_SECRET)


def test_java_style_v2_send_is_signed_like_a_java_client() -> None:
    ext = {
        "a": "PG",
        "b": "TopicTest",
        "c": "TBW102",
        "d": "4",
        "e": "3",
        "f": "0",
        "g": "1700000000000",
        "h": "0",
        "i": "TAGS\x01TagA\x02",
        "j": "0",
        "k": "false",
        "m": "false",
    }
    body = "héllo".encode()
    cmd = RemotingCommand.request(310, dict(ext), body)
    sign_request(cmd, "JavaAccessKey", "JavaSecret123")
    # Uppercase sorts first: AccessKey, then a..m.
    content = "JavaAccessKeyPGTopicTestTBW10243017000000000000TAGS\x01TagA\x020"
    content += "falsefalse"
    expected = hmac_b64("JavaSecret123", content.encode("utf-8") + body)
    assert cmd.ext_fields["AccessKey"] == "JavaAccessKey"
    assert cmd.ext_fields["Signature"] == expected
    # What goes on the wire still verifies after a round trip through the codec.
    received = decode_frame(encode_frame(cmd))
    assert verify_signature(received.ext_fields, received.body, "JavaSecret123")


def test_signer_stringifies_values_as_the_encoder_will() -> None:
    cmd = RemotingCommand.request(11, {"queueId": 3, "commitOffset": 10, "suspend": True, "topic": "T"})
    sign_request(cmd, "ak123456", "sk123456")
    content = b"ak123456103trueT"  # AccessKey, commitOffset, queueId, suspend, topic
    assert cmd.ext_fields["Signature"] == hmac_b64("sk123456", content)
    assert cmd.ext_fields["queueId"] == "3"


def test_resigning_replaces_the_old_signature() -> None:
    cmd = RemotingCommand.request(34, {"x": "1"}, b"{}")
    sign_request(cmd, "ak123456", "sk123456")
    first = cmd.ext_fields["Signature"]
    cmd.body = b'{"a":1}'
    sign_request(cmd, "ak123456", "sk123456")
    assert cmd.ext_fields["Signature"] != first
    assert verify_signature(cmd.ext_fields, cmd.body, "sk123456")


@pytest.mark.parametrize("include_unique_key_query", [True, False])
def test_query_message_signed_either_way_is_accepted(include_unique_key_query: bool) -> None:
    ext = {"topic": "T", "key": "k", "maxNum": "32", "beginTimestamp": "0", "endTimestamp": "9"}
    ext["_UNIQUE_KEY_QUERY"] = "true"
    ext["AccessKey"] = "ak123456"
    keys = sorted(k for k in ext if include_unique_key_query or k != "_UNIQUE_KEY_QUERY")
    ext["Signature"] = hmac_b64("sk123456", "".join(ext[k] for k in keys).encode())
    assert verify_signature(ext, b"", "sk123456")


def test_missing_or_empty_signature_fails() -> None:
    assert not verify_signature({"AccessKey": "ak123456", "topic": "T"}, b"", "sk123456")
    assert not verify_signature({"AccessKey": "ak123456", "Signature": ""}, b"", "sk123456")


def test_calculate_signature_matches_the_reference() -> None:
    assert calculate_signature(b"abc", "secret") == hmac_b64("secret", b"abc")
