"""The official RocketMQ 5.x Java client (``org.apache.rocketmq:rocketmq-client-java``, gRPC) against ``txmq dev``:
producer, SimpleConsumer and PushConsumer scenarios in tests/compat/java5 (built by its build.sh)."""

from __future__ import annotations

import functools
import os
import subprocess
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from tests.cluster_harness import DevCluster
from tests.compat.java_client import JVM_FLAGS
from tests.compat.test_py5_client import create_group, dead_letters

from .cpp_client import parse_events
from .py5_client import of

pytestmark = pytest.mark.slow

JAVA5_DIR = Path(__file__).resolve().parent / "java5"


@functools.cache
def _built() -> Path:
    out = JAVA5_DIR / "target"
    main = out / "classes" / "txmq" / "compat5" / "Main.class"
    newest_source = max(p.stat().st_mtime for p in (JAVA5_DIR / "src").rglob("*.java"))
    if not main.exists() or main.stat().st_mtime < newest_source:
        proc = subprocess.run(["bash", str(JAVA5_DIR / "build.sh")], capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(f"tests/compat/java5/build.sh failed:\n{(proc.stdout + proc.stderr)[-4000:]}")
    return out


@functools.cache
def _home() -> str:
    return tempfile.mkdtemp(prefix="txmq-java5-home-")  # the client logs under ~/logs


def run_java5(args: Sequence[str], timeout: float = 90, *, returncode: int = 0) -> list[dict[str, Any]]:
    out = _built()
    command = [
        "java",
        *JVM_FLAGS,
        f"-Duser.home={_home()}",
        "-cp",
        f"{out / 'classes'}{os.pathsep}{out / 'lib'}/*",
        "txmq.compat5.Main",
        *map(str, args),
    ]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == returncode, (
        f"{' '.join(map(str, args))} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    )
    return parse_events(proc.stdout)


def _name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def test_producer_and_simple_consumer(grpc_cluster: DevCluster) -> None:
    topic, group = _name("TJ5"), _name("GJ5")
    events = run_java5(["produce", grpc_cluster.grpc_endpoint, topic, 5])
    assert of(events, "summary")[0] == {"event": "summary", "sent": 5, "failed": 0}, events
    sent = {e["id"]: e for e in of(events, "sent")}
    got = of(run_java5(["receive", grpc_cluster.grpc_endpoint, topic, group, 5, 20]), "received")
    assert sorted(e["id"] for e in got) == sorted(sent)
    for e in got:
        assert (e["body"], e["tag"], e["topic"], e["attempt"]) == (sent[e["id"]]["body"], "TagJ", topic, 1)
        assert e["index"] == str(sent[e["id"]]["index"])


def test_fifo_producer_and_push_consumer(grpc_cluster: DevCluster) -> None:
    topic, group = _name("TJ5Fifo"), _name("GJ5Fifo")
    events = run_java5(["produce", grpc_cluster.grpc_endpoint, topic, 6, "order-{k}"])
    assert of(events, "summary")[0]["sent"] == 6, events
    consumed = of(run_java5(["push", grpc_cluster.grpc_endpoint, topic, group, 6, 40]), "consumed")
    assert sorted(e["id"] for e in consumed) == sorted(e["id"] for e in of(events, "sent"))
    assert {e["group"] for e in consumed} == {"order-0", "order-1", "order-2"}


def test_push_consumer_failures_end_in_the_dlq(grpc_cluster: DevCluster) -> None:
    topic, group = _name("TJ5Dlq"), _name("GJ5Dlq")
    create_group(grpc_cluster, group, retry_max_times=1)
    sent = of(run_java5(["produce", grpc_cluster.grpc_endpoint, topic, 1]), "sent")
    consumed = of(run_java5(["push", grpc_cluster.grpc_endpoint, topic, group, 2, 40, "fail"]), "consumed")
    assert [(e["id"], e["attempt"]) for e in consumed] == [(sent[0]["id"], 1), (sent[0]["id"], 2)]

    rows = dead_letters(grpc_cluster, group)
    assert [r["originTopic"] for r in rows] == [topic]


def test_transactions_commit_rollback_and_an_orphan_answered_by_a_second_jvm(grpc_cluster: DevCluster) -> None:
    topic, group = _name("TJ5Tx"), _name("GJ5Tx")
    endpoint = grpc_cluster.grpc_endpoint
    committed = run_java5(["transaction", endpoint, topic, 2, "commit"])
    rolled_back = run_java5(["transaction", endpoint, topic, 1, "rollback"])
    assert len(of(committed, "ended")) == 2 and len(of(rolled_back, "ended")) == 1, (committed, rolled_back)
    orphan = run_java5(["transaction", endpoint, topic, 1, "die"], returncode=9)
    [half] = of(orphan, "half")
    second = run_java5(["transaction", endpoint, topic, 0, "commit", 30])
    assert {e["id"] for e in of(second, "checked")} == {half["id"]}, second
    got = of(run_java5(["receive", endpoint, topic, group, 4, 20]), "received")
    assert sorted(e["id"] for e in got) == sorted([*(e["id"] for e in of(committed, "half")), half["id"]])
