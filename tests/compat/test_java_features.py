"""The official Java client against `txmq dev` with broker features switched on: ACL, SQL92 filters, message trace,
and auto-create off. Each needs a private cluster."""

from __future__ import annotations

import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from txmq.client import MessageQueue
from txmq.client.sync import Admin, PullConsumer

from .java_client import LINES, named, run_java
from .test_java_client import bodies, consume

pytestmark = pytest.mark.slow

AK, SK = "javaUser01", "javaSecret01"


def _name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


@pytest.fixture
def acl_cluster(make_cluster: Any, tmp_path: Path) -> Any:
    acl = textwrap.dedent(
        f"""\
        globalWhiteRemoteAddresses: []
        accounts:
          - accessKey: {AK}
            secretKey: {SK}
            defaultTopicPerm: DENY
            defaultGroupPerm: SUB
            topicPerms:
              - JAclTopic=PUB|SUB
        """
    )
    conf_dir = tmp_path / "acl" / "conf"
    conf_dir.mkdir(parents=True)
    (conf_dir / "plain_acl.yml").write_text(acl)
    return make_cluster({"aclEnable": "true"}, name="acl")


@pytest.mark.parametrize("line", LINES)
def test_acl_hook_right_key_wrong_secret_and_denied_topic(acl_cluster: Any, line: str) -> None:
    """AclClientRPCHook with SessionCredentials: the right key sends and consumes; a wrong secret and a topic outside
    the account's permissions are refused with the broker's reason, and nothing is stored for them."""
    ns = acl_cluster.namesrv_addr
    creds = ("--ak", AK, "--sk", SK)
    events = run_java(line, "produce", "--namesrv", ns, "--topic", "JAclTopic", "--count", "2", *creds,
                      "--body-prefix", f"acl-{line}-")  # fmt: skip
    assert [e["status"] for e in named(events, "sent")] == ["SEND_OK"] * 2, events
    received = consume(line, ns, "JAclTopic", 2, *creds)
    assert {b for b in bodies(received) if b.startswith(f"acl-{line}-")} == {f"acl-{line}-0", f"acl-{line}-1"}

    events = run_java(line, "produce", "--namesrv", ns, "--topic", "JAclTopic", "--ak", AK, "--sk", "wrongSecret1",
                      "--retries", "0")  # fmt: skip
    [error] = named(events, "error")
    assert "Check signature failed" in error["cause"], error
    events = run_java(line, "produce", "--namesrv", ns, "--topic", "JAclDenied", *creds, "--retries", "0")
    [error] = named(events, "error")
    assert "JAclDenied" in error["cause"] and "permission" in error["cause"].lower(), error
    events = run_java(line, "produce", "--namesrv", ns, "--topic", "JAclTopic", "--retries", "0")
    [error] = named(events, "error")
    assert "accesskey" in error["cause"].lower(), error
    assert "Traceback" not in acl_cluster.log_text()


@pytest.mark.parametrize("line", LINES)
def test_sql92_selector(make_cluster: Any, line: str) -> None:
    """MessageSelector.bySql with enablePropertyFilter=true: only matching messages arrive."""
    cluster = make_cluster({"enablePropertyFilter": "true"}, name="sql")
    ns = cluster.namesrv_addr
    topic = _name("JSql")
    run_java(line, "produce", "--namesrv", ns, "--topic", topic, "--count", "10", "--tag", "TagA",
             "--prop", "a={i}", "--prop", "region=eu")  # fmt: skip
    run_java(line, "produce", "--namesrv", ns, "--topic", topic, "--count", "4", "--tag", "TagB",
             "--prop", "a={i}", "--prop", "region=us", "--body-prefix", "us-")  # fmt: skip
    received = consume(line, ns, topic, 4, "--sql", "a > 5 AND region = 'eu' AND TAGS IN ('TagA')")
    assert bodies(received) == dict.fromkeys(("m-6", "m-7", "m-8", "m-9"), 1)
    received = consume(line, ns, topic, 3, "--sql", "region = 'us' AND a BETWEEN 1 AND 3")
    assert bodies(received) == dict.fromkeys(("us-1", "us-2", "us-3"), 1)


