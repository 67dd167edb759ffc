"""``txmq admin`` commands on a broker with aclEnable=true: every subcommand signs its requests with
``--access-key``/``--secret-key``, and a refusal is one line with the broker's reason (no traceback)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from acl_support import (
    ADMIN_KEY,
    ADMIN_SECRET,
    PUB_KEY,
    PUB_SECRET,
    TOPIC,
    create_topic,
    start_acl_cluster,
    unique,
)

from txmq.client import Admin, LocalTransactionState, Message, TransactionProducer
from txmq.testing import aeventually

pytestmark = pytest.mark.slow

NO_KEY = "[TXMQ ACL] No accessKey is configured"


def admin_cli(cluster: Any, *args: str, key: str | None, secret: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TXMQ_ACCESS_KEY", "TXMQ_SECRET_KEY")}
    flags = ["--access-key", key, "--secret-key", secret] if key is not None and secret is not None else []
    return subprocess.run(
        [sys.executable, "-m", "txmq", "admin", "-n", cluster.namesrv_addr, *flags, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


async def cli(cluster: Any, *args: str, key: str | None = ADMIN_KEY, secret: str | None = ADMIN_SECRET) -> Any:
    return await asyncio.to_thread(admin_cli, cluster, *args, key=key, secret=secret)


class Unknown:
    """Never decides: every transaction stays in doubt until the broker gives up on it."""

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN

    def check_local_transaction(self, message: Any) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN


async def discarded_transactions(cluster: Any, group: str, count: int) -> list[str]:
    """``count`` transactions of ``group`` that the broker discarded after one unanswered check."""
    producer = TransactionProducer(
        group, cluster.namesrv_addr, Unknown(), access_key=ADMIN_KEY, secret_key=ADMIN_SECRET, instance_name=unique("p")
    )
    await producer.start()
    try:
        ids = [
            (await producer.send_message_in_transaction(Message(TOPIC, f"order {i}".encode()))).transaction_id
            for i in range(count)
        ]
        async with Admin(
            cluster.namesrv_addr, access_key=ADMIN_KEY, secret_key=ADMIN_SECRET, instance_name=unique("a")
        ) as admin:

            async def all_discarded() -> bool:
                states = {r["transactionId"]: r["state"] for r in await admin.list_transactions(group=group)}
                assert states == dict.fromkeys(ids, "DISCARDED"), states
                return True

            await aeventually(
                all_discarded, "the broker discarding both transactions", timeout=30, retry_on=(Exception,)
            )
    finally:
        await producer.shutdown()  # no live producer: a resumed transaction stays PREPARED (no check is counted)
    return [str(i) for i in ids]


@pytest.fixture
async def cluster(make_cluster: Any, tmp_path: Path) -> Any:
    c = start_acl_cluster(make_cluster, tmp_path, conf={"transactionCheckMax": "1"})
    await create_topic(c)
    return c


def refused(result: subprocess.CompletedProcess[str], reason: str) -> bool:
    return result.returncode == 1 and reason in result.stderr and "Traceback" not in result.stderr


async def test_admin_tx_commands_sign_with_the_given_keys(cluster: Any) -> None:
    group = unique("PG_ACL_CLI")
    first, second = await discarded_transactions(cluster, group, 2)

    listed = await cli(cluster, "tx", "list", "--group", group)
    assert listed.returncode == 0, listed.stderr
    rows = [line.split() for line in listed.stdout.splitlines() if group in line]
    assert [(r[1], r[2]) for r in rows] == [(first, "DISCARDED"), (second, "DISCARDED")]

    shown = await cli(cluster, "tx", "show", first)
    assert shown.returncode == 0, shown.stderr
    assert "DISCARDED" in shown.stdout and group in shown.stdout

    resumed = await cli(cluster, "tx", "resume", first)
    assert resumed.returncode == 0, resumed.stderr
    assert f"transaction {first} resumed" in resumed.stdout and "PREPARED" in resumed.stdout

    resolved = await cli(cluster, "tx", "resolve", first, "commit")
    assert resolved.returncode == 0, resolved.stderr
    assert f"transaction {first} committed by operator" in resolved.stdout

    stats = await cli(cluster, "tx", "stats")
    assert stats.returncode == 0, stats.stderr
    counters = {line.rsplit(None, 1)[0].strip(): line.rsplit(None, 1)[1] for line in stats.stdout.splitlines()[2:]}
    assert counters["Operator resolutions"] == "1" and counters["Resumes"] == "1"

    # The same flags serve the other admin commands.
    created = await cli(cluster, "topic", "create", unique("T"), "-q", "2")
    assert created.returncode == 0, created.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("tx", "list"),
        ("tx", "show", "SOME-ID"),
        ("tx", "resolve", "SOME-ID", "commit"),
        ("tx", "resume", "SOME-ID"),
        ("tx", "stats"),
        ("topic", "create", "NotByYou"),
    ],
    ids=lambda a: " ".join(a[:2]),
)
async def test_admin_commands_without_an_admin_key_are_refused_with_the_reason(cluster: Any, args: Any) -> None:
    anonymous = await cli(cluster, *args, key=None, secret=None)
    assert refused(anonymous, NO_KEY), anonymous.stderr
    assert anonymous.stderr.startswith("txmq: "), anonymous.stderr

    not_admin = await cli(cluster, *args, key=PUB_KEY, secret=PUB_SECRET)
    assert refused(not_admin, "[TXMQ ACL] Need admin permission for request code="), not_admin.stderr
    assert f"accessKey={PUB_KEY} is not" in not_admin.stderr
