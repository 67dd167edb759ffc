"""Transaction audit and reconciliation: on a real broker's store, on crafted stores, and through the CLI."""

# ruff: noqa: E402  (txmq.spark imports pyspark: the skip must come first)
from __future__ import annotations

import asyncio
import itertools
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

for _module in ("pyspark", "pyarrow"):
    pytest.importorskip(_module, reason="pyspark/pyarrow are not installed: pip install -e '.[spark]' (.ci/run does)")

from txmq.cli import main as txmq_main
from txmq.client import Message
from txmq.client.sync import Producer
from txmq.net import connect
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.frame import RemotingCommand
from txmq.protocol.headers import EndTransactionRequestHeader, SendMessageRequestHeader
from txmq.protocol.record import TransactionType, decode_offset_msg_id, encode_properties
from txmq.spark.audit import anomalies, transaction_audit, transaction_events
from txmq.spark.reconcile import delivered_messages, load_source, reconcile
from txmq.spark.store_source import list_segments, scan_segment

_uniq = itertools.count(1)


async def make_transactions(port: int) -> tuple[dict[str, list[str]], Any, Any]:
    """3 committed, 2 rolled back (group PG_MAIN, decided at once), 2 left to the checker with a producer online that
    never answers (PG_SILENT: discarded after transactionCheckMax=1), 2 with no producer online (PG_GONE: pending)."""
    plain = await connect("127.0.0.1", port, None)
    silent = await connect("127.0.0.1", port, lambda _c, _cmd: None)
    body = orjson.dumps({"clientID": "silent-producer", "producerDataSet": [{"groupName": "PG_SILENT"}]})
    resp = await silent.request(RemotingCommand.request(RequestCode.HEART_BEAT, {}, body), timeout=5)
    assert resp.code == ResponseCode.SUCCESS

    async def prepare(conn: Any, group: str) -> tuple[str, int, int]:
        uniq = f"SPARKTX{next(_uniq):025d}"
        props = {"TRAN_MSG": "true", "PGROUP": group, "UNIQ_KEY": uniq, "TAGS": "T"}
        header = SendMessageRequestHeader(
            producerGroup=group,
            topic="SparkTx",
            queueId=0,
            sysFlag=int(TransactionType.PREPARED),
            bornTimestamp=int(time.time() * 1000),
            properties=encode_properties(props),
        )
        cmd = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, header.to_v2_ext(), b"tx-body")
        resp = await conn.request(cmd, timeout=5)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        return uniq, int(resp.ext_fields["queueOffset"]), decode_offset_msg_id(resp.ext_fields["msgId"])[1]

    async def end(conn: Any, group: str, prepared: tuple[str, int, int], decision: int) -> None:
        uniq, queue_offset, phys = prepared
        header = EndTransactionRequestHeader(
            producerGroup=group,
            tranStateTableOffset=queue_offset,
            commitLogOffset=phys,
            commitOrRollback=decision,
            fromTransactionCheck=False,
            msgId=uniq,
            transactionId=uniq,
        )
        cmd = RemotingCommand.request(RequestCode.END_TRANSACTION, header.to_ext())
        resp = await conn.request(cmd, timeout=5)
        assert resp.code == ResponseCode.SUCCESS, resp.remark

    out: dict[str, list[str]] = {"COMMIT": [], "ROLLBACK": [], "DISCARDED": [], "PENDING": []}
    for kind, group, conn, decision in (
        ("COMMIT", "PG_MAIN", plain, 8),
        ("COMMIT", "PG_MAIN", plain, 8),
        ("ROLLBACK", "PG_MAIN", plain, 12),
        ("COMMIT", "PG_MAIN", plain, 8),
        ("ROLLBACK", "PG_MAIN", plain, 12),
        ("DISCARDED", "PG_SILENT", silent, None),
        ("DISCARDED", "PG_SILENT", silent, None),
        ("PENDING", "PG_GONE", plain, None),
        ("PENDING", "PG_GONE", plain, None),
    ):
        prepared = await prepare(conn, group)
        if decision is not None:
            await end(conn, group, prepared, decision)
        out[kind].append(prepared[0])
    return out, silent, plain


def discard_markers(store: Path) -> int:
    count = 0
    for seg in list_segments(str(store)):
        for rec in scan_segment(seg, with_body=False):
            if rec.topic == "RMQ_SYS_TRANS_OP_HALF_TOPIC" and rec.properties.get("TXMQ_DECISION") == "DISCARD":
                count += 1
    return count


