"""SQL92 filters on a real ``txmq dev`` process: filtered pulls, long polling, and RocketMQ's error replies.

Messages go in through txmq's own producer with user properties; pulls, heartbeats and CHECK_CLIENT_CONFIG go
over the wire as raw frames, the way the Java client sends them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

import orjson
import pytest

from txmq.client import Message
from txmq.client.sync import Producer, PullConsumer
from txmq.errors import MQBrokerError
from txmq.net import Connection, connect
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.frame import RemotingCommand
from txmq.protocol.headers import PullMessageRequestHeader
from txmq.protocol.record import decode_records

FLAG_SUSPEND = 0x2
FLAG_SUBSCRIPTION = 0x4
UNSUPPORTED = "The broker does not support consumer to filter message by SQL92"
NOT_EXIST = "The broker's consumer filter data is not exist!Your expression may be wrong!"
PARSE_FAILED = "parse the consumer's subscription failed"


@contextmanager
def producer(cluster: object) -> Iterator[Producer]:
    with Producer("PG_SQL", cluster.namesrv_addr) as p:  # type: ignore[attr-defined]
        yield p


def send_all(p: Producer, topic: str, messages: list[tuple[str, dict[str, str], str | None]]) -> None:
    """Send to queue 0 of ``topic`` in order: (body, user properties, tag)."""
    for body, props, tag in messages:
        p.send(Message(topic, body, tags=tag, properties=props), selector=lambda mqs, _m, _a: mqs[0])


async def broker_conn(cluster: object) -> Connection:
    return await connect("127.0.0.1", cluster.broker_port, timeout=5)  # type: ignore[attr-defined]


def pull_cmd(
    topic: str,
    group: str,
    offset: int,
    *,
    expression: str | None,
    expression_type: str = "SQL92",
    with_subscription: bool = True,
    suspend_ms: int = 0,
    sub_version: int = 0,
) -> RemotingCommand:
    header = PullMessageRequestHeader(
        consumerGroup=group,
        topic=topic,
        queueId=0,
        queueOffset=offset,
        maxMsgNums=32,
        sysFlag=(FLAG_SUBSCRIPTION if with_subscription else 0) | (FLAG_SUSPEND if suspend_ms else 0),
        commitOffset=0,
        suspendTimeoutMillis=suspend_ms,
        subscription=expression,
        subVersion=sub_version,
        expressionType=expression_type,
    )
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, header.to_ext())


def heartbeat_cmd(group: str, topic: str, expression: str, version: int = 1700000000000) -> RemotingCommand:
    body = {
        "clientID": "127.0.0.1@sql92-test",
        "consumerDataSet": [
            {
                "groupName": group,
                "consumeType": "CONSUME_PASSIVELY",
                "messageModel": "CLUSTERING",
                "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET",
                "subscriptionDataSet": [
                    {
                        "topic": topic,
                        "subString": expression,
                        "expressionType": "SQL92",
                        "tagsSet": [],
                        "codeSet": [],
                        "subVersion": version,
                        "classFilterMode": False,
                    }
                ],
                "unitMode": False,
            }
        ],
        "producerDataSet": [],
    }
    return RemotingCommand.request(RequestCode.HEART_BEAT, None, orjson.dumps(body))


def check_config_cmd(group: str, topic: str, expression: str, expression_type: str = "SQL92") -> RemotingCommand:
    body = {
        "clientId": "127.0.0.1@sql92-test",
        "group": group,
        "subscriptionData": {
            "topic": topic,
            "subString": expression,
            "expressionType": expression_type,
            "tagsSet": [],
            "codeSet": [],
            "subVersion": 1,
            "classFilterMode": False,
        },
    }
    return RemotingCommand.request(RequestCode.CHECK_CLIENT_CONFIG, None, orjson.dumps(body))


def bodies(resp: RemotingCommand) -> list[bytes]:
    return [r.body for r in decode_records(resp.body)]


TEN = [(f"m{i}", {"a": str(i), "b": "x" if i % 2 == 0 else "y"}, "TagA" if i < 5 else "TagB") for i in range(10)]


async def test_sql92_pulls_return_only_matching_messages(make_cluster) -> None:
    cluster = make_cluster({"enablePropertyFilter": "true"})
    with producer(cluster) as p:
        send_all(p, "SqlTopic", TEN)
    conn = await broker_conn(cluster)
    try:
        # a pull carrying its own subscription (lite pull consumers)
        resp = await conn.request(pull_cmd("SqlTopic", "CG1", 0, expression="a > 5 AND b = 'x'"), 10)
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert bodies(resp) == [b"m6", b"m8"]
        assert resp.ext_fields["nextBeginOffset"] == "10"  # past m9, which was read and rejected

        # system properties are visible: TAGS, and the filters combine
        resp = await conn.request(pull_cmd("SqlTopic", "CG1", 0, expression="TAGS = 'TagB' AND a NOT IN ('9')"), 10)
        assert bodies(resp) == [b"m5", b"m6", b"m7", b"m8"]

        # missing properties are unknown, never matched; IS NULL sees them
        resp = await conn.request(pull_cmd("SqlTopic", "CG1", 0, expression="c = 1 OR c IS NULL AND a < 2"), 10)
        assert bodies(resp) == [b"m0", b"m1"]

        # nothing matches: PULL_RETRY_IMMEDIATELY, and the next offset moves past the rejected messages
        resp = await conn.request(pull_cmd("SqlTopic", "CG1", 3, expression="a > 100"), 10)
        assert resp.code == ResponseCode.PULL_RETRY_IMMEDIATELY
        assert resp.ext_fields["nextBeginOffset"] == "10"

        # a TAG pull on the same broker is unchanged
        resp = await conn.request(pull_cmd("SqlTopic", "CG1", 0, expression="TagA", expression_type="TAG"), 10)
        assert bodies(resp) == [b"m0", b"m1", b"m2", b"m3", b"m4"]

        # the subscription from a heartbeat (push consumers): the pull carries no expression
        hb = await conn.request(heartbeat_cmd("CG2", "SqlTopic", "b = 'y' AND a BETWEEN 2 AND 7"), 10)
        assert hb.code == ResponseCode.SUCCESS
        resp = await conn.request(
            pull_cmd("SqlTopic", "CG2", 0, expression=None, with_subscription=False, sub_version=1700000000000), 10
        )
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert bodies(resp) == [b"m3", b"m5", b"m7"]

        # CHECK_CLIENT_CONFIG (46) accepts a valid expression
        ok = await conn.request(check_config_cmd("CG2", "SqlTopic", "a > 5"), 10)
        assert (ok.code, ok.remark) == (ResponseCode.SUCCESS, None)
    finally:
        conn.close()

    # txmq's own pull consumer with an SQL92 expression
    await asyncio.to_thread(_pull_with_txmq_client, cluster)


def _pull_with_txmq_client(cluster: object) -> None:
    with PullConsumer("CG_PY", cluster.namesrv_addr) as c:  # type: ignore[attr-defined]
        mq = next(q for q in c.fetch_queues("SqlTopic") if q.queue_id == 0)
        result = c.pull(mq, "a >= 7 OR TAGS = 'TagA' AND b = 'y'", 0, expression_type="SQL92")
        assert [m.body for m in result.messages] == [b"m1", b"m3", b"m7", b"m8", b"m9"]
        assert [m.properties["a"] for m in result.messages] == ["1", "3", "7", "8", "9"]
        with pytest.raises(MQBrokerError) as refused:
            c.pull(mq, "a >", 0, expression_type="SQL92")
        assert refused.value.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED


async def test_a_held_sql92_pull_waits_past_messages_that_do_not_match(make_cluster) -> None:
    cluster = make_cluster({"enablePropertyFilter": "true"})
    with producer(cluster) as p:
        send_all(p, "SqlWait", [("old", {"k": "1"}, None)])
        conn = await broker_conn(cluster)
        try:
            held = asyncio.ensure_future(
                conn.request(pull_cmd("SqlWait", "CG", 1, expression="k = 2", suspend_ms=8000), 15)
            )
            await asyncio.sleep(0.5)
            await asyncio.to_thread(send_all, p, "SqlWait", [("no", {"k": "3"}, None)])
            await asyncio.sleep(1.0)
            assert not held.done(), "a message the filter rejects must not answer the held pull"
            await asyncio.to_thread(send_all, p, "SqlWait", [("yes", {"k": "2"}, None)])
            resp = await asyncio.wait_for(held, 5)
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            assert bodies(resp) == [b"yes"]
            assert resp.ext_fields["nextBeginOffset"] == "3"

            # a held pull whose time runs out with only rejected messages moves the offset past them
            resp = await conn.request(pull_cmd("SqlWait", "CG", 3, expression="k = 2", suspend_ms=1500), 10)
            assert resp.code == ResponseCode.PULL_NOT_FOUND
            held = asyncio.ensure_future(
                conn.request(pull_cmd("SqlWait", "CG", 3, expression="k = 2", suspend_ms=1500), 10)
            )
            await asyncio.sleep(0.3)
            await asyncio.to_thread(send_all, p, "SqlWait", [("no2", {"k": "4"}, None)])
            resp = await asyncio.wait_for(held, 5)
            assert resp.code == ResponseCode.PULL_RETRY_IMMEDIATELY
            assert resp.ext_fields["nextBeginOffset"] == "4"
        finally:
            conn.close()


async def test_malformed_expressions_get_rocketmqs_error_replies(make_cluster) -> None:
    cluster = make_cluster({"enablePropertyFilter": "true"})
    with producer(cluster) as p:
        send_all(p, "SqlBad", [("m", {"a": "1"}, None)])
    conn = await broker_conn(cluster)
    try:
        # CHECK_CLIENT_CONFIG: SUBSCRIPTION_PARSE_FAILED with the compile error as the remark
        bad = await conn.request(check_config_cmd("CG", "SqlBad", "a >"), 10)
        assert bad.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED == 23
        assert bad.remark is not None and bad.remark.startswith("Invalid SQL92 expression 'a >'")
        unknown = await conn.request(check_config_cmd("CG", "SqlBad", "a > 1", expression_type="SQL93"), 10)
        assert unknown.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED

        # a pull carrying a malformed expression: SUBSCRIPTION_PARSE_FAILED, then the reason
        resp = await conn.request(pull_cmd("SqlBad", "CG", 0, expression="a = = 1"), 10)
        assert resp.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
        assert resp.remark is not None and resp.remark.startswith(PARSE_FAILED + ": Invalid SQL92 expression")
        # an empty one is refused before anything else, as FilterAPI.build does
        resp = await conn.request(pull_cmd("SqlBad", "CG", 0, expression=""), 10)
        assert (resp.code, resp.remark) == (ResponseCode.SUBSCRIPTION_PARSE_FAILED, PARSE_FAILED)

        # a heartbeat with a malformed expression is accepted; its pulls find no filter data
        hb = await conn.request(heartbeat_cmd("CG3", "SqlBad", "a IN (1)"), 10)
        assert hb.code == ResponseCode.SUCCESS
        resp = await conn.request(
            pull_cmd("SqlBad", "CG3", 0, expression=None, with_subscription=False, sub_version=1700000000000), 10
        )
        assert (resp.code, resp.remark) == (ResponseCode.FILTER_DATA_NOT_EXIST, NOT_EXIST)

        # the connection and the broker keep serving
        resp = await conn.request(pull_cmd("SqlBad", "CG", 0, expression="a = 1"), 10)
        assert resp.code == ResponseCode.SUCCESS and bodies(resp) == [b"m"]
    finally:
        conn.close()


async def test_with_the_filter_disabled_sql92_is_refused_as_rocketmq_does(make_cluster) -> None:
    cluster = make_cluster()  # enablePropertyFilter defaults to false
    with producer(cluster) as p:
        send_all(p, "SqlOff", [("m", {"a": "1"}, None)])
    conn = await broker_conn(cluster)
    try:
        check = await conn.request(check_config_cmd("CG", "SqlOff", "a > 5"), 10)
        assert (check.code, check.remark) == (ResponseCode.SYSTEM_ERROR, UNSUPPORTED)
        # disabled wins over malformed, as in ClientManageProcessor.checkClientConfig
        check = await conn.request(check_config_cmd("CG", "SqlOff", "a >"), 10)
        assert (check.code, check.remark) == (ResponseCode.SYSTEM_ERROR, UNSUPPORTED)
        tag = await conn.request(check_config_cmd("CG", "SqlOff", "TagA", expression_type="TAG"), 10)
        assert tag.code == ResponseCode.SUCCESS

        for expression in ("a = 1", "a >"):
            resp = await conn.request(pull_cmd("SqlOff", "CG", 0, expression=expression), 10)
            assert (resp.code, resp.remark) == (ResponseCode.SYSTEM_ERROR, UNSUPPORTED)

        hb = await conn.request(heartbeat_cmd("CG2", "SqlOff", "a = 1"), 10)
        assert hb.code == ResponseCode.SUCCESS
        resp = await conn.request(
            pull_cmd("SqlOff", "CG2", 0, expression=None, with_subscription=False, sub_version=1700000000000), 10
        )
        assert (resp.code, resp.remark) == (ResponseCode.SYSTEM_ERROR, UNSUPPORTED)
        # a malformed heartbeat expression has no filter data, which PullMessageProcessor checks first
        hb = await conn.request(heartbeat_cmd("CG3", "SqlOff", "a ="), 10)
        assert hb.code == ResponseCode.SUCCESS
        resp = await conn.request(
            pull_cmd("SqlOff", "CG3", 0, expression=None, with_subscription=False, sub_version=1700000000000), 10
        )
        assert (resp.code, resp.remark) == (ResponseCode.FILTER_DATA_NOT_EXIST, NOT_EXIST)

        # TAG pulls are untouched
        resp = await conn.request(pull_cmd("SqlOff", "CG", 0, expression="*", expression_type="TAG"), 10)
        assert resp.code == ResponseCode.SUCCESS and bodies(resp) == [b"m"]
    finally:
        conn.close()
