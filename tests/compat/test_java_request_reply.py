"""Request-reply with the official Java client (RocketMQ 4.6+): DefaultMQProducer.request() against a push consumer
that answers with MessageUtil.createReplyMessage. The broker pushes each reply to the requester's connection
(SEND_REPLY_MESSAGE -> PUSH_REPLY_MESSAGE_TO_CLIENT) and keeps a copy on <cluster>_REPLY_TOPIC."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from txmq.client.sync import Admin, PullConsumer

from .java_client import LINES, JavaProcess, named, run_java

pytestmark = pytest.mark.slow


def _name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize("line", LINES)
def test_request_gets_the_consumers_reply(txmq_cluster: Any, line: str) -> None:
    ns = txmq_cluster.namesrv_addr
    topic = _name("JReq")
    with Admin(ns) as admin:  # first: a push consumer finds a topic created later only at its next route poll (30 s)
        admin.create_topic(topic, cluster="DefaultCluster")
    replier = JavaProcess(line, "replier", ["--namesrv", ns, "--topic", topic, "--group", _name("JRep"),
                                            "--expect", "3", "--timeout", "90"])  # fmt: skip
    try:
        replier.wait_event("ready", 60)
        events = run_java(line, "request", "--namesrv", ns, "--topic", topic, "--count", "3",
                          "--body-prefix", "ask-", "--group", _name("JReqPG"))  # fmt: skip
    finally:
        replied = replier.finish(120)
    assert named(events, "summary") == [{"event": "summary", "failed": 0}], events
    replies = named(events, "reply")
    assert [(e["i"], e["body"]) for e in replies] == [(i, f"re:ask-{i}") for i in range(3)], events
    assert {e["topic"] for e in replies} == {"DefaultCluster_REPLY_TOPIC"}
    assert all(e["properties"]["MSG_TYPE"] == "reply" and e["properties"]["CORRELATION_ID"] for e in replies)
    assert {e["status"] for e in named(replied, "replied")} == {"SEND_OK"}

    # storeReplyMessageEnable (the default): each reply is also on the reply topic.
    with PullConsumer(_name("JReplyReader"), ns) as reader:
        stored = []
        for mq in reader.fetch_queues("DefaultCluster_REPLY_TOPIC"):
            stored += [m.body.decode() for m in reader.pull(mq, "*", 0, 1000).messages]
    assert {f"re:ask-{i}" for i in range(3)} <= set(stored)


def test_txmq_client_request_gets_a_java_reply(txmq_cluster: Any) -> None:
    """Interop: txmq's own client asks (Producer.request), the Java client answers."""
    from txmq.client import Message
    from txmq.client.sync import Producer

    ns = txmq_cluster.namesrv_addr
    topic = _name("JReqPy")
    with Admin(ns) as admin:
        admin.create_topic(topic, cluster="DefaultCluster")
    replier = JavaProcess("v5", "replier", ["--namesrv", ns, "--topic", topic, "--group", _name("JRep"),
                                            "--expect", "2", "--timeout", "90"])  # fmt: skip
    try:
        replier.wait_event("ready", 60)
        with Producer(_name("PyReqPG"), ns) as producer:
            replies = [producer.request(Message(topic, f"py-{i}".encode()), timeout=20) for i in range(2)]
    finally:
        replier.finish(120)
    assert [r.body for r in replies] == [b"re:py-0", b"re:py-1"]


def test_a_reply_reaches_a_requester_that_never_sent_a_heartbeat(txmq_cluster: Any) -> None:
    """The broker remembers the connection a request came on (its REPLY_TO_CLIENT), so the reply is pushed there even
    before the requester's first heartbeat (a loaded client may send its request first)."""
    import asyncio

    from txmq.net import connect
    from txmq.protocol.codes import RequestCode, ResponseCode
    from txmq.protocol.frame import RemotingCommand

    topic = _name("RawReq")
    with Admin(txmq_cluster.namesrv_addr) as admin:
        admin.create_topic(topic, cluster="DefaultCluster")

    def ext(to: str, props: str) -> dict[str, str]:
        return {
            "producerGroup": "RawPG", "topic": to, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
            "queueId": "0", "sysFlag": "0", "bornTimestamp": "0", "flag": "0", "properties": props,
            "reconsumeTimes": "0", "unitMode": "false", "batch": "false",
        }  # fmt: skip

    async def main() -> tuple[int, list[RemotingCommand]]:
        pushed: list[RemotingCommand] = []

        def on_push(conn: Any, cmd: RemotingCommand) -> RemotingCommand:
            pushed.append(cmd)
            return cmd.response(ResponseCode.SUCCESS)

        requester = await connect("127.0.0.1", txmq_cluster.broker_port, on_push)
        replier = await connect("127.0.0.1", txmq_cluster.broker_port)
        try:
            ask = "CORRELATION_ID\x01c-raw\x02REPLY_TO_CLIENT\x01raw@requester\x02TTL\x013000\x02"
            sent = await requester.request(RemotingCommand.request(RequestCode.SEND_MESSAGE, ext(topic, ask), b"q"), 10)
            assert sent.code == ResponseCode.SUCCESS, sent.remark
            answer = "CORRELATION_ID\x01c-raw\x02REPLY_TO_CLIENT\x01raw@requester\x02MSG_TYPE\x01reply\x02"
            reply = RemotingCommand.request(
                RequestCode.SEND_REPLY_MESSAGE, ext("DefaultCluster_REPLY_TOPIC", answer), b"a"
            )
            resp = await replier.request(reply, 10)
            return resp.code, pushed
        finally:
            requester.close()
            replier.close()

    code, pushed = asyncio.run(main())
    assert code == ResponseCode.SUCCESS
    [push] = pushed
    assert push.code == RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT and push.body == b"a"
    assert "c-raw" in push.ext_fields["properties"]


def test_a_reply_whose_requester_is_gone_is_refused(txmq_cluster: Any) -> None:
    """A reply to a client that is not connected gets SYSTEM_ERROR naming it; the broker goes on serving."""
    import asyncio

    from txmq.net import connect
    from txmq.protocol.codes import RequestCode, ResponseCode
    from txmq.protocol.frame import RemotingCommand

    async def main() -> tuple[int, str | None]:
        conn = await connect("127.0.0.1", txmq_cluster.broker_port)
        try:
            ext = {
                "producerGroup": "G", "topic": "DefaultCluster_REPLY_TOPIC", "defaultTopic": "TBW102",
                "defaultTopicQueueNums": "4", "queueId": "0", "sysFlag": "0", "bornTimestamp": "0", "flag": "0",
                "properties": "CORRELATION_ID\x01c1\x02REPLY_TO_CLIENT\x01nobody@1\x02MSG_TYPE\x01reply\x02",
                "reconsumeTimes": "0", "unitMode": "false", "batch": "false",
            }  # fmt: skip
            resp = await conn.request(RemotingCommand.request(RequestCode.SEND_REPLY_MESSAGE, ext, b"r"), timeout=10)
            return resp.code, resp.remark
        finally:
            conn.close()

    code, remark = asyncio.run(main())
    assert code == ResponseCode.SYSTEM_ERROR and "nobody@1" in (remark or ""), remark
