"""Requests that make a topic are answered once the name server routes it, as on a Java broker.

A consumer's first HEART_BEAT makes ``%RETRY%group``: Java registers it with the name servers from inside the heartbeat
(``TopicConfigManager.createTopicInSendMessageBackMethod`` calls ``registerBrokerAll`` and the heartbeat thread waits
for it). UPDATE_AND_CREATE_TOPIC answers after ``registerIncrementBrokerData`` has heard back from the name servers.
So a client asking for the route right after either finds it. The official Go client relies on that: it reads routes
10 ms after start and then every 30 s, and its push consumer refuses to start on a topic without a route.
"""

from __future__ import annotations

import uuid

import orjson

from txmq.net import connect
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.frame import RemotingCommand


def _heartbeat(group: str) -> RemotingCommand:
    body = {
        "clientID": "127.0.0.1@heartbeat-test",
        "producerDataSet": [],
        "consumerDataSet": [
            {
                "groupName": group,
                "consumeType": "CONSUME_PASSIVELY",
                "messageModel": "CLUSTERING",
                "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET",
                "unitMode": False,
                "subscriptionDataSet": [],
            }
        ],
    }
    return RemotingCommand.request(RequestCode.HEART_BEAT, {}, orjson.dumps(body))


async def test_the_retry_topic_a_heartbeat_makes_is_routed_once_the_heartbeat_is_answered(txmq_cluster) -> None:
    broker = await connect("127.0.0.1", txmq_cluster.broker_port)
    namesrv = await connect("127.0.0.1", txmq_cluster.namesrv_port)
    try:
        for _ in range(10):
            group = f"HeartbeatRetry_{uuid.uuid4().hex[:8]}"
            answer = await broker.request(_heartbeat(group), timeout=10)
            assert answer.code == ResponseCode.SUCCESS, answer.remark
            route = await namesrv.request(
                RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": f"%RETRY%{group}"}), timeout=10
            )
            assert route.code == ResponseCode.SUCCESS, f"%RETRY%{group} has no route yet: {route.remark}"
            assert orjson.loads(route.body)["queueDatas"][0]["readQueueNums"] == 1
    finally:
        broker.close()
        namesrv.close()


async def test_a_topic_made_by_update_and_create_topic_is_routed_once_the_request_is_answered(txmq_cluster) -> None:
    broker = await connect("127.0.0.1", txmq_cluster.broker_port)
    namesrv = await connect("127.0.0.1", txmq_cluster.namesrv_port)
    try:
        for _ in range(10):
            topic = f"CreatedTopic_{uuid.uuid4().hex[:8]}"
            header = {
                "topic": topic,
                "defaultTopic": "TBW102",
                "readQueueNums": "3",
                "writeQueueNums": "3",
                "perm": "6",
                "topicFilterType": "SINGLE_TAG",
                "topicSysFlag": "0",
                "order": "false",
            }
            answer = await broker.request(
                RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, header), timeout=10
            )
            assert answer.code == ResponseCode.SUCCESS, answer.remark
            route = await namesrv.request(
                RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}), timeout=10
            )
            assert route.code == ResponseCode.SUCCESS, f"{topic} has no route yet: {route.remark}"
            assert orjson.loads(route.body)["queueDatas"][0]["readQueueNums"] == 3
    finally:
        broker.close()
        namesrv.close()
