"""The name server over real loopback sockets: registration, routes, KV, bad input, expiry."""

from __future__ import annotations

import zlib

import orjson

from txmq.namesrv.server import NameServer
from txmq.net import connect
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.frame import RemotingCommand
from txmq.testing import FakeClock, aeventually


def _register(name: str, addr: str, topics: dict[str, int], counter: int = 1) -> RemotingCommand:
    body = orjson.dumps(
        {
            "topicConfigSerializeWrapper": {
                "topicConfigTable": {
                    t: {"topicName": t, "readQueueNums": q, "writeQueueNums": q, "perm": 6} for t, q in topics.items()
                },
                "dataVersion": {"timestamp": 1, "counter": counter},
            },
            "filterServerList": [],
        }
    )
    ext = {
        "brokerName": name,
        "brokerAddr": addr,
        "clusterName": "C",
        "haServerAddr": "",
        "brokerId": "0",
        "bodyCrc32": str(zlib.crc32(body) & 0x7FFFFFFF),
    }
    return RemotingCommand.request(RequestCode.REGISTER_BROKER, ext, body)


async def test_register_route_and_expiry() -> None:
    clock = FakeClock()
    ns = NameServer(clock=clock)
    port = await ns.start("127.0.0.1", 0)
    try:
        broker = await connect("127.0.0.1", port)
        resp = await broker.request(_register("broker-a", "127.0.0.1:10911", {"T": 4}), timeout=5)
        assert resp.code == ResponseCode.SUCCESS
        client = await connect("127.0.0.1", port)
        route = await client.request(RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"}), 5)
        assert route.code == 0
        assert b'"brokerAddrs":{"0":"127.0.0.1:10911"}' in route.body
        data = orjson.loads(route.body)
        assert data["queueDatas"][0]["writeQueueNums"] == 4
        missing = await client.request(RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "X"}), 5)
        assert missing.code == ResponseCode.TOPIC_NOT_EXIST and "X" in missing.remark
        topics = await client.request(RemotingCommand.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER), 5)
        assert orjson.loads(topics.body) == {"topicList": ["T"]}
        info = await client.request(RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO), 5)
        assert orjson.loads(info.body)["clusterAddrTable"] == {"C": ["broker-a"]}
        # No re-registration for 120 s: the broker expires on the next 10 s scan.
        await clock.advance(130)
        gone = await client.request(RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"}), 5)
        assert gone.code == ResponseCode.TOPIC_NOT_EXIST
    finally:
        await ns.close()


async def test_broker_connection_close_removes_routes_and_crc_is_checked() -> None:
    ns = NameServer()
    port = await ns.start("127.0.0.1", 0)
    try:
        broker = await connect("127.0.0.1", port)
        bad = _register("b", "127.0.0.1:1", {"T": 1})
        bad.ext_fields["bodyCrc32"] = "12345"
        resp = await broker.request(bad, 5)
        assert resp.code == ResponseCode.SYSTEM_ERROR and "crc32" in resp.remark
        assert (await broker.request(_register("b", "127.0.0.1:1", {"T": 1}), 5)).code == 0
        broker.close()
        client = await connect("127.0.0.1", port)

        async def route_gone() -> bool:
            r = await client.request(RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"}), 5)
            return r.code == ResponseCode.TOPIC_NOT_EXIST

        await aeventually(route_gone, "the closed broker's topic loses its route")
    finally:
        await ns.close()


async def test_kv_config_and_unknown_code_and_missing_fields() -> None:
    ns = NameServer()
    port = await ns.start("127.0.0.1", 0)
    try:
        c = await connect("127.0.0.1", port)
        put = RemotingCommand.request(RequestCode.PUT_KV_CONFIG, {"namespace": "N", "key": "k", "value": "v"})
        assert (await c.request(put, 5)).code == 0
        got = await c.request(RemotingCommand.request(RequestCode.GET_KV_CONFIG, {"namespace": "N", "key": "k"}), 5)
        assert got.ext_fields["value"] == "v"
        await c.request(RemotingCommand.request(RequestCode.DELETE_KV_CONFIG, {"namespace": "N", "key": "k"}), 5)
        got = await c.request(RemotingCommand.request(RequestCode.GET_KV_CONFIG, {"namespace": "N", "key": "k"}), 5)
        assert got.code == ResponseCode.QUERY_NOT_FOUND and "Key: k" in got.remark
        unknown = await c.request(RemotingCommand.request(9999), 5)
        assert unknown.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        assert unknown.remark == " request type 9999 not supported"
        missing = await c.request(RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {}), 5)
        assert missing.code == ResponseCode.SYSTEM_ERROR and "'topic' is missing" in missing.remark
        garbage = RemotingCommand.request(
            RequestCode.REGISTER_BROKER,
            {"brokerName": "b", "brokerAddr": "a:1", "clusterName": "C", "brokerId": "0"},
            b"{nope",
        )
        resp = await c.request(garbage, 5)
        assert resp.code == ResponseCode.SYSTEM_ERROR and "not JSON" in resp.remark
    finally:
        await ns.close()


async def test_delete_topic_in_namesrv_by_cluster_or_everywhere() -> None:
    """DELETE_TOPIC_IN_NAMESRV (216), as mqadmin deleteTopic sends it after deleting the topic on the brokers."""
    ns = NameServer()
    port = await ns.start("127.0.0.1", 0)
    try:
        a = await connect("127.0.0.1", port)
        assert (await a.request(_register("broker-a", "127.0.0.1:1", {"T": 2, "U": 1}), 5)).code == 0
        b = await connect("127.0.0.1", port)
        other_cluster = _register("broker-b", "127.0.0.1:2", {"T": 3})
        other_cluster.ext_fields["clusterName"] = "D"
        assert (await b.request(other_cluster, 5)).code == 0
        c = await connect("127.0.0.1", port)

        async def route(topic: str) -> RemotingCommand:
            return await c.request(RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}), 5)

        delete = RemotingCommand.request(RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "T", "clusterName": "C"})
        assert (await c.request(delete, 5)).code == ResponseCode.SUCCESS
        left = orjson.loads((await route("T")).body)
        assert [q["brokerName"] for q in left["queueDatas"]] == ["broker-b"]  # cluster D keeps its queues

        everywhere = RemotingCommand.request(RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "T"})
        assert (await c.request(everywhere, 5)).code == ResponseCode.SUCCESS
        assert (await route("T")).code == ResponseCode.TOPIC_NOT_EXIST
        assert (await route("U")).code == ResponseCode.SUCCESS
        topics = await c.request(RemotingCommand.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER), 5)
        assert orjson.loads(topics.body) == {"topicList": ["U"]}
    finally:
        await ns.close()
