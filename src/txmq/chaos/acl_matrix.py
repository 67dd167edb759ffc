"""The ACL matrix: every combination of credential x whitelist x account permissions x request family, sent over
the wire to live brokers with ``aclEnable=true``, compared with the outcome RocketMQ 4.x's plain ACL rules give
(rocketmq-wire.md §5: the decision order of §5.2, the resources of §5.3, the permission check of §5.4).

The expected outcome is computed here from those rules, on their own, not by calling ``txmq.acl``: a shared bug
would otherwise agree with itself. Requests are signed here too, from §5.1.

* credentials: none (no AccessKey), an unknown key, the right key and secret, the right key with a wrong signature,
  and a replay (the exact bytes of an accepted right-key request sent again on a new connection). RocketMQ 4.x's
  plain ACL has no replay protection (no timestamp, no nonce in the signed content), so a replay is expected to be
  treated as the original: accepted where the original is. That is RocketMQ's rule, written down, not a virtue.
* whitelists: the peer (127.0.0.1) in globalWhiteRemoteAddresses, in the account's whiteRemoteAddress, or in none;
* accounts: admin (no explicit permissions), PUB, SUB and DENY on the topic and the group, and one with only
  defaults (defaultTopicPerm=PUB, defaultGroupPerm=SUB);
* request families: the codes of §5.3 with resources, the ones without, and the admin-only ones.

Counted: wrongly accepted, wrongly refused (both must be 0), and requests that got no answer.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import logging
import struct
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from txmq.chaos.report import PartResult
from txmq.protocol.frame import FrameDecoder, RemotingCommand, encode_frame
from txmq.testing import DevCluster

log = logging.getLogger("txmq.chaos")

TOPIC, GROUP, PGROUP = "AclChaosTopic", "AclChaosGroup", "AclChaosProducers"
RETRY = "%RETRY%" + GROUP
PUB, SUB, DENY = 4, 8, 1
CREDENTIALS = ("none", "unknown key", "right key", "wrong signature", "replayed")
WHITELISTS = ("global", "account", "none")


@dataclass(frozen=True)
class Profile:
    name: str
    admin: bool = False
    topic_perm: str | None = None
    group_perm: str | None = None
    default_topic: str | None = None
    default_group: str | None = None

    def yaml(self, access_key: str, secret: str, whitelisted: bool) -> str:
        lines = [f"  - accessKey: {access_key}", f"    secretKey: {secret}", f"    admin: {str(self.admin).lower()}"]
        if whitelisted:
            lines.append("    whiteRemoteAddress: 127.0.0.1")
        if self.default_topic:
            lines.append(f"    defaultTopicPerm: {self.default_topic}")
        if self.default_group:
            lines.append(f"    defaultGroupPerm: {self.default_group}")
        if self.topic_perm:
            lines += ["    topicPerms:", f"      - {TOPIC}={self.topic_perm}"]
        if self.group_perm:
            lines += ["    groupPerms:", f"      - {GROUP}={self.group_perm}"]
        return "\n".join(lines)


PROFILES = (
    Profile("admin", admin=True),
    Profile("PUB", topic_perm="PUB", group_perm="PUB"),
    Profile("SUB", topic_perm="SUB", group_perm="SUB"),
    Profile("DENY", topic_perm="DENY", group_perm="DENY"),
    Profile("default perm", default_topic="PUB", default_group="SUB"),
)


@dataclass(frozen=True)
class Family:
    """A request family: one request code, its header and body, and the resources §5.3 derives from it."""

    name: str
    code: int
    ext: dict[str, str]
    body: bytes = b""
    resources: tuple[tuple[str, int], ...] = ()
    admin_only: bool = False


def _families() -> list[Family]:
    now = str(int(time.time() * 1000))
    send_v1 = {
        "producerGroup": PGROUP,
        "topic": TOPIC,
        "defaultTopic": "TBW102",
        "defaultTopicQueueNums": "4",
        "queueId": "0",
        "sysFlag": "0",
        "bornTimestamp": now,
        "flag": "0",
        "properties": "",
        "reconsumeTimes": "0",
        "unitMode": "false",
        "batch": "false",
    }
    send_v2 = {
        "a": PGROUP,
        "b": TOPIC,
        "c": "TBW102",
        "d": "4",
        "e": "0",
        "f": "0",
        "g": now,
        "h": "0",
        "i": "",
        "j": "0",
        "k": "false",
        "m": "false",
    }
    heartbeat = {
        "clientID": "127.0.0.1@acl",
        "producerDataSet": [],
        "consumerDataSet": [
            {
                "groupName": GROUP,
                "consumeType": "CONSUME_PASSIVELY",
                "messageModel": "CLUSTERING",
                "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
                "unitMode": False,
                "subscriptionDataSet": [
                    {
                        "topic": TOPIC,
                        "subString": "*",
                        "tagsSet": [],
                        "codeSet": [],
                        "subVersion": 0,
                        "classFilterMode": False,
                        "expressionType": "TAG",
                    }
                ],
            }
        ],
    }
    batch_body = _batch_body([b"one", b"two"])
    return [
        Family("SEND_MESSAGE", 10, send_v1, b"acl", ((TOPIC, PUB),)),
        Family("SEND_MESSAGE_V2", 310, send_v2, b"acl", ((TOPIC, PUB),)),
        Family("SEND_BATCH_MESSAGE", 320, {**send_v1, "batch": "true"}, batch_body),
        Family(
            "PULL_MESSAGE",
            11,
            {
                "consumerGroup": GROUP,
                "topic": TOPIC,
                "queueId": "0",
                "queueOffset": "0",
                "maxMsgNums": "1",
                "sysFlag": "0",
                "commitOffset": "0",
                "suspendTimeoutMillis": "0",
                "subscription": "*",
                "subVersion": "0",
                "expressionType": "TAG",
            },
            b"",
            ((TOPIC, SUB), (RETRY, SUB)),
        ),
        Family(
            "QUERY_MESSAGE",
            12,
            {"topic": TOPIC, "key": "k", "maxNum": "1", "beginTimestamp": "0", "endTimestamp": now},
            b"",
            ((TOPIC, SUB),),
        ),
        Family("HEART_BEAT", 34, {}, orjson.dumps(heartbeat), ((RETRY, SUB), (TOPIC, SUB))),
        Family("UNREGISTER_CLIENT", 35, {"clientID": "127.0.0.1@acl", "consumerGroup": GROUP}, b"", ((RETRY, SUB),)),
        Family("GET_CONSUMER_LIST_BY_GROUP", 38, {"consumerGroup": GROUP}, b"", ((RETRY, SUB),)),
        Family(
            "UPDATE_CONSUMER_OFFSET",
            15,
            {"consumerGroup": GROUP, "topic": TOPIC, "queueId": "0", "commitOffset": "0"},
            b"",
            ((RETRY, SUB), (TOPIC, SUB)),
        ),
        Family("QUERY_CONSUMER_OFFSET", 14, {"consumerGroup": GROUP, "topic": TOPIC, "queueId": "0"}),
        Family(
            "CONSUMER_SEND_MSG_BACK",
            36,
            {
                "group": GROUP,
                "offset": "0",
                "delayLevel": "0",
                "originMsgId": "7F00000100002A9F0000000000000000",
                "originTopic": TOPIC,
                "unitMode": "false",
                "maxReconsumeTimes": "16",
            },
            b"",
            ((RETRY, SUB),),
        ),
        Family(
            "END_TRANSACTION",
            37,
            {
                "producerGroup": PGROUP,
                "tranStateTableOffset": "0",
                "commitLogOffset": "0",
                "commitOrRollback": "8",
                "fromTransactionCheck": "false",
                "msgId": "7F00000100002A9F0000000000000000",
                "transactionId": "7F00000100002A9F0000000000000000",
            },
        ),
        Family("GET_BROKER_RUNTIME_INFO", 28, {}),
        Family(
            "UPDATE_AND_CREATE_TOPIC",
            17,
            {
                "topic": "AclChaosAdminTopic",
                "defaultTopic": "TBW102",
                "readQueueNums": "1",
                "writeQueueNums": "1",
                "perm": "6",
                "topicFilterType": "SINGLE_TAG",
                "topicSysFlag": "0",
                "order": "false",
            },
            admin_only=True,
        ),
        Family("DELETE_SUBSCRIPTIONGROUP", 207, {"groupName": "AclChaosOtherGroup"}, admin_only=True),
    ]


def _batch_body(bodies: list[bytes]) -> bytes:
    """Inner records of a batch (total size, magic, body CRC, flag, body, properties)."""
    out = b""
    for body in bodies:
        props = b""
        size = 4 + 4 + 4 + 4 + 4 + len(body) + 2 + len(props)
        out += struct.pack(">iiii", size, 0, 0, 0) + struct.pack(">i", len(body)) + body
        out += struct.pack(">h", len(props)) + props
    return out


# -- the rules (rocketmq-wire.md §5), on their own ------------------------------------------------------------------


def _perm_bits(text: str | None) -> int:
    """§5.4: PUB, SUB, PUB|SUB, DENY; anything else or missing is DENY."""
    return {"PUB": PUB, "SUB": SUB, "PUB|SUB": PUB | SUB, "SUB|PUB": PUB | SUB, "DENY": DENY}.get(text or "", DENY)


def _owns(needed: int, owned: int) -> bool:
    if owned & DENY:
        return False
    return bool(needed & owned)


def expected_allowed(credential: str, whitelist: str, profile: Profile, family: Family) -> bool:
    """§5.2's decision order for one request."""
    if whitelist == "global":
        return True  # 1. the peer is globally whitelisted: no signature needed
    if credential in ("none", "unknown key"):
        return False  # 2. no AccessKey, 3. no account for it
    if whitelist == "account":
        return True  # 4. the account's whitelist skips the signature and every permission check
    if credential == "wrong signature":
        return False  # 5.
    # 7. (RocketMQ 4.x keeps no record of requests seen: a replay is the original request again.)
    if family.admin_only and not profile.admin:
        return False
    if profile.admin and not profile.topic_perm and not profile.group_perm:
        return True  # an admin with no explicit permissions passes every resource check
    for resource, needed in family.resources:
        if resource.startswith("%RETRY%"):
            owned = _perm_bits(profile.group_perm) if profile.group_perm else _perm_bits(profile.default_group)
        else:
            owned = _perm_bits(profile.topic_perm) if profile.topic_perm else _perm_bits(profile.default_topic)
        if not _owns(needed, owned):
            return False
    return True


