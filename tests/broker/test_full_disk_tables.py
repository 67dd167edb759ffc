"""The topic and subscription-group tables on a full disk (a real size-limited tmpfs; mounting needs root).

Found by the quick fault campaign in CI (stop 30): a consumer's heartbeat auto-creates its subscription group and
retry topic, and writing the tables raised ENOSPC, which the door logged as a handler failure and answered with an
error. Automatic creation now keeps the change in memory, says why in a warning, and writes it once there is room
(the broker's persist loop, or the next change); a change an operator asks for is refused and leaves the table as
it was. RocketMQ's ConfigManager also keeps a change whose file write failed in memory and logs it."""

from __future__ import annotations

import asyncio
import errno
from pathlib import Path

import orjson
import pytest

from txmq.broker.subscriptions import SubscriptionGroupConfig, SubscriptionGroupManager
from txmq.broker.topics import TopicConfig, TopicConfigManager
from txmq.chaos.common import create_topics, read_topic
from txmq.chaos.fuzz import unhandled_lines
from txmq.client import Message, Producer
from txmq.testing import DevCluster, eventually, fill, small_tmpfs, tmpfs_unavailable


def _managers(where: Path) -> tuple[TopicConfigManager, SubscriptionGroupManager]:
    topics = TopicConfigManager(where / "topics.json", cluster_name="C", broker_name="b")
    groups = SubscriptionGroupManager(where / "subscriptionGroup.json")
    return topics, groups


def _full(exc: pytest.ExceptionInfo[OSError]) -> bool:
    return exc.value.errno == errno.ENOSPC


def test_automatic_creation_waits_for_room_and_operator_changes_are_refused(
    small_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    where = small_disk / "config"
    topics, groups = _managers(where)
    topics.upsert(TopicConfig("Before", 4, 4))
    groups.upsert(SubscriptionGroupConfig("GroupBefore"))
    ballast = small_disk / "ballast"
    fill(ballast, leave=0)

    # automatic creation (a heartbeat's, a pull's, a send's) succeeds in memory
    assert topics.ensure("%RETRY%G", 1) == (TopicConfig("%RETRY%G", 1, 1), True)
    assert topics.create_from_template("Auto", "TBW102", 4) is not None
    assert groups.get("G") == SubscriptionGroupConfig("G")
    assert groups.get("G2") == SubscriptionGroupConfig("G2")
    # an operator's change is refused with the disk's error and leaves the table as it was
    with pytest.raises(OSError) as refused:
        topics.upsert(TopicConfig("Before", 8, 8))
    assert _full(refused) and topics.get("Before") == TopicConfig("Before", 4, 4)
    with pytest.raises(OSError) as refused:
        topics.upsert(TopicConfig("Explicit", 1, 1))
    assert _full(refused) and topics.get("Explicit") is None
    with pytest.raises(OSError) as refused:
        topics.delete("Before")
    assert _full(refused) and topics.get("Before") is not None
    with pytest.raises(OSError) as refused:
        groups.upsert(SubscriptionGroupConfig("Explicit"))
    assert _full(refused) and "Explicit" not in groups.groups
    with pytest.raises(OSError) as refused:
        groups.delete("GroupBefore")
    assert _full(refused) and "GroupBefore" in groups.groups

    # the files still hold what was written before the disk filled; retrying while full is quiet
    topics.save_unsaved()
    groups.save_unsaved()
    warned = [r.getMessage() for r in caplog.records if "not saved, the disk is full" in r.getMessage()]
    assert len(warned) == 2 and "topic config" in warned[0] and "subscription groups" in warned[1], warned
    on_disk_topics, on_disk_groups = _managers(where)
    assert "Before" in on_disk_topics.topics and "%RETRY%G" not in on_disk_topics.topics
    assert "GroupBefore" in on_disk_groups.groups and "G" not in on_disk_groups.groups

    ballast.unlink()
    topics.save_unsaved()
    groups.save_unsaved()
    on_disk_topics, on_disk_groups = _managers(where)
    assert {"Before", "%RETRY%G", "Auto"} <= set(on_disk_topics.topics)
    assert on_disk_topics.data_version == topics.data_version
    assert {"GroupBefore", "G"} <= set(on_disk_groups.groups)


def test_a_new_consumer_group_reads_from_a_broker_whose_disk_is_full(tmp_path: Path) -> None:
    why_not = tmpfs_unavailable()
    if why_not:
        pytest.skip(why_not)
    with small_tmpfs(tmp_path / "disk", 40) as disk:
        cluster = DevCluster(
            disk / "broker",
            {"mappedFileSizeCommitLog": str(2 << 20), "cleanFileForciblyEnable": "false", "grpcListenPort": "0"},
        ).start(timeout=60)
        try:

            async def scenario() -> tuple[list[bytes], list[bytes]]:
                await create_topics(cluster.namesrv_addr, {"FullDiskTopic": 2})
                async with Producer("FullDiskProducers", cluster.namesrv_addr, instance_name="fd-p") as producer:
                    sent = [b"m%d" % n for n in range(20)]
                    for body in sent:
                        await producer.send(Message("FullDiskTopic", body))
                fill(disk / "ballast", leave=0)
                got = [m.body for m in await read_topic(cluster.namesrv_addr, "FullDiskTopic")]
                return sent, got

            sent, got = asyncio.run(scenario())
            assert sorted(got) == sorted(sent)
            log = cluster.log_text()
            assert unhandled_lines(log) == []
            assert "not saved, the disk is full" in log  # the group and its retry topic wait for room
            (disk / "ballast").unlink()
            config = disk / "broker" / "store" / "config"

            def saved(name: str, table: str) -> set[str]:
                path = config / name
                return set(orjson.loads(path.read_bytes())[table]) if path.exists() else set()

            eventually(lambda: "ChaosReader" in saved("subscriptionGroup.json", "subscriptionGroupTable"), timeout=20)
            eventually(lambda: "%RETRY%ChaosReader" in saved("topics.json", "topicConfigTable"), timeout=20)
        finally:
            cluster.stop()
