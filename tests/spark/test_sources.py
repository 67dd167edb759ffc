"""The txmq and txmq-store data sources against real broker processes, and their errors."""

# ruff: noqa: E402  (txmq.spark imports pyspark: the skip must come first)
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

for _module in ("pyspark", "pyarrow"):
    pytest.importorskip(_module, reason="pyspark/pyarrow are not installed: pip install -e '.[spark]' (.ci/run does)")

from txmq.client import Message
from txmq.client.sync import Admin, Producer, PullConsumer
from txmq.spark import TxmqSparkError, clear_errors
from txmq.spark.broker_source import TxmqStreamReader
from txmq.spark.store_source import list_segments, scan_segment


def send(namesrv: str, topic: str, n: int, start: int = 0, group: str = "SparkPG") -> list[str]:
    with Producer(group, namesrv) as p:
        msgs = [Message(topic, f"body-{i}".encode(), tags="T", keys=f"key-{i}") for i in range(start, start + n)]
        return [p.send(m).msg_id for m in msgs]


def consumer_view(namesrv: str, topic: str) -> set[tuple[Any, ...]]:
    seen = set()
    with PullConsumer("SparkCheckCG", namesrv) as c:
        for mq in c.fetch_queues(topic):
            offset = 0
            while True:
                result = c.pull(mq, "*", offset, 32)
                if not result.messages:
                    break
                for m in result.messages:
                    seen.add((m.queue_id, m.queue_offset, m.msg_id, m.offset_msg_id, m.body, m.keys[0], m.tags))
                offset = result.next_begin_offset
    return seen


def test_batch_read_equals_what_a_consumer_sees(spark: Any, txmq_cluster: Any) -> None:
    ns = txmq_cluster.namesrv_addr
    send(ns, "SparkBatch", 45)
    expected = consumer_view(ns, "SparkBatch")
    assert len(expected) == 45
    df = spark.read.format("txmq").option("namesrv", ns).option("topics", "SparkBatch").load()
    rows = df.collect()
    got = {(r.queue_id, r.queue_offset, r.msg_id, r.offset_msg_id, bytes(r.body), r.keys, r.tags) for r in rows}
    assert got == expected
    assert all(r.topic == "SparkBatch" and r.properties["UNIQ_KEY"] == r.msg_id for r in rows)
    # Several partitions per queue when a queue is larger than maxMessagesPerPartition: same rows.
    small = spark.read.format("txmq").options(namesrv=ns, topics="SparkBatch", maxMessagesPerPartition="4").load()
    assert small.rdd.getNumPartitions() > df.rdd.getNumPartitions()
    assert sorted(small.select("msg_id").collect()) == sorted(df.select("msg_id").collect())
    # Per-queue starting and ending offsets.
    ranged = spark.read.format("txmq").options(
        namesrv=ns,
        topics="SparkBatch",
        startingOffsets=json.dumps({"SparkBatch/0": 2}),
        endingOffsets=json.dumps({"SparkBatch/0": 5, "SparkBatch/1": 0, "SparkBatch/2": 0, "SparkBatch/3": 0}),
    )
    offsets = sorted((r.queue_id, r.queue_offset) for r in ranged.load().collect())
    assert offsets == [(0, 2), (0, 3), (0, 4)]