def sign(ext: dict[str, str], body: bytes, secret: str) -> str:
    """§5.1: the values sorted by key, concatenated, UTF-8, then the body; HMAC-SHA1, Base64."""
    content = "".join(ext[k] for k in sorted(ext) if k != "Signature").encode() + body
    return base64.b64encode(hmac.new(secret.encode(), content, hashlib.sha1).digest()).decode()


# -- over the wire --------------------------------------------------------------------------------------------------


@dataclass
class Wire:
    """One request/response at a time over its own socket (a fresh connection per request keeps them apart)."""

    port: int
    decoder: FrameDecoder = field(default_factory=FrameDecoder)

    async def exchange(self, frame: bytes, timeout: float = 5.0) -> RemotingCommand | None:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            writer.write(frame)
            await writer.drain()
            decoder = FrameDecoder()
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    chunk = await asyncio.wait_for(reader.read(65536), deadline - time.monotonic())
                except TimeoutError:
                    return None
                if not chunk:
                    return None
                for cmd in decoder.feed(chunk):
                    if cmd.flag & 1:
                        return cmd
            return None
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


def _acl_yaml(global_whitelisted: bool) -> str:
    lines = [f"globalWhiteRemoteAddresses: [{'127.0.0.1' if global_whitelisted else '10.254.254.254'}]", "accounts:"]
    for i, profile in enumerate(PROFILES):
        for wl in (False, True):
            lines.append(profile.yaml(_key(i, wl), _secret(i, wl), wl))
    return "\n".join(lines) + "\n"


