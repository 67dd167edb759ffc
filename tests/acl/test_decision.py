"""The access decision: §5.2 order, §5.3 resources per request code, every §5.4 permission rule, strict mode."""

from __future__ import annotations

import textwrap

import orjson
import pytest

from txmq.acl import permission as perm
from txmq.acl.config import parse_acl_text
from txmq.acl.decision import AclState, compile_acl, decide, needs_admin, resources_for
from txmq.acl.signer import sign_request
from txmq.protocol.frame import RemotingCommand

ACL = textwrap.dedent(
    """
    globalWhiteRemoteAddresses:
      - 10.10.*.*
    accounts:
      - accessKey: userKey01
        secretKey: userSecret01
        defaultTopicPerm: DENY
        defaultGroupPerm: SUB
        topicPerms:
          - pubOnly=PUB
          - subOnly=SUB
          - both=PUB|SUB
          - denied=DENY
        groupPerms:
          - deniedGroup=DENY
          - pubGroup=PUB
      - accessKey: adminKey01
        secretKey: adminSecret1
        admin: true
      - accessKey: adminPerm01
        secretKey: adminSecret2
        admin: true
        defaultTopicPerm: SUB
        topicPerms:
          - pubOnly=PUB
      - accessKey: lanKey0001
        secretKey: lanSecret001
        whiteRemoteAddress: 192.168.1.*
      - accessKey: noDefaults1
        secretKey: noDefaults1
        topicPerms:
          - t1=PUB
    """
)
SECRETS = {
    "userKey01": "userSecret01",
    "adminKey01": "adminSecret1",
    "adminPerm01": "adminSecret2",
    "lanKey0001": "lanSecret001",
    "noDefaults1": "noDefaults1",
}
PEER = "127.0.0.1"


def state(strict: bool = False) -> AclState:
    return compile_acl([parse_acl_text(ACL, "plain_acl.yml")], strict=strict)[0]


def request(code: int, ext: dict[str, str], body: bytes = b"", *, key: str | None = "userKey01") -> RemotingCommand:
    cmd = RemotingCommand.request(code, dict(ext), body)
    if key is not None:
        sign_request(cmd, key, SECRETS.get(key, "wrong-secret"))
    return cmd


def send(topic: str, key: str | None = "userKey01", group: str = "PG") -> RemotingCommand:
    return request(310, {"a": group, "b": topic}, b"body", key=key)


def pull(topic: str, group: str, key: str = "userKey01") -> RemotingCommand:
    return request(11, {"consumerGroup": group, "topic": topic, "queueId": "0"}, key=key)


def reason(st: AclState, cmd: RemotingCommand, peer: str = PEER) -> str | None:
    denial = decide(st, peer, cmd)
    return None if denial is None else denial.reason


# -- §5.4 permission evaluation --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "bits"),
    [("PUB", 4), ("SUB", 8), ("PUB|SUB", 12), ("SUB|PUB", 12), ("DENY", 1), (" PUB ", 4), ("pub", 1), ("", 1)],
)
def test_perm_strings(text: str, bits: int) -> None:
    assert perm.parse_perm(text) == bits


def test_missing_perm_is_deny() -> None:
    assert perm.parse_perm(None) == perm.DENY


@pytest.mark.parametrize(
    ("needed", "owned", "ok"),
    [
        (perm.PUB, perm.PUB, True),
        (perm.PUB, perm.SUB, False),
        (perm.SUB, perm.PUB | perm.SUB, True),
        (perm.PUB, perm.DENY, False),
        (perm.PUB, perm.DENY | perm.PUB, False),  # DENY wins over everything
        (perm.ANY, perm.PUB, True),
        (perm.ANY, perm.SUB, True),
        (perm.ANY, perm.DENY, False),
        (perm.ANY, 0, False),
        (perm.PUB | perm.SUB, perm.SUB, True),  # any common bit
    ],
)
def test_check_perm(needed: int, owned: int, ok: bool) -> None:
    assert perm.check_perm(needed, owned) is ok