def run_stream(spark: Any, ns: str, topic: str, out: Path, **options: str) -> list[Any]:
    query = (
        spark.readStream.format("txmq")
        .options(namesrv=ns, topics=topic, **options)
        .load()
        .writeStream.format("parquet")
        .option("path", str(out / "data"))
        .option("checkpointLocation", str(out / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert not query.isActive
    if query.exception() is not None:
        raise AssertionError(str(query.exception()))
    return [p for p in query.recentProgress if p["numInputRows"] > 0]


def test_stream_restarted_with_new_messages_writes_each_once(spark: Any, txmq_cluster: Any, tmp_path: Path) -> None:
    ns = txmq_cluster.namesrv_addr
    first = send(ns, "SparkStream", 30)
    run_stream(spark, ns, "SparkStream", tmp_path, commitConsumerGroup="SparkStreamCG")
    second = send(ns, "SparkStream", 20, start=30)
    run_stream(spark, ns, "SparkStream", tmp_path, commitConsumerGroup="SparkStreamCG")
    third = send(ns, "SparkStream", 5, start=50)
    run_stream(spark, ns, "SparkStream", tmp_path, commitConsumerGroup="SparkStreamCG")
    rows = spark.read.parquet(str(tmp_path / "data")).select("msg_id", "queue_id", "queue_offset").collect()
    ids = [r.msg_id for r in rows]
    assert len(ids) == len(set(ids)) == 55
    assert set(ids) == set(first + second + third)
    # The group's progress is on the broker up to the last batch of the last run (Spark commits a source's batch
    # only when it plans the next one, and never the last one of an availableNow run: the reader stores what the
    # sink holds when Spark asks it for new data).
    with Admin(ns) as admin:
        stats = admin.consume_stats("SparkStreamCG", "SparkStream")
    assert sum(w.consumer_offset for w in stats.offset_table.values()) == 55


def test_rate_limit_splits_the_backlog(spark: Any, txmq_cluster: Any, tmp_path: Path) -> None:
    ns = txmq_cluster.namesrv_addr
    send(ns, "SparkRate", 40)
    # The Kafka source's name for maxMessagesPerTrigger, as data engineers type it from habit.
    batches = run_stream(spark, ns, "SparkRate", tmp_path, maxOffsetsPerTrigger="10")
    assert [b["numInputRows"] for b in batches] == [10, 10, 10, 10]
    assert spark.read.parquet(str(tmp_path / "data")).select("msg_id").distinct().count() == 40


def test_store_reader_on_a_store_copied_from_a_killed_broker(spark: Any, make_cluster: Any, tmp_path: Path) -> None:
    cluster = make_cluster(name="killed")
    acked = send(cluster.namesrv_addr, "SparkKill", 120)
    cluster.kill()
    copy = tmp_path / "copy"
    # cp keeps the key index's sparse files sparse (copytree would write 580 MB of zeros).
    subprocess.run(["cp", "-a", "--sparse=always", str(cluster.data_dir / "store"), str(copy)], check=True)
    # A torn tail: the first 70 bytes of a record written after the last complete one.
    seg = list_segments(str(copy))[-1]
    records = list(scan_segment(seg))
    end = records[-1].physical_offset + records[-1].store_size - seg.start
    with open(seg.path, "r+b") as f:
        f.seek(records[0].physical_offset - seg.start)
        head = f.read(70)
        f.seek(end)
        f.write(head)
    df = spark.read.format("txmq-store").load(str(copy))
    rows = df.filter("topic = 'SparkKill'").select("msg_id", "body", "commit_log_offset").collect()
    assert sorted(r.msg_id for r in rows) == sorted(acked)
    assert df.count() == len(records) + sum(len(list(scan_segment(s))) for s in list_segments(str(copy))[:-1])
    # The torn bytes are untouched (the reader never writes).
    with open(seg.path, "rb") as f:
        f.seek(end)
        assert f.read(70) == head


def one_line_error(fn: Any) -> str:
    with pytest.raises(TxmqSparkError) as info, clear_errors():
        fn()
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message and "java" not in message.lower(), message
    return message


def test_clear_errors(quiet: Any, txmq_cluster: Any, tmp_path: Path) -> None:
    spark = quiet
    ns = txmq_cluster.namesrv_addr

    def batch(**opts: str) -> Any:
        return lambda: spark.read.format("txmq").options(**opts).load().collect()

    assert "unreachable" in one_line_error(batch(namesrv="127.0.0.1:1", topics="X"))
    assert "unknown topic 'NoSuchTopic'" in one_line_error(batch(namesrv=ns, topics="NoSuchTopic"))
    assert "unknown option 'startoffset'" in one_line_error(batch(namesrv=ns, topics="X", startOffset="1"))
    assert "startingOffsets" in one_line_error(batch(namesrv=ns, topics="X", startingOffsets="{bad"))
    assert "namesrv is required" in one_line_error(batch(topics="X"))
    both = {"maxMessagesPerTrigger": "5", "maxOffsetsPerTrigger": "5"}
    with pytest.raises(TxmqSparkError, match="not both"):
        TxmqStreamReader({"namesrv": ns, "topics": "X", **both})
    missing = str(tmp_path / "nope")
    assert "does not exist" in one_line_error(lambda: spark.read.format("txmq-store").load(missing).collect())

    def stream() -> None:
        q = (
            spark.readStream.format("txmq")
            .options(namesrv=ns, topics="NoSuchStreamTopic")
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", str(tmp_path / "cp"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(60)

    assert "unknown topic 'NoSuchStreamTopic'" in one_line_error(stream)


# Retention behind a checkpoint: segments of 64 KiB, deleted as soon as they are not the active one.
RETENTION_CONF = {
    "mappedFileSizeCommitLog": str(64 * 1024),
    "fileReservedTime": "0",
    "deleteWhen": ";".join(f"{h:02d}" for h in range(24)),
    "cleanResourceInterval": "200",
}


def queue_ranges(ns: str, topic: str) -> dict[str, tuple[int, int]]:
    from txmq.spark.broker_source import BrokerOptions, list_queues, run_client

    options, _ = BrokerOptions.parse("txmq", {"namesrv": ns, "topics": topic})
    queues = run_client(options, lambda inst: list_queues(inst, (topic,)))[0]
    return {q.key: (q.min_offset, q.max_offset) for q in queues}


def test_fail_on_data_loss_both_ways(quiet: Any, make_cluster: Any, tmp_path: Path) -> None:
    spark = quiet
    cluster = make_cluster(RETENTION_CONF, name="retention")
    ns = cluster.namesrv_addr
    first = send(ns, "SparkRet", 8)
    for way in ("strict", "lenient"):  # two queries, each with every one of the 8 in its checkpoint
        run_stream(spark, ns, "SparkRet", tmp_path / way)
    read = {k: v[1] for k, v in queue_ranges(ns, "SparkRet").items()}  # where each checkpoint stands
    with Producer("SparkPG", ns) as p:  # 240 KiB: the log moves on by several segments, the first ones are deleted
        for i in range(60):
            p.send(Message("SparkRet", bytes([65 + i % 26]) * 4096, keys=f"big-{i}"))
    deadline = time.monotonic() + 60
    while True:
        ranges = queue_ranges(ns, "SparkRet")
        if all(ranges[k][0] > read[k] for k in read):
            break
        assert time.monotonic() < deadline, f"retention never deleted past the checkpoints: {ranges} {read}"
        time.sleep(0.2)
    message = one_line_error(lambda: run_stream(spark, ns, "SparkRet", tmp_path / "strict"))
    assert "were deleted (retention) before they were read" in message and "failOnDataLoss=false" in message
    assert any(message.startswith(f"{k}: messages at offsets [{read[k]}, ") for k in read), message
    # failOnDataLoss=false: the lost ranges are skipped (with a warning), everything still there is read once.
    run_stream(spark, ns, "SparkRet", tmp_path / "lenient", failOnDataLoss="false")
    rows = spark.read.parquet(str(tmp_path / "lenient" / "data")).select("msg_id", "queue_id", "queue_offset").collect()
    ids = [r.msg_id for r in rows]
    assert len(ids) == len(set(ids))
    assert set(first) <= set(ids)
    later_total = 0
    for key, (_lo, hi) in queue_ranges(ns, "SparkRet").items():
        qid = int(key.rsplit("/", 1)[1])
        later = sorted(r.queue_offset for r in rows if r.queue_id == qid and r.queue_offset >= read[key])
        if later:  # from where retention had got to, through the queue's end, each once
            assert later == list(range(later[0], hi)) and later[0] >= ranges[key][0], (key, later, hi)
        later_total += len(later)
    assert later_total > 0
