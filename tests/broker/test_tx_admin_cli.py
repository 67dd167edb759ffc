"""``txmq admin tx`` against a real ``txmq dev`` process, with real pending transactions (raw half-message sends)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from typing import Any

from txmq.net import connect
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.frame import RemotingCommand
from txmq.protocol.headers import SendMessageRequestHeader
from txmq.protocol.record import TransactionType, encode_properties


async def prepare(broker_addr: str, group: str, topic: str, body: bytes) -> tuple[str, str]:
    """Send one half message as a transactional producer would (no heartbeat, so no check is ever counted);
    returns (UNIQ_KEY, offsetMsgId of the half message)."""
    host, _, port = broker_addr.rpartition(":")
    conn = await connect(host, int(port))
    try:
        uniq = uuid.uuid4().hex.upper()
        header = SendMessageRequestHeader(
            producerGroup=group,
            topic=topic,
            queueId=0,
            sysFlag=int(TransactionType.PREPARED),
            bornTimestamp=int(time.time() * 1000),
            properties=encode_properties({"TRAN_MSG": "true", "PGROUP": group, "UNIQ_KEY": uniq}),
        )
        cmd = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, header.to_v2_ext(), body)
        resp = await conn.request(cmd, timeout=10)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        return uniq, resp.ext_fields["msgId"]
    finally:
        conn.close()


def txmq(cluster: Any, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "txmq", "admin", "-n", cluster.namesrv_addr, "tx", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


async def run(cluster: Any, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(txmq, cluster, *args)


async def test_admin_tx_list_show_resolve(txmq_cluster: Any) -> None:
    group = f"PG_CLI_{uuid.uuid4().hex[:8]}"
    topic = f"TxCli{uuid.uuid4().hex[:8]}"
    first, first_half_id = await prepare(txmq_cluster.broker_addr, group, topic, b"order 9527")
    second, _ = await prepare(txmq_cluster.broker_addr, group, topic, b"order 9528")

    listed = await run(txmq_cluster, "list", "--group", group)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split()[:4] == ["Broker", "Transaction", "id", "State"]
    rows = [line for line in lines if group in line]
    assert [r.split()[1] for r in rows] == [first, second]
    assert all("PREPARED" in r and topic in r for r in rows)
    assert (await run(txmq_cluster, "list", "--group", group, "--topic", "OtherTopic")).stdout.strip() == (
        "no in-doubt transaction"
    )
    assert "no in-doubt transaction" in (await run(txmq_cluster, "list", "--group", group, "--older-than", "1h")).stdout

    shown = await run(txmq_cluster, "show", first)
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert "State" in text and "PREPARED" in text and group in text and f"{topic} (queue 0)" in text
    assert first_half_id in text

    resolved = await run(txmq_cluster, "resolve", first, "commit")
    assert resolved.returncode == 0, resolved.stderr
    assert f"transaction {first} committed by operator" in resolved.stdout
    delivered_id = resolved.stdout.rsplit("delivered as ", 1)[1].strip()
    shown = await run(txmq_cluster, "show", first_half_id)
    assert shown.returncode == 0, shown.stderr
    assert "COMMITTED" in shown.stdout and "by operator" in shown.stdout and delivered_id in shown.stdout
    assert "COMMITTED" in (await run(txmq_cluster, "show", delivered_id)).stdout

    refused = await run(txmq_cluster, "resolve", first, "rollback")
    assert refused.returncode == 1 and "already decided as COMMIT" in refused.stderr

    rolled = await run(txmq_cluster, "resolve", second, "rollback")
    assert rolled.returncode == 0 and f"transaction {second} rolled back by operator" in rolled.stdout
    assert "no in-doubt transaction" in (await run(txmq_cluster, "list", "--group", group)).stdout

    missing = await run(txmq_cluster, "show", "NO-SUCH-TRANSACTION")
    assert missing.returncode == 1 and "NO-SUCH-TRANSACTION" in missing.stderr
    not_discarded = await run(txmq_cluster, "resume", second)
    assert not_discarded.returncode == 1 and "only a DISCARDED transaction can be resumed" in not_discarded.stderr

    stats = await run(txmq_cluster, "stats")
    assert stats.returncode == 0, stats.stderr
    counters = {
        line.rsplit(None, 1)[0].strip(): line.rsplit(None, 1)[1] for line in stats.stdout.splitlines()[2:] if line
    }
    assert int(counters["Operator resolutions"]) >= 2 and int(counters["Half messages"]) >= 2

    bad = await run(txmq_cluster, "list", "--older-than", "soon")
    assert bad.returncode == 2 and "not a duration" in bad.stderr