def test_topic_perms_explicit_then_default() -> None:
    st = state()
    assert reason(st, send("pubOnly")) is None
    assert reason(st, send("both")) is None
    assert reason(st, send("subOnly")) == (
        "No default permission for topic:subOnly (accessKey=userKey01 needs PUB, its topicPerms gives SUB)"
    )
    assert "No default permission for topic:denied" in reason(st, send("denied"))
    # Not listed: defaultTopicPerm DENY.
    assert "its defaultTopicPerm gives DENY" in reason(st, send("unlisted"))


def test_group_perms_are_keyed_by_retry_topic_and_fall_back_to_default_group_perm() -> None:
    st = state()
    assert reason(st, pull("subOnly", "anyGroup")) is None  # defaultGroupPerm SUB
    denial = reason(st, pull("subOnly", "deniedGroup"))
    assert denial is not None and denial.startswith("No default permission for group:deniedGroup")
    assert "No default permission for group:pubGroup" in reason(st, pull("subOnly", "pubGroup"))
    assert perm.RETRY_PREFIX + "deniedGroup" in st.accounts["userKey01"].resource_perms


def test_unset_defaults_mean_deny() -> None:
    st = state()
    assert reason(st, send("t1", key="noDefaults1")) is None
    assert "topic:other" in reason(st, send("other", key="noDefaults1"))
    assert "group:G" in reason(st, request(38, {"consumerGroup": "G"}, key="noDefaults1"))


def test_admin_without_perms_passes_every_resource_check() -> None:
    st = state()
    assert reason(st, send("anything", key="adminKey01")) is None
    assert reason(st, pull("anything", "anyGroup", key="adminKey01")) is None


def test_admin_with_explicit_perms_is_checked_against_them_and_the_defaults() -> None:
    st = state()
    assert reason(st, send("pubOnly", key="adminPerm01")) is None
    assert "topic:other" in reason(st, send("other", key="adminPerm01"))  # defaultTopicPerm SUB
    assert "group:G" in reason(st, pull("x", "G", key="adminPerm01"))  # defaultGroupPerm unset: DENY


# -- §5.2 decision order ------------------------------------------------------------------------------------------


def test_global_whitelist_needs_no_credentials() -> None:
    assert reason(state(), send("denied", key=None), peer="10.10.3.4") is None


def test_no_access_key() -> None:
    st = state()
    assert reason(st, send("pubOnly", key=None)).startswith("No accessKey is configured")
    # The C++ client sends AccessKey="" without credentials.
    assert reason(st, request(310, {"b": "pubOnly", "AccessKey": "", "Signature": ""}, key=None)).startswith(
        "No accessKey"
    )


def test_unknown_access_key() -> None:
    assert reason(state(), send("pubOnly", key="whoIsThis")) == "No acl config for whoIsThis"


def test_wrong_signature() -> None:
    cmd = send("pubOnly")
    cmd.body = b"tampered"
    assert reason(state(), cmd) == "Check signature failed for accessKey=userKey01"


def test_account_whitelist_skips_signature_and_permissions_in_rocketmq_mode() -> None:
    cmd = request(310, {"b": "anything", "AccessKey": "lanKey0001", "Signature": "bogus"}, key=None)
    assert reason(state(), cmd, peer="192.168.1.20") is None
    assert reason(state(), cmd, peer="192.168.2.20") == "Check signature failed for accessKey=lanKey0001"


def test_strict_mode_checks_the_signature_even_from_a_whitelisted_address() -> None:
    strict = state(strict=True)
    forged = request(310, {"b": "anything", "AccessKey": "lanKey0001", "Signature": "bogus"}, key=None)
    assert reason(strict, forged, peer="192.168.1.20") == "Check signature failed for accessKey=lanKey0001"
    signed = send("anything", key="lanKey0001")
    # Signed, but the account grants nothing (no perms, defaults DENY).
    assert "topic:anything" in reason(strict, signed, peer="192.168.1.20")
    # And outside its whitelist the account may not be used at all.
    assert "may not be used from 192.168.2.20" in reason(strict, signed, peer="192.168.2.20")


def test_strict_mode_checks_credentials_presented_from_the_global_whitelist() -> None:
    strict = state(strict=True)
    assert reason(strict, send("denied", key=None), peer="10.10.3.4") is None  # anonymous: still allowed
    assert "topic:denied" in reason(strict, send("denied"), peer="10.10.3.4")


