"""The official C++ client (PyPI `rocketmq`, set_session_credentials) against a broker with aclEnable=true.

The C++ client keeps the broker's remark to its own log (docs/cpp-client.md), so refusals are checked on what is
observable: the send fails, the broker logs the reason, and the client's log carries the broker's remark.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from acl_support import (
    PUB_KEY,
    PUB_SECRET,
    SUB_KEY,
    SUB_SECRET,
    TOPIC,
    create_topic,
    start_acl_cluster,
    unique,
    wait_for_log,
)

from compat.cpp_client import EXIT_CLIENT_ERROR, EXIT_DEADLINE, cpp_processes, run_cpp

pytestmark = pytest.mark.slow


@pytest.fixture
def cpp() -> Any:
    with cpp_processes() as start:
        yield start


@pytest.fixture
async def cluster(make_cluster: Any, tmp_path: Path) -> Any:
    c = start_acl_cluster(make_cluster, tmp_path)
    await create_topic(c)
    return c


def credentials(key: str | None, secret: str | None) -> list[str]:
    return [] if key is None else ["--access-key", key, "--secret-key", secret or ""]


def produce(cluster: Any, key: str | None, secret: str | None, count: int = 3, **kwargs: Any) -> list[dict]:
    return run_cpp(
        [
            "produce",
            "--namesrv",
            cluster.namesrv_addr,
            "--topic",
            TOPIC,
            "--count",
            str(count),
            "--body-prefix",
            f"cpp-{key}-",
            *credentials(key, secret),
        ],
        timeout=60,
        **kwargs,
    )


def client_log(events: list[dict]) -> str:
    started = next(e for e in events if e.get("event") == "started")
    path = Path(started["log"])
    return path.read_text(errors="replace") if path.exists() else ""


async def test_the_right_secret_sends_and_consumes_where_permitted(cluster: Any, cpp: Any) -> None:
    events = produce(cluster, PUB_KEY, PUB_SECRET)
    assert events[-1]["event"] == "summary" and events[-1]["sent"] == 3
    consumer = cpp(
        [
            "consume",
            "--namesrv",
            cluster.namesrv_addr,
            "--topic",
            TOPIC,
            "--group",
            unique("cg"),
            "--expect",
            "3",
            "--timeout",
            "60",
            *credentials(SUB_KEY, SUB_SECRET),
        ]
    )
    assert consumer.wait(120) == 0, consumer.events[-3:]
    assert sorted(e["body"] for e in consumer.received()) == [f"cpp-{PUB_KEY}-{i}" for i in range(3)]


async def test_an_account_without_sub_reads_nothing(cluster: Any) -> None:
    produce(cluster, PUB_KEY, PUB_SECRET, count=1)
    events = run_cpp(
        [
            "pull",
            "--namesrv",
            cluster.namesrv_addr,
            "--topic",
            TOPIC,
            "--group",
            unique("pg"),
            "--expect",
            "1",
            "--timeout",
            "5",
            # librocketmq's pull() retries a refused pull at once, forever: the watchdog ends it.
            "--deadline",
            "6",
            *credentials(PUB_KEY, PUB_SECRET),
        ],
        timeout=60,
        expect_returncode=EXIT_DEADLINE,
    )
    assert not [e for e in events if e.get("event") == "received"]
    reason = f"No default permission for topic:{TOPIC} (accessKey={PUB_KEY} needs SUB"
    await wait_for_log(cluster, reason)
    assert f"[TXMQ ACL] {reason}" in client_log(events)


@pytest.mark.parametrize(
    ("key", "secret", "reason"),
    [
        (PUB_KEY, "wrongSecret01", f"Check signature failed for accessKey={PUB_KEY}"),
        ("ghostUser01", "ghostSecret01", "No acl config for ghostUser01"),
        (None, None, "No accessKey is configured"),
        (SUB_KEY, SUB_SECRET, f"No default permission for topic:{TOPIC} (accessKey={SUB_KEY} needs PUB"),
    ],
    ids=["wrong-secret", "unknown-key", "no-key", "no-pub"],
)
async def test_refused_sends(cluster: Any, key: str | None, secret: str | None, reason: str) -> None:
    events = produce(cluster, key, secret, count=1, expect_returncode=EXIT_CLIENT_ERROR)
    summary = next(e for e in events if e.get("event") == "summary")
    assert summary["sent"] == 0 and summary["failed"] == 1
    line = await wait_for_log(cluster, reason)
    assert "ACL denied request code 10" in line
    # The broker's remark reaches the C++ client's log, which is the only place it surfaces.
    assert f"[TXMQ ACL] {reason}" in client_log(events)