def test_sql92_refusals_are_the_clients_usual_errors(make_cluster: Any) -> None:
    """A malformed expression, or SQL92 on a broker without enablePropertyFilter: consumer.start() fails with
    MQClientException carrying the broker's code (CHECK_CLIENT_CONFIG), and the broker keeps serving."""
    # The client checks its subscriptions with the brokers of each topic, so the topics exist beforehand.
    on = make_cluster({"enablePropertyFilter": "true"}, name="sqlon")
    topic = _name("JSqlBad")
    with Admin(on.namesrv_addr) as admin:
        admin.create_topic(topic, cluster="DefaultCluster")
    events = run_java("v4", "consume", "--namesrv", on.namesrv_addr, "--topic", topic,
                      "--group", _name("JSqlCG"), "--sql", "a >> 'x")  # fmt: skip
    [error] = named(events, "error")
    assert error["type"].endswith("MQClientException") and error["code"] == 23, error
    off = make_cluster({}, name="sqloff")
    topic = _name("JSqlOff")
    with Admin(off.namesrv_addr) as admin:
        admin.create_topic(topic, cluster="DefaultCluster")
    events = run_java("v5", "consume", "--namesrv", off.namesrv_addr, "--topic", topic,
                      "--group", _name("JSqlCG"), "--sql", "a > 1")  # fmt: skip
    [error] = named(events, "error")
    assert error["code"] == 1 and "SQL92" in error["message"], error
    for cluster in (on, off):
        assert "Traceback" not in cluster.log_text()


def test_message_trace_lands_in_the_trace_topic(txmq_cluster: Any) -> None:
    """enableMsgTrace=true: sends and consumes still work, and the trace records (Pub, SubBefore, SubAfter) reach
    RMQ_SYS_TRACE_TOPIC naming the message."""
    ns = txmq_cluster.namesrv_addr
    topic = _name("JTrace")
    sent = named(run_java("v4", "produce", "--namesrv", ns, "--topic", topic, "--count", "2", "--trace"), "sent")
    assert len(sent) == 2
    assert len(consume("v4", ns, topic, 2, "--trace", "--settle", "6000")) == 2
    traces = []
    with Admin(ns) as admin:
        route = admin.topic_route("RMQ_SYS_TRACE_TOPIC")
    with PullConsumer(_name("TraceReader"), ns) as reader:
        for qd in route.queue_datas:
            for qid in range(qd.read_queue_nums):
                result = reader.pull(MessageQueue("RMQ_SYS_TRACE_TOPIC", qd.broker_name, qid), "*", 0, 64)
                # A trace message holds one or more records, each ended by \x02, fields split by \x01.
                traces += [r for m in result.messages for r in m.body.decode().split("\x02") if r]
    for e in sent:
        mine = [t for t in traces if e["msgId"] in t]
        kinds = {t.split("\x01")[0] for t in mine}
        assert {"Pub", "SubBefore", "SubAfter"} <= kinds, (e, traces[:4])


def test_unknown_topic_with_auto_create_off(make_cluster: Any) -> None:
    """autoCreateTopicEnable=false: a send to an unknown topic fails with the client's "No route info" exception;
    after the topic is created it works."""
    cluster = make_cluster({"autoCreateTopicEnable": "false"}, name="noauto")
    ns = cluster.namesrv_addr
    topic = _name("JNoAuto")
    events = run_java("v4", "produce", "--namesrv", ns, "--topic", topic, "--retries", "0")
    [error] = named(events, "error")
    assert error["type"].endswith("MQClientException") and "No route info" in error["message"], error
    with Admin(ns) as admin:
        admin.create_topic(topic, cluster="DefaultCluster")
    assert named(run_java("v4", "produce", "--namesrv", ns, "--topic", topic), "sent")[0]["status"] == "SEND_OK"
