"""Apache RocketMQ as the reference (issue 24): the same cluster settings, scenarios and raw requests against txmq
and the real broker, and a report of what each did.

``TXMQ_REFERENCE`` picks what runs: ``quick`` (the default: transactions and the bad-request codes), ``full`` (every
scenario: also retries and DLQ, orderly, delay, filters), ``off`` (none, for a machine without Maven Central).
``TXMQ_REFERENCE_BROKERS`` (default ``txmq,rocketmq``) narrows the brokers, e.g. to run the scenarios against
RocketMQ alone; the comparison needs both.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from txmq.acl.signer import sign_request
from txmq.protocol.frame import FrameDecoder, RemotingCommand, encode_frame

ROOT = Path(__file__).resolve().parents[2]
sys.path.append(str(ROOT / "bench" / "peers" / "rocketmq"))

import apache_rocketmq  # noqa: E402

from cluster_harness import DevCluster  # noqa: E402

MODE = os.environ.get("TXMQ_REFERENCE", "quick")
BROKERS = tuple(os.environ.get("TXMQ_REFERENCE_BROKERS", "txmq,rocketmq").split(","))
REPORT = ROOT / "bench" / "out" / "reference-diff.md"

# One configuration for both brokers, in RocketMQ's key names: checks after 1 s and every 1 s, 1 s delay levels,
# auto-create off (the bad-request scenario needs it; scenarios create their topics first), SQL92 on.
CONF = {
    "messageDelayLevel": "1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s",
    "transactionTimeOut": "1000",
    "transactionCheckInterval": "1000",
    "mappedFileSizeCommitLog": str(16 * 1024 * 1024),
    "autoCreateTopicEnable": "false",
    "enablePropertyFilter": "true",
}

AK, SK = "refUser01", "refSecret01"
ACL_TOPIC = "RefAclTopic"
# plain_acl.yml, RocketMQ 4.x's format: txmq reads it; RocketMQ 5.5 has only ACL 2.0 and migrates it at start.
PLAIN_ACL = f"""\
globalWhiteRemoteAddresses: []
accounts:
  - accessKey: {AK}
    secretKey: {SK}
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - {ACL_TOPIC}=PUB|SUB
"""
# ACL 2.0 in RocketMQ 5.5: authentication and authorization, users and policies migrated from plain_acl.yml.
ROCKETMQ_ACL_CONF = {
    "authenticationEnabled": "true",
    "authorizationEnabled": "true",
    "authenticationProvider": "org.apache.rocketmq.auth.authentication.provider.DefaultAuthenticationProvider",
    "authorizationProvider": "org.apache.rocketmq.auth.authorization.provider.DefaultAuthorizationProvider",
    "authenticationMetadataProvider": (
        "org.apache.rocketmq.auth.authentication.provider.LocalAuthenticationMetadataProvider"
    ),
    "authorizationMetadataProvider": (
        "org.apache.rocketmq.auth.authorization.provider.LocalAuthorizationMetadataProvider"
    ),
    "migrateAuthFromV1Enabled": "true",
    "initAuthenticationUser": '{"username":"refAdmin","password":"refAdmin01","userType":"Super"}',
    "innerClientAuthenticationCredentials": '{"accessKey":"refAdmin","secretKey":"refAdmin01"}',
}


def start(broker: str, data_dir: Path, conf: dict[str, str] | None = None, acl: bool = False) -> Any:
    """A running cluster of ``broker`` ("txmq" or "rocketmq") with CONF and ``conf``; ``acl`` switches ACL on."""
    conf = {**CONF, **(conf or {})}
    if broker == "txmq":
        if acl:
            (data_dir / "conf").mkdir(parents=True, exist_ok=True)
            (data_dir / "conf" / "plain_acl.yml").write_text(PLAIN_ACL)
            conf["aclEnable"] = "true"
        return DevCluster(data_dir, conf).start()
    cluster = apache_rocketmq.RocketMQCluster(data_dir, conf, flush="SYNC_FLUSH")
    if acl:
        (cluster.home / "conf").mkdir(parents=True, exist_ok=True)
        (cluster.home / "conf" / "plain_acl.yml").write_text(PLAIN_ACL)
        cluster.conf.update(ROCKETMQ_ACL_CONF)
        cluster.conf["authConfigPath"] = str(data_dir / "auth")
    return cluster.start()


def stop(cluster: Any) -> None:
    if isinstance(cluster, DevCluster):
        cluster.stop()
    else:
        cluster.stop(timeout=5)


# -- raw requests --------------------------------------------------------------------------------------------------


def request(addr: str, code: int, ext: dict[str, str], body: bytes = b"", sign: tuple[str, str] | None = None) -> dict:
    """One request on a fresh connection; its response's code and remark (or how the connection ended)."""
    cmd = RemotingCommand.request(code, ext, body)
    if sign:
        sign_request(cmd, *sign)
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(encode_frame(cmd))
        decoder = FrameDecoder()
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    return {"code": None, "remark": "connection closed"}
                frames = decoder.feed(chunk)
                if frames:
                    return {"code": frames[0].code, "remark": frames[0].remark, "ext": frames[0].ext_fields}
        except TimeoutError:
            return {"code": None, "remark": "no response in 10 s"}


