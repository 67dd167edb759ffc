"""bench/loadgen (txmq-loadgen), the compiled load generator of bench/bench_rocketmq.py, against `txmq dev`: the
requests it writes by hand must be ones the broker takes as the Java client's (every send answered SEND_OK, every
half message committed by its oneway END_TRANSACTION, each committed copy stored once, nothing left in doubt), or its
figures mean nothing. tests/compat/test_reference.py runs the same windows against Apache RocketMQ.
"""

from __future__ import annotations

import uuid

import pytest

from txmq.client.message import MessageQueue
from txmq.client.sync import Admin, PullConsumer

from .loadgen import window

pytestmark = pytest.mark.slow

WARMUP = 20


def stored(namesrv: str, topic: str, queues: int) -> list[tuple[bytes, dict[str, str]]]:
    """Every message of the topic, read back through the broker."""
    seen = []
    with PullConsumer(f"{topic}_reader", namesrv) as consumer:
        for q in range(queues):
            mq = MessageQueue(topic, "broker-a", q)
            offset = 0
            while True:
                result = consumer.pull(mq, "*", offset, 256)
                if not result.messages:
                    break
                seen += [(m.body, m.properties) for m in result.messages]
                offset = result.next_begin_offset
    return seen


@pytest.mark.parametrize("mode", ["publish", "tx"])
def test_every_send_is_stored_once(txmq_cluster, mode):
    topic = f"Loadgen_{mode}_{uuid.uuid4().hex[:8]}"
    group = f"{topic}_pg"
    namesrv = txmq_cluster.namesrv_addr
    with Admin(namesrv) as admin:
        admin.create_topic(topic, cluster="DefaultCluster", read_queue_nums=4, write_queue_nums=4)
    result = window(namesrv, mode, topic, group, inflight=8, warmup=WARMUP)
    assert result["failed"] == 0
    assert result["count"] > 0
    # For tx the generator waited until every committed copy was in the topic; none may be missing or extra.
    assert result["stored"] == result["count"]
    messages = stored(namesrv, topic, 4)
    assert len(messages) == result["count"] + WARMUP
    assert {body for body, _ in messages} == {b"x" * 1024}
    assert len({props["UNIQ_KEY"] for _, props in messages}) == len(messages)
    if mode == "tx":
        # Committed copies of half messages of the group (txmq clears TRAN_MSG from the copy).
        assert {props.get("PGROUP") for _, props in messages} == {group}
        with Admin(namesrv) as admin:
            assert admin.list_transactions(group=group, states=["PREPARED"]) == []
