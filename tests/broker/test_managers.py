"""Broker bookkeeping: config files, topics, offsets, subscription groups and the client registry."""

from __future__ import annotations

import pytest

from txmq.broker.clients import ClientRegistry, Subscription
from txmq.broker.config import BrokerConfig
from txmq.broker.offsets import ConsumerOffsetManager
from txmq.broker.subscriptions import SubscriptionGroupManager
from txmq.broker.topics import TopicConfigManager, validate_topic
from txmq.config import camel_to_snake, read_properties
from txmq.errors import ConfigError
from txmq.testing import FakeClock


def test_broker_conf_uses_rocketmq_key_names(tmp_path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text(
        "# a comment\nbrokerClusterName = ClusterX\nbrokerName=broker-b\nbrokerId=0\nlistenPort=20911\n"
        "namesrvAddr=127.0.0.1:9876;127.0.0.1:9877\nflushDiskType=ASYNC_FLUSH\nautoCreateTopicEnable=false\n"
        "brokerIP1=10.1.1.1\ntransactionCheckMax=3\nmappedFileSizeConsumeQueue=6000\n"
    )
    cfg = BrokerConfig.from_file(conf)
    assert (cfg.broker_cluster_name, cfg.broker_name, cfg.listen_port) == ("ClusterX", "broker-b", 20911)
    assert cfg.namesrv_addrs == ["127.0.0.1:9876", "127.0.0.1:9877"]
    assert cfg.flush_disk_type == "ASYNC_FLUSH" and cfg.auto_create_topic_enable is False
    assert cfg.broker_addr == "10.1.1.1:20911" and cfg.transaction_check_max == 3
    assert cfg.extra == {"mappedFileSizeConsumeQueue": "6000"}
    assert cfg.store_properties()["mappedFileSizeConsumeQueue"] == "6000"
    conf.write_text("listenPort=abc\n")
    with pytest.raises(ConfigError, match="listenPort"):
        BrokerConfig.from_file(conf)
    with pytest.raises(ConfigError, match="cannot read"):
        BrokerConfig.from_file(tmp_path / "missing.conf")


def test_properties_parser_and_names() -> None:
    assert read_properties("a=1\n! bang\nb : two words\nc\\\n  ont=3\n") == {"a": "1", "b": "two words", "cont": "3"}
    assert camel_to_snake("brokerIP1") == "broker_ip1"
    assert camel_to_snake("flushIntervalCommitLog") == "flush_interval_commit_log"


def test_topics_system_auto_create_and_persistence(tmp_path) -> None:
    path = tmp_path / "topics.json"
    mgr = TopicConfigManager(path, cluster_name="C", broker_name="b", clock=FakeClock())
    assert mgr.get("TBW102").perm == 7 and mgr.get("SCHEDULE_TOPIC_XXXX").read_queue_nums == 18
    assert mgr.is_system_topic("RMQ_SYS_TRANS_HALF_TOPIC") and mgr.is_system_topic("rmq_sys_x")
    created = mgr.create_from_template("Orders", "TBW102", 4)
    assert (created.write_queue_nums, created.perm) == (4, 6)
    assert mgr.create_from_template("Big", "TBW102", 64).write_queue_nums == 8
    assert mgr.create_from_template("X", "Orders", 4) is None  # no PERM_INHERIT
    v = mgr.data_version["counter"]
    mgr.ensure("%RETRY%G", 1)
    assert mgr.data_version["counter"] == v + 1
    again = TopicConfigManager(path, cluster_name="C", broker_name="b")
    assert again.get("Orders").write_queue_nums == 4 and again.get("%RETRY%G") is not None
    assert "Orders" in again.wrapper()["topicConfigTable"]
    assert validate_topic("ok_topic-1|%") is None
    assert "illegal" in validate_topic("bad topic")
    assert "longer" in validate_topic("x" * 128)
    assert "blank" in validate_topic("")


def test_offsets_persist_only_when_changed(tmp_path) -> None:
    path = tmp_path / "offsets.json"
    mgr = ConsumerOffsetManager(path)
    mgr.commit("G", "T", 0, 5)
    mgr.commit("G", "T", 1, 7)
    assert mgr.persist() is True and mgr.persist() is False
    again = ConsumerOffsetManager(path)
    assert again.query("G", "T", 1) == 7 and again.query("G", "T", 2) is None
    assert again.topics_of_group("G") == ["T"] and again.groups_of_topic("T") == ["G"]
    path.write_text("garbage")
    assert ConsumerOffsetManager(path).table == {}


def test_subscription_groups_auto_create(tmp_path) -> None:
    mgr = SubscriptionGroupManager(tmp_path / "subs.json")
    assert mgr.get("G").retry_max_times == 16
    strict = SubscriptionGroupManager(tmp_path / "subs2.json", auto_create=False)
    assert strict.get("G") is None
    assert SubscriptionGroupManager(tmp_path / "subs.json").groups["G"].retry_queue_nums == 1


def _hb(client_id: str, group: str, sub: str = "*", version: int = 1, cpp: bool = False) -> dict:
    consumer = {
        "groupName": group,
        "consumeType": 1 if cpp else "CONSUME_PASSIVELY",
        "messageModel": 1 if cpp else "CLUSTERING",
        "consumeFromWhere": 0 if cpp else "CONSUME_FROM_LAST_OFFSET",
        "subscriptionDataSet": [{"topic": "T", "subString": sub, "subVersion": str(version) if cpp else version}],
    }
    return {"clientID": client_id, "consumerDataSet": [consumer], "producerDataSet": [{"groupName": "PG"}]}


def test_client_registry_tracks_members_subscriptions_and_expiry() -> None:
    reg = ClientRegistry(expiry_seconds=120)
    a, b = object(), object()
    r1 = reg.heartbeat(a, _hb("c1", "G"), now=0)
    assert r1.changed_groups == ["G"] and r1.new_consumer_groups == ["G"]
    assert reg.heartbeat(a, _hb("c1", "G"), now=10).changed_groups == []
    assert reg.heartbeat(b, _hb("c2", "G", "TagA || TagB", version=2, cpp=True), now=20).changed_groups == ["G"]
    assert reg.consumer_ids("G") == ["c1", "c2"]
    sub = reg.subscription("G", "T")
    assert sub.expression == "TagA || TagB" and sub.matches_code(2598919) and not sub.matches_tag("TagC")
    assert reg.consumers["G"].message_model == "CLUSTERING"
    # An older subVersion does not replace a newer subscription.
    reg.heartbeat(a, _hb("c1", "G", "TagC", version=0), now=21)
    assert reg.subscription("G", "T").expression == "TagA || TagB"
    assert {reg.pick_producer("PG").client_id for _ in range(4)} == {"c1", "c2"}
    reg.heartbeat(b, _hb("c2", "G", "TagA || TagB", version=2, cpp=True), now=100)
    changed, dead = reg.expire(now=145)
    assert changed == ["G"] and dead == [a]
    assert reg.consumer_ids("G") == ["c2"]
    assert reg.connection_closed(b) == ["G"] and reg.pick_producer("PG") is None


def test_subscription_parse() -> None:
    assert Subscription.parse("T", "*").matches_code(12345)
    assert Subscription.parse("T", "").matches_all
    s = Subscription.parse("T", " a ||b||  ")
    assert s.tags == frozenset({"a", "b"}) and not s.matches_code(0)
