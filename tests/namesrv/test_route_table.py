"""The name server's route table: registration, routes, expiry and unregistration."""

from __future__ import annotations

from txmq.namesrv.route import KVConfig, RouteTable


def _wrapper(topics: dict[str, int], counter: int = 1) -> dict:
    return {
        "topicConfigTable": {
            t: {"topicName": t, "readQueueNums": q, "writeQueueNums": q, "perm": 6, "topicSysFlag": 0}
            for t, q in topics.items()
        },
        "dataVersion": {"timestamp": 1, "counter": counter},
    }


def _register(
    table: RouteTable, name: str, addr: str, topics: dict[str, int], now: float, counter: int = 1, broker_id: int = 0
) -> None:
    table.register_broker(
        cluster="C",
        broker_addr=addr,
        broker_name=name,
        broker_id=broker_id,
        ha_server_addr="",
        topic_config_wrapper=_wrapper(topics, counter),
        now=now,
    )


def test_route_lists_every_broker_of_a_topic_with_string_keys() -> None:
    table = RouteTable()
    _register(table, "broker-a", "127.0.0.1:10911", {"T": 4, "TBW102": 8}, now=0)
    _register(table, "broker-b", "127.0.0.1:10921", {"T": 2}, now=0)
    route = table.route("T")
    assert route is not None
    assert [q["brokerName"] for q in route["queueDatas"]] == ["broker-a", "broker-b"]
    assert route["brokerDatas"][0]["brokerAddrs"] == {"0": "127.0.0.1:10911"}
    assert route["filterServerTable"] == {} and route["orderTopicConf"] is None
    assert table.route("Nope") is None
    assert table.topics() == ["T", "TBW102"]
    info = table.cluster_info()
    assert info["clusterAddrTable"] == {"C": ["broker-a", "broker-b"]}


def test_queues_update_only_when_data_version_changes() -> None:
    table = RouteTable()
    _register(table, "b", "h:1", {"T": 4}, now=0, counter=1)
    _register(table, "b", "h:1", {"T": 8}, now=1, counter=1)  # same version: table unchanged
    assert table.route("T")["queueDatas"][0]["writeQueueNums"] == 4
    _register(table, "b", "h:1", {"T": 8, "U": 1}, now=2, counter=2)
    assert table.route("T")["queueDatas"][0]["writeQueueNums"] == 8
    _register(table, "b", "h:1", {"U": 1}, now=3, counter=3)  # topic T deleted on the broker
    assert table.route("T") is None and table.route("U") is not None


def test_brokers_expire_after_120_seconds_without_registration() -> None:
    table = RouteTable()
    _register(table, "a", "h:1", {"T": 1}, now=0)
    _register(table, "b", "h:2", {"T": 1}, now=100)
    assert table.expire(now=119) == []
    assert table.expire(now=121) == ["h:1"]
    route = table.route("T")
    assert [b["brokerName"] for b in route["brokerDatas"]] == ["b"]
    assert table.expire(now=300) == ["h:2"]
    assert table.route("T") is None and table.cluster_info()["brokerAddrTable"] == {}


def test_connection_close_and_unregister_remove_the_broker() -> None:
    table = RouteTable()
    conn = object()
    table.register_broker(
        cluster="C",
        broker_addr="h:1",
        broker_name="a",
        broker_id=0,
        ha_server_addr="",
        topic_config_wrapper=_wrapper({"T": 1}),
        now=0,
        connection=conn,
    )
    _register(table, "b", "h:2", {"T": 1}, now=0)
    table.connection_closed(conn)
    assert [b["brokerName"] for b in table.route("T")["brokerDatas"]] == ["b"]
    table.unregister_broker(cluster="C", broker_addr="h:2", broker_name="b", broker_id=0)
    assert table.route("T") is None


def test_slave_registration_learns_the_master() -> None:
    table = RouteTable()
    table.register_broker(
        cluster="C",
        broker_addr="h:1",
        broker_name="a",
        broker_id=0,
        ha_server_addr="h:3",
        topic_config_wrapper=_wrapper({"T": 1}),
        now=0,
    )
    result = table.register_broker(
        cluster="C",
        broker_addr="h:2",
        broker_name="a",
        broker_id=1,
        ha_server_addr="",
        topic_config_wrapper=_wrapper({"T": 9}),
        now=0,
    )
    assert (result.master_addr, result.ha_server_addr) == ("h:1", "h:3")
    assert table.route("T")["queueDatas"][0]["writeQueueNums"] == 1  # slaves never change queue data
    assert table.route("T")["brokerDatas"][0]["brokerAddrs"] == {"0": "h:1", "1": "h:2"}


def test_kv_config_persists(tmp_path) -> None:
    path = str(tmp_path / "kv.json")
    kv = KVConfig(path)
    kv.put("ORDER_TOPIC_CONFIG", "T", "broker-a:4")
    kv.put("NS", "k", "v")
    kv.delete("NS", "k")
    again = KVConfig(path)
    assert again.get("ORDER_TOPIC_CONFIG", "T") == "broker-a:4" and again.get("NS", "k") is None
    (tmp_path / "bad.json").write_text("{not json")
    assert KVConfig(str(tmp_path / "bad.json")).table == {}