def _key(i: int, whitelisted: bool) -> str:
    return f"aclChaos{i}{'W' if whitelisted else 'N'}"


def _secret(i: int, whitelisted: bool) -> str:
    return f"secretChaos{i}{'W' if whitelisted else 'N'}"


def _refused(resp: RemotingCommand) -> bool:
    """An ACL denial: SYSTEM_ERROR with the ACL's remark (a handler's own SYSTEM_ERROR means the ACL let it in)."""
    return resp.code == 1 and (resp.remark or "").startswith("[TXMQ ACL]")


async def run_acl_matrix(work_dir: Path, progress: Any = None) -> PartResult:
    result = PartResult("acl")
    result.zero("wrongly_accepted", "wrongly_refused", "no_answer")
    started = time.monotonic()
    clusters: dict[str, DevCluster] = {}
    outcomes: Counter[str] = Counter()
    try:
        for name, global_wl in (("global", True), ("plain", False)):
            data = work_dir / name
            (data / "conf").mkdir(parents=True, exist_ok=True)
            (data / "conf" / "plain_acl.yml").write_text(_acl_yaml(global_wl))
            cluster = DevCluster(
                data,
                {
                    "aclEnable": "true",
                    "aclFile": str(data / "conf" / "plain_acl.yml"),
                    "mappedFileSizeCommitLog": str(4 * 1024 * 1024),
                },
            )
            clusters[name] = cluster.start(timeout=60)
        families = _families()
        cells = 0
        for whitelist in WHITELISTS:
            cluster = clusters["global" if whitelist == "global" else "plain"]
            wire = Wire(cluster.broker_port)
            for i, profile in enumerate(PROFILES):
                key, secret = _key(i, whitelist == "account"), _secret(i, whitelist == "account")
                for family in families:
                    right_frame: bytes | None = None
                    for credential in CREDENTIALS:
                        ext = dict(family.ext)
                        if credential == "replayed":
                            if right_frame is None:
                                continue
                            frame = right_frame
                        else:
                            if credential != "none":
                                ext["AccessKey"] = "aclChaosNobody" if credential == "unknown key" else key
                                used = secret if credential == "right key" else secret + "-wrong"
                                ext["Signature"] = sign(ext, family.body, used)
                            cmd = RemotingCommand.request(family.code, ext, family.body)
                            frame = encode_frame(cmd)
                            if credential == "right key":
                                right_frame = frame
                        resp = await wire.exchange(frame)
                        cells += 1
                        want = expected_allowed(credential, whitelist, profile, family)
                        where = f"{credential} / whitelist {whitelist} / {profile.name} / {family.name}"
                        if resp is None:
                            result.fail("no_answer", where)
                            continue
                        got = not _refused(resp)
                        outcomes[f"{'accepted' if got else 'refused'}"] += 1
                        if got and not want:
                            result.fail("wrongly_accepted", f"{where}: answered {resp.code} {resp.remark!r:.120}")
                        elif want and not got:
                            result.fail("wrongly_refused", f"{where}: {resp.remark!r:.160}")
            if progress:
                progress(f"acl: whitelist {whitelist} done ({cells} requests)")
        result.info["cells"] = cells
        result.info["families"] = len(families)
        result.info.update(outcomes)
        result.info["replay_protection"] = "none in RocketMQ 4.x plain ACL: replays expected to pass as the original"
    except Exception as exc:
        log.exception("ACL matrix stopped")
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        for cluster in clusters.values():
            cluster.stop()
        result.seconds = time.monotonic() - started
    return result
