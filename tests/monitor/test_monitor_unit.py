"""Pieces of the metrics and the console without a browser: who may log in as what, the charts' history, the
label limit, and that the core never imports the monitoring code."""

from __future__ import annotations

import logging
import re
import socket
from pathlib import Path

import pytest

from txmq.acl.config import parse_acl_text
from txmq.acl.decision import compile_acl
from txmq.broker.metrics import _top, request_code_name, response_code_name
from txmq.console.app import History, account_role
from txmq.protocol.codes import RequestCode
from txmq.protocol.frame import RemotingCommand
from txmq.testing import InProcessBroker

ACL = """\
accounts:
  - accessKey: adminUser01
    secretKey: adminSecret01
    admin: true
  - accessKey: readerUser1
    secretKey: readerSecret1
    defaultTopicPerm: DENY
    topicPerms:
      - Orders=SUB
  - accessKey: pubOnlyUser
    secretKey: pubOnlySecret
    defaultTopicPerm: PUB
    defaultGroupPerm: DENY
"""


def test_account_roles_from_plain_acl() -> None:
    state, _ = compile_acl([parse_acl_text(ACL, "plain_acl.yml")])
    assert account_role(state, "adminUser01", "adminSecret01") == "admin"
    assert account_role(state, "readerUser1", "readerSecret1") == "reader"  # SUB on one topic is enough to read
    assert account_role(state, "pubOnlyUser", "pubOnlySecret") is None  # no SUB anywhere
    assert account_role(state, "adminUser01", "adminSecret0") is None
    assert account_role(state, "nobodyHere1", "adminSecret01") is None
    assert account_role(state, "", "") is None


def test_history_keeps_an_hour_of_rates_and_lag() -> None:
    history = History(seconds=60, every=10)
    history.add_totals(1000.0, 100, 50)
    assert list(history.throughput) == []  # a rate needs two samples
    history.add_totals(1010.0, 400, 80)
    assert list(history.throughput) == [(1010.0, 30.0, 3.0)]
    history.add_totals(1020.0, 10, 80)  # counters restarted with the broker: no negative rate
    assert history.throughput[-1] == (1020.0, 0.0, 0.0)
    for i in range(20):
        history.add_lag(1000.0 + 10 * i, "G", i)
    assert len(history.lag["G"]) == 7 and history.lag["G"][-1] == (1190.0, 19)


def test_label_limit_keeps_the_largest_and_sums_the_rest() -> None:
    items = [(f"t{i}", float(i)) for i in range(10)]
    kept, rest, others = _top(items, 3)
    assert sorted(k for k, _ in kept) == ["t7", "t8", "t9"] and rest == sum(range(7)) and others
    kept, rest, others = _top(items, 10)
    assert len(kept) == 10 and rest == 0 and not others


def test_code_names_are_rocketmq_constant_names() -> None:
    assert request_code_name(310) == "send_message_v2"
    assert request_code_name(37) == "end_transaction"
    assert request_code_name(1300) == "txmq_list_transactions"
    assert request_code_name(99999) == "99999"
    assert response_code_name(0) == "success" and response_code_name(17) == "topic_not_exist"


def test_the_core_does_not_import_the_monitoring_code() -> None:
    src = Path(__file__).resolve().parents[2] / "src" / "txmq"
    pattern = re.compile(
        r"^\s*(import prometheus_client|from prometheus_client|import aiohttp|from aiohttp|"
        r"from txmq\.broker\.metrics|from txmq\.console|import txmq\.console)",
        re.M,
    )
    core = [src / "store", src / "txn", src / "acl", src / "protocol", src / "net", src / "broker", src / "client"]
    offenders = sorted(
        str(p.relative_to(src)) for folder in core for p in folder.rglob("*.py") if pattern.search(p.read_text())
    )
    # app.py is the composition root (it imports them inside the functions that build them); metrics.py is itself.
    assert offenders == ["broker/app.py", "broker/metrics.py"], offenders


async def test_a_taken_metrics_port_leaves_the_broker_serving_without_metrics(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        broker = InProcessBroker(tmp_path, metrics_port=port)
        with caplog.at_level(logging.ERROR, logger="txmq.broker"):
            started = await broker.start()
        try:
            assert started.app.metrics_server is None
            assert f"the metrics port 127.0.0.1:{port} cannot be bound" in caplog.text
            assert "set metricsPort to a free port, or 0" in caplog.text
            conn = await broker.connect()  # the broker itself serves
            answer = await conn.request(RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO, {}), timeout=5)
            assert answer.code == 0
        finally:
            await broker.stop()
