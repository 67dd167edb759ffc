"""ACL on a real broker process (aclEnable=true) with txmq's own client: signed sends and pulls, denials with
the broker's remark, the denial log, and admin requests from admin and non-admin accounts."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from acl_support import (
    ADMIN_KEY,
    ADMIN_SECRET,
    PUB_KEY,
    PUB_SECRET,
    SUB_KEY,
    SUB_SECRET,
    TOPIC,
    conf_dir,
    create_topic,
    denial_of,
    send_one,
    start_acl_cluster,
    unique,
    wait_for_log,
)

from txmq.client import Admin, PullConsumer, PullStatus
from txmq.errors import MQBrokerError

pytestmark = pytest.mark.slow


@pytest.fixture
async def cluster(make_cluster: Any, tmp_path: Path) -> Any:
    c = start_acl_cluster(make_cluster, tmp_path)
    await create_topic(c)
    return c


async def pull_all(cluster: Any, access_key: str, secret_key: str, group: str, topic: str = TOPIC) -> list[bytes]:
    consumer = PullConsumer(
        group, cluster.namesrv_addr, access_key=access_key, secret_key=secret_key, instance_name=unique("c")
    )
    await consumer.start()
    try:
        bodies: list[bytes] = []
        for mq in await consumer.fetch_queues(topic):
            result = await consumer.pull(mq, "*", 0, 32)
            if result.status is PullStatus.FOUND:
                bodies.extend(m.body for m in result.messages)
        return bodies
    finally:
        await consumer.shutdown()


async def test_the_right_secret_sends_and_consumes_where_permitted(cluster: Any) -> None:
    result = await send_one(cluster, PUB_KEY, PUB_SECRET, body=b"signed hello")
    assert result.status.value == "SEND_OK"
    bodies = await pull_all(cluster, SUB_KEY, SUB_SECRET, unique("CG"))
    assert b"signed hello" in bodies


async def test_refusals_carry_the_reason(cluster: Any) -> None:
    assert await denial_of(cluster, PUB_KEY, "wrongSecret123") == (
        f"[TXMQ ACL] Check signature failed for accessKey={PUB_KEY}"
    )
    assert await denial_of(cluster, "ghostUser01", "ghostSecret01") == "[TXMQ ACL] No acl config for ghostUser01"
    assert (await denial_of(cluster, None, None)).startswith("[TXMQ ACL] No accessKey is configured")
    assert await denial_of(cluster, SUB_KEY, SUB_SECRET) == (
        f"[TXMQ ACL] No default permission for topic:{TOPIC} (accessKey={SUB_KEY} needs PUB, its topicPerms gives SUB)"
    )
    # A subscriber may not read a topic it has no SUB on.
    with pytest.raises(MQBrokerError, match=f"No default permission for topic:{TOPIC}"):
        await pull_all(cluster, PUB_KEY, PUB_SECRET, unique("CG"))
    # The broker logs each denial with its reason, and never a secret.
    line = await wait_for_log(cluster, f"Check signature failed for accessKey={PUB_KEY}")
    assert "ACL denied request code" in line
    await wait_for_log(cluster, "No acl config for ghostUser01")
    await wait_for_log(cluster, "No accessKey is configured")
    log = cluster.log_text()
    for secret in (PUB_SECRET, SUB_SECRET, ADMIN_SECRET, "wrongSecret123", "ghostSecret01"):
        assert secret not in log


async def test_admin_requests_need_an_admin_account(cluster: Any) -> None:
    async with Admin(
        cluster.namesrv_addr, access_key=PUB_KEY, secret_key=PUB_SECRET, instance_name=unique("a")
    ) as user:
        addr = cluster.broker_addr
        calls = {
            50: user.update_acl_account(addr, PUB_KEY, admin=True),
            51: user.delete_acl_account(addr, SUB_KEY),
            52: user.acl_info(addr),
            53: user.update_global_white_addrs(addr, ["*"]),
            17: user.create_topic(unique("T"), broker_addr=addr),
        }
        for code, call in calls.items():
            with pytest.raises(MQBrokerError) as info:
                await call
            assert info.value.code == 1
            assert info.value.remark == (
                f"[TXMQ ACL] Need admin permission for request code={code}, but accessKey={PUB_KEY} is not"
            )
    text = (conf_dir(cluster) / "plain_acl.yml").read_text()
    assert "admin: true" in text and text.count("admin: true") == 1  # nothing was changed


async def test_admin_changes_apply_at_once_and_are_written_to_the_file(cluster: Any) -> None:
    addr = cluster.broker_addr
    async with Admin(
        cluster.namesrv_addr, access_key=ADMIN_KEY, secret_key=ADMIN_SECRET, instance_name=unique("a")
    ) as admin:
        remark = await admin.update_acl_account(
            addr, "newUser0001", secret_key="newSecret0001", topic_perms=[f"{TOPIC}=PUB"]
        )
        assert "plain_acl.yml" in remark
        # No reload wait: the broker applied it before answering.
        assert (await send_one(cluster, "newUser0001", "newSecret0001")).status.value == "SEND_OK"
        info = await admin.acl_info(addr)
        accounts = {a["accessKey"]: a for a in info["plainAccessConfigs"]}
        assert accounts["newUser0001"]["topicPerms"] == [f"{TOPIC}=PUB"]
        assert accounts["newUser0001"]["secretKey"] != "newSecret0001"  # masked
        assert info["brokerAddr"] == addr and info["clusterName"]
        assert all(f["inForce"] for f in info["files"].values())

        with pytest.raises(MQBrokerError) as bad:
            await admin.update_acl_account(addr, "tooShort", secret_key="x")
        assert bad.value.code == 209 and "secretKey must be longer than 6 characters" in (bad.value.remark or "")

        await admin.delete_acl_account(addr, "newUser0001")
        assert await denial_of(cluster, "newUser0001", "newSecret0001") == "[TXMQ ACL] No acl config for newUser0001"

        # The global whitelist lets requests without credentials in.
        await admin.update_global_white_addrs(addr, ["127.0.0.1"])
        assert (await send_one(cluster, None, None)).status.value == "SEND_OK"
        await admin.update_global_white_addrs(addr, [])
        assert (await denial_of(cluster, None, None)).startswith("[TXMQ ACL] No accessKey")
    doc = yaml.safe_load((conf_dir(cluster) / "plain_acl.yml").read_text())
    assert [a["accessKey"] for a in doc["accounts"]] == [ADMIN_KEY, PUB_KEY, SUB_KEY]
    assert doc["globalWhiteRemoteAddresses"] == []


def run_cli(cluster: Any, *args: str, key: str = ADMIN_KEY, secret: str = ADMIN_SECRET) -> tuple[int, str, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "txmq", "admin", "-n", cluster.namesrv_addr, "--access-key", key, "acl", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TXMQ_SECRET_KEY": secret},
    )
    return proc.returncode, proc.stdout, proc.stderr


async def test_admin_acl_cli(cluster: Any) -> None:
    code, out, err = await asyncio.to_thread(
        run_cli, cluster, "add", "cliUser0001", "--secret", "cliSecret0001", "--topic-perm", f"{TOPIC}=PUB"
    )
    assert code == 0, err
    assert f"{cluster.broker_addr}: ok" in out
    assert (await send_one(cluster, "cliUser0001", "cliSecret0001")).status.value == "SEND_OK"

    code, out, err = await asyncio.to_thread(run_cli, cluster, "show")
    assert code == 0, err
    assert "cliUser0001" in out and "cliSecret0001" not in out
    assert "plain_acl.yml" in out and "in force" in out

    code, out, err = await asyncio.to_thread(run_cli, cluster, "remove", "cliUser0001")
    assert code == 0, err
    assert (await denial_of(cluster, "cliUser0001", "cliSecret0001")).endswith("No acl config for cliUser0001")

    # A non-admin caller: refused on the broker, and the command says it did not apply.
    code, out, err = await asyncio.to_thread(run_cli, cluster, "whitelist", "10.0.0.1", key=PUB_KEY, secret=PUB_SECRET)
    assert code == 1
    assert "FAILED" in out and "Need admin permission for request code=53" in out
    assert "reached 0 of 1 broker(s)" in err


async def test_strict_mode_whitelist_does_not_skip_the_signature(make_cluster: Any, tmp_path: Path) -> None:
    text = (
        "accounts:\n"
        "  - accessKey: lanUser0001\n"
        "    secretKey: lanSecret0001\n"
        "    whiteRemoteAddress: 127.0.0.*\n"
        f"    topicPerms: [{TOPIC}=PUB]\n"
        f"  - accessKey: {ADMIN_KEY}\n"
        f"    secretKey: {ADMIN_SECRET}\n"
        "    admin: true\n"
    )
    lenient = start_acl_cluster(make_cluster, tmp_path, text, name="lenient")
    strict = start_acl_cluster(make_cluster, tmp_path, text, conf={"aclStrictMode": "true"}, name="strict")
    for c in (lenient, strict):
        await create_topic(c)
    # RocketMQ's behaviour: from a whitelisted address any secret goes.
    assert (await send_one(lenient, "lanUser0001", "anyOldSecret")).status.value == "SEND_OK"
    assert await denial_of(strict, "lanUser0001", "anyOldSecret") == (
        "[TXMQ ACL] Check signature failed for accessKey=lanUser0001"
    )
    assert (await send_one(strict, "lanUser0001", "lanSecret0001")).status.value == "SEND_OK"
    await wait_for_log(lenient, "skip the signature and permission checks (set aclStrictMode=true")


async def test_a_missing_acl_file_denies_all_but_says_so(make_cluster: Any) -> None:
    cluster = make_cluster({"aclEnable": "true"}, name="nofile")
    assert (await denial_of(cluster, PUB_KEY, PUB_SECRET)).endswith(f"No acl config for {PUB_KEY}")
    await wait_for_log(cluster, "plain_acl.yml does not exist")