def send_ext(topic: str, group: str = "RefPG", properties: str = "", sys_flag: int = 0) -> dict[str, str]:
    """SEND_MESSAGE (10) headers, long names, as a 4.x client sends them."""
    return {
        "producerGroup": group,
        "topic": topic,
        "defaultTopic": "TBW102",
        "defaultTopicQueueNums": "4",
        "queueId": "0",
        "sysFlag": str(sys_flag),
        "bornTimestamp": str(int(time.time() * 1000)),
        "flag": "0",
        "properties": properties or "UNIQ_KEY\x01ref0001\x02WAIT\x01true\x02",
        "reconsumeTimes": "0",
        "unitMode": "false",
        "batch": "false",
    }


def half_ext(topic: str, uniq_key: str, group: str = "RefTxPG") -> dict[str, str]:
    """SEND_MESSAGE of a half message: TRAN_MSG and PGROUP set, sysFlag TRANSACTION_PREPARED_TYPE (4)."""
    properties = f"TRAN_MSG\x01true\x02PGROUP\x01{group}\x02UNIQ_KEY\x01{uniq_key}\x02WAIT\x01true\x02"
    return send_ext(topic, group, properties, sys_flag=4)


def commit_log_offset(send_answer: dict) -> int:
    """The commit-log offset in a SEND_MESSAGE answer's offsetMsgId (address, then the offset: 8 bytes, hex)."""
    return int(send_answer["ext"]["msgId"][-16:], 16)


COMMIT, ROLLBACK = 8, 12  # TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE


def end_transaction_ext(
    commit_log_offset: int, queue_offset: int = 0, decision: int = COMMIT, transaction_id: str = "ref-none"
) -> dict[str, str]:
    """END_TRANSACTION (37) for a half message said to be at ``commit_log_offset``."""
    return {
        "producerGroup": "RefTxPG",
        "tranStateTableOffset": str(queue_offset),
        "commitLogOffset": str(commit_log_offset),
        "commitOrRollback": str(decision),
        "fromTransactionCheck": "false",
        "msgId": transaction_id,
        "transactionId": transaction_id,
    }


def check_client_config_body(topic: str, group: str, sql: str) -> bytes:
    subscription = {
        "topic": topic,
        "subString": sql,
        "expressionType": "SQL92",
        "classFilterMode": False,
        "tagsSet": [],
        "codeSet": [],
        "subVersion": int(time.time() * 1000),
    }
    return json.dumps({"clientId": "127.0.0.1@ref", "group": group, "subscriptionData": subscription}).encode()


# -- the report -------------------------------------------------------------------------------------------------------


def record(scenario: str, seen: dict[str, Any], differences: dict[str, str]) -> str:
    """Append one scenario's side-by-side to REPORT and return it: per key, what each broker did, and, where they
    differ, the documented reason (docs/compat.md, "Differences from Apache RocketMQ") or UNEXPLAINED."""
    keys = sorted({k for observed in seen.values() for k in observed})
    lines = [f"### {scenario}", "", "| | " + " | ".join(seen) + " | |", "|---" * (len(seen) + 2) + "|"]
    for key in keys:
        values = [seen[b].get(key) for b in seen]
        same = all(v == values[0] for v in values)
        note = "" if same or len(values) < 2 else differences.get(key, "UNEXPLAINED")
        cells = " | ".join(_cell(v) for v in values)
        lines.append(f"| {key} | {cells} | {note} |")
    text = "\n".join(lines) + "\n\n"
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    with REPORT.open("a") as f:
        f.write(text)
    return text


def _cell(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text.replace("|", "\\|").replace("\n", " ")[:300]


def unexplained(seen: dict[str, Any], differences: dict[str, str], report_only: set[str] = frozenset()) -> list[str]:
    """The keys on which the brokers differ with no documented reason (``report_only`` keys are timings and the
    like, shown but never compared)."""
    if len(seen) < 2:
        return []
    first, *others = seen.values()
    keys = {k for observed in seen.values() for k in observed} - set(report_only) - set(differences)
    return sorted(k for k in keys if any(o.get(k) != first.get(k) for o in others))