def test_trace_topic_publish_is_always_allowed_to_a_valid_account() -> None:
    assert reason(state(), send("RMQ_SYS_TRACE_TOPIC", key="noDefaults1")) is None


@pytest.mark.parametrize("code", [17, 25, 215, 200, 207, 50, 51, 52, 53, 1300, 1320, 1399])
def test_admin_only_codes(code: int) -> None:
    assert needs_admin(code)
    st = state()
    assert reason(st, request(code, {"topic": "x"})) == (
        f"Need admin permission for request code={code}, but accessKey=userKey01 is not"
    )
    assert reason(st, request(code, {"topic": "x"}, key="adminKey01")) is None


@pytest.mark.parametrize("code", [10, 11, 14, 28, 34, 105, 310, 1299])
def test_ordinary_codes_are_not_admin_only(code: int) -> None:
    assert not needs_admin(code)


# -- §5.3 resources per request code ------------------------------------------------------------------------------


def _heartbeat_body() -> bytes:
    return orjson.dumps(
        {
            "clientID": "c1",
            "producerDataSet": [{"groupName": "PG"}],
            "consumerDataSet": [
                {"groupName": "CG", "subscriptionDataSet": [{"topic": "T1"}, {"topic": "%RETRY%CG"}]},
            ],
        }
    )


@pytest.mark.parametrize(
    ("code", "ext", "body", "expected"),
    [
        (10, {"topic": "T", "producerGroup": "PG"}, b"", [("T", perm.PUB)]),
        (10, {"topic": "%RETRY%G", "group": "G"}, b"", [("%RETRY%G", perm.SUB)]),
        (10, {"topic": "%RETRY%G"}, b"", []),  # V1 has no "group": nothing to check but the signature
        (310, {"a": "PG", "b": "T"}, b"", [("T", perm.PUB)]),
        (310, {"a": "G", "b": "%RETRY%G"}, b"", [("%RETRY%G", perm.SUB)]),
        (320, {"a": "PG", "b": "T"}, b"", [("T", perm.PUB)]),  # txmq: batches need PUB too
        (36, {"group": "G", "offset": "1"}, b"", [("%RETRY%G", perm.SUB)]),
        (11, {"topic": "T", "consumerGroup": "G"}, b"", [("T", perm.SUB), ("%RETRY%G", perm.SUB)]),
        (12, {"topic": "T", "key": "k"}, b"", [("T", perm.SUB)]),
        (34, {}, _heartbeat_body(), [("%RETRY%CG", perm.SUB), ("T1", perm.SUB), ("%RETRY%CG", perm.SUB)]),
        (35, {"clientID": "c", "consumerGroup": "G"}, b"", [("%RETRY%G", perm.SUB)]),
        (35, {"clientID": "c", "producerGroup": "PG"}, b"", []),
        (38, {"consumerGroup": "G"}, b"", [("%RETRY%G", perm.SUB)]),
        (15, {"consumerGroup": "G", "topic": "T"}, b"", [("%RETRY%G", perm.SUB), ("T", perm.SUB)]),
        (14, {"consumerGroup": "G", "topic": "T"}, b"", []),
        (37, {"producerGroup": "PG"}, b"", []),
        (105, {"topic": "T"}, b"", []),
    ],
)
def test_resources_per_code(code: int, ext: dict[str, str], body: bytes, expected: list[tuple[str, int]]) -> None:
    assert resources_for(RemotingCommand.request(code, ext, body)) == expected


def test_heartbeat_permissions_are_checked() -> None:
    st = state()
    hb = request(34, {}, _heartbeat_body())
    expected = "No default permission for topic:T1 (accessKey=userKey01 needs SUB, its defaultTopicPerm gives DENY)"
    assert reason(st, hb) == expected


def test_unreadable_heartbeat_is_refused_not_crashed() -> None:
    assert "heartbeat body cannot be read" in reason(state(), request(34, {}, b"{not json"))


def test_signature_only_codes_pass_with_a_valid_signature() -> None:
    st = state()
    assert reason(st, request(14, {"consumerGroup": "deniedGroup", "topic": "denied"})) is None
    assert reason(st, request(105, {"topic": "denied"})) is None