def test_audit_classifies_a_real_brokers_transactions(spark: Any, make_cluster: Any, tmp_path: Path) -> None:
    cluster = make_cluster({"transactionCheckMax": "1"}, name="audit")
    store = cluster.data_dir / "store"

    async def scenario() -> dict[str, list[str]]:
        made, silent, plain = await make_transactions(cluster.broker_port)
        try:
            for _ in range(300):  # the checker discards PG_SILENT's two after one unanswered check each
                if discard_markers(store) >= 2:
                    break
                await asyncio.sleep(0.1)
        finally:
            silent.close()
            plain.close()
        return made

    made = asyncio.run(scenario())
    assert discard_markers(store) == 2
    cluster.stop()  # a clean stop persists the check counts of the pending ones

    audit = transaction_audit(spark, str(store))
    rows = {r.uniq_key: r for r in audit.collect()}
    for resolution, uniqs in made.items():
        for uniq in uniqs:
            assert rows[uniq].resolution == resolution, (uniq, rows[uniq])
    assert len(rows) == 9
    for uniq in made["COMMIT"]:
        r = rows[uniq]
        assert r.deliveries == 1 and r.delivered_msg_id and r.producer_group == "PG_MAIN"
        assert r.real_topic == "SparkTx" and r.resolved_at >= r.prepared_at and r.time_to_resolution_ms >= 0
    for uniq in made["ROLLBACK"]:
        assert rows[uniq].deliveries == 0 and rows[uniq].resolved_at is not None
    for uniq in made["DISCARDED"]:
        assert rows[uniq].checks_sent == 1 and rows[uniq].producer_group == "PG_SILENT"
    for uniq in made["PENDING"]:
        assert rows[uniq].resolved_at is None and rows[uniq].checks_sent == 0
    assert anomalies(audit, transaction_events(spark, str(store))).count() == 0

    # The same through the CLI, with the parquet table, summary and report.
    out = tmp_path / "audit-out"
    assert txmq_main(["spark", "audit", "--store", str(store), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["by_resolution"] == {"COMMIT": 3, "ROLLBACK": 2, "DISCARDED": 2, "PENDING": 2}
    assert summary["anomalies"] == {}
    assert [r["uniq_key"] for r in summary["oldest_in_doubt"]] == made["PENDING"]
    assert spark.read.parquet(str(out / "audit.parquet")).count() == 9
    html = (out / "report.html").read_text()
    assert "resolutions.png" in html and "latency.png" in html
    assert (out / "resolutions.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "latency.png").read_bytes()[:4] == b"\x89PNG"


def test_audit_finds_planted_anomalies(spark: Any, planted_store: str) -> None:
    root = planted_store
    audit = transaction_audit(spark, root)
    resolutions = {r.uniq_key: r.resolution for r in audit.collect()}
    assert resolutions == {
        "NO_DELIVERY": "COMMIT",
        "DOUBLE": "COMMIT",
        "ROLLED_BACK_BUT_DELIVERED": "ROLLBACK",
        "ROCKETMQ_MARKER": "COMMIT",
        "FINE": "COMMIT",
        "RESUMED": "PENDING",
        "DISCARDED_THEN_COMMITTED": "COMMIT",
        "CRASH_BEFORE_MARKER": "COMMIT",
        "DISCARDED": "DISCARDED",
        "WHOLE_0": "COMMIT",  # a transaction of several messages is one row: its first message's
        "PARTIAL_0": "COMMIT",
    }
    by_uniq = {r.uniq_key: r for r in audit.collect()}
    whole, partial = by_uniq["WHOLE_0"], by_uniq["PARTIAL_0"]
    assert (whole.transaction_id, whole.messages, whole.messages_delivered, whole.deliveries) == ("WHOLE", 3, 3, 3)
    assert (partial.messages, partial.messages_delivered, partial.max_deliveries) == (3, 2, 1)
    assert by_uniq["DOUBLE"].messages == 1 and by_uniq["DOUBLE"].max_deliveries == 2
    assert by_uniq["DISCARDED"].checks_sent == 15 and by_uniq["DISCARDED"].time_to_resolution_ms is not None
    assert by_uniq["DISCARDED_THEN_COMMITTED"].resolved_at is not None
    assert by_uniq["RESUMED"].resolved_at is None and by_uniq["RESUMED"].checks_sent == 0
    found = {(r.anomaly, r.uniq_key) for r in anomalies(audit, transaction_events(spark, root)).collect()}
    assert found == {
        ("COMMIT_WITHOUT_DELIVERY", "NO_DELIVERY"),
        ("DOUBLE_DELIVERY", "DOUBLE"),
        ("DELIVERY_WITHOUT_COMMIT", "ROLLED_BACK_BUT_DELIVERED"),
        ("DELIVERY_WITHOUT_COMMIT", "ORPHAN"),
        ("PARTIAL_DELIVERY", "PARTIAL_0"),
    }


def test_reconciliation_finds_planted_inconsistencies(spark: Any, txmq_cluster: Any, tmp_path: Path) -> None:
    ns = txmq_cluster.namesrv_addr
    db = tmp_path / "orders.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE orders (order_id TEXT, status TEXT, amount INTEGER)")
        conn.executemany(
            "INSERT INTO orders VALUES (?, ?, ?)",
            [(f"order-{i}", "COMMITTED", i * 10) for i in range(1, 11)] + [("order-11", "ROLLED_BACK", 5)],
        )
    sent = [f"order-{i}" for i in range(1, 11) if i != 3] + ["order-99", "order-5"]  # 3 missing, 99 extra, 5 twice
    with Producer("SparkOrdersPG", ns) as p:
        for order in sent:
            p.send(Message("SparkOrders", orjson.dumps({"order_id": order}), keys=order))

    # Through the broker, keyed on a body field, from the CLI (exit 1: inconsistent).
    out = tmp_path / "rec"
    argv = ["spark", "reconcile", "--source", str(db), "--source-table", "orders", "--source-key", "order_id"]
    argv += ["--where", "status = 'COMMITTED'", "--topics", "SparkOrders", "--key", "json:order_id"]
    assert txmq_main([*argv, "--namesrv", ns, "--out", str(out)]) == 1
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["missing"], summary["unexpected"], summary["duplicates"]) == (1, 1, 1)
    assert [r["key"] for r in summary["samples"]["missing"]] == ["order-3"]
    assert [r["key"] for r in summary["samples"]["unexpected"]] == ["order-99"]
    dup = spark.read.parquet(str(out / "duplicates.parquet")).collect()
    assert [(r.key, r.deliveries, len(set(r.msg_ids))) for r in dup] == [("order-5", 2, 2)]

    # From the store folder, keyed on KEYS, through the functions; the rolled-back row counts when not filtered out.
    source = load_source(spark, str(db), table="orders")
    delivered = delivered_messages(spark, ["SparkOrders"], store=str(txmq_cluster.data_dir / "store"))
    result = reconcile(source, "order_id", delivered, "keys")
    assert sorted(r.key for r in result.missing.collect()) == ["order-11", "order-3"]
    assert [r.key for r in result.unexpected.collect()] == ["order-99"]
    assert [r.key for r in result.duplicates.collect()] == ["order-5"]


def test_reconcile_and_audit_after_the_order_demo_are_clean(spark: Any, tmp_path: Path) -> None:
    import subprocess
    import sys

    data = tmp_path / "demo"
    done = subprocess.run(
        [sys.executable, "-m", "txmq", "demo", "orders", "--orders", "12", "--data-dir", str(data)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (topic,) = [p.name for p in (data / "store" / "consumequeue").iterdir() if p.name.startswith("DemoOrders_")]
    with sqlite3.connect(data / "orders.db") as conn:
        committed = {str(r[0]) for r in conn.execute("SELECT id FROM orders")}
    assert committed
    out = tmp_path / "rec"
    argv = ["spark", "reconcile", "--source", str(data / "orders.db"), "--source-table", "orders"]
    argv += ["--source-key", "id", "--topics", topic, "--key", "keys", "--store", str(data / "store")]
    assert txmq_main([*argv, "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["consistent"] and summary["source_rows"] == summary["deliveries"] == len(committed)
    audit = transaction_audit(spark, str(data / "store")).filter(f"real_topic = '{topic}'")
    counts = {r.resolution: r["count"] for r in audit.groupBy("resolution").count().collect()}
    assert counts.get("COMMIT") == len(committed) and counts.get("PENDING") is None
    assert sum(counts.values()) == 12


def test_the_audit_counts_a_transaction_of_several_messages_once(spark: Any, make_cluster: Any) -> None:
    """Transactions of three messages on two topics against a real broker, committed and rolled back: the audit of its
    store shows each transaction once with its three messages, delivered whole or not at all, and no anomaly."""
    from txmq.client import LocalTransactionState
    from txmq.client.sync import TransactionProducer

    cluster = make_cluster(name="several-audit")
    ns = cluster.namesrv_addr
    with Producer("audit_setup", ns) as setup:
        for topic in ("AuditA", "AuditB"):
            setup.send(Message(topic, b"make the topic"))

    class Decide:
        def execute_local_transaction(self, tx: Any, arg: Any) -> LocalTransactionState:
            return LocalTransactionState.COMMIT if arg else LocalTransactionState.ROLLBACK

        def check_local_transaction(self, message: Any) -> LocalTransactionState:
            return LocalTransactionState.ROLLBACK

    ids: dict[str, bool] = {}
    with TransactionProducer("audit_several", ns, Decide()) as producer:
        for i in range(6):
            with producer.transaction(i % 3 != 0) as tx:
                for topic in ("AuditA", "AuditB", "AuditA"):
                    tx.send(Message(topic, f"{i}-{topic}".encode()))
            ids[str(tx.transaction_id)] = i % 3 != 0
    cluster.stop()
    audit = transaction_audit(spark, str(cluster.data_dir / "store")).filter("producer_group = 'audit_several'")
    rows = {r.transaction_id: r for r in audit.collect()}
    assert set(rows) == set(ids)
    for tid, committed in ids.items():
        r = rows[tid]
        assert r.messages == 3 and r.resolution == ("COMMIT" if committed else "ROLLBACK")
        assert (r.messages_delivered, r.deliveries) == ((3, 3) if committed else (0, 0))
    found = anomalies(audit, transaction_events(spark, str(cluster.data_dir / "store"))).collect()
    assert [r for r in found if r.producer_group == "audit_several"] == []
