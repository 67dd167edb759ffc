"""Orderly consumption with three consumer processes, one killed with SIGKILL mid-run."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from txmq.client import Message
from txmq.client.sync import Admin, Producer
from txmq.testing import eventually

CHILD = Path(__file__).with_name("orderly_child.py")
QUEUES = 4
PER_QUEUE = 40
LOCK_LIFETIME_S = 4


class Children:
    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, *args: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, str(CHILD), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        self.procs.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "ready", f"child did not start: {line!r}"
        return proc

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


@pytest.fixture
def children() -> Iterator[Children]:
    kids = Children()
    yield kids
    kids.close()


def read_events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def test_orderly_three_consumers_one_killed(make_cluster: Any, children: Children, tmp_path: Path) -> None:
    cluster = make_cluster({"txmqLockMaxLiveTimeMills": str(LOCK_LIFETIME_S * 1000)})
    ns = cluster.namesrv_addr
    topic, group = "OrderlyT", "OrderlyG"
    with Admin(ns) as admin:
        admin.create_topic(topic, broker_addr=cluster.broker_addr, read_queue_nums=QUEUES, write_queue_nums=QUEUES)
    with Producer("OrderlyP", ns) as producer:
        queues = sorted(producer.fetch_publish_queues(topic))
        assert len(queues) == QUEUES
        for i in range(PER_QUEUE):
            for mq in queues:
                producer.send(Message(topic, f"q{mq.queue_id}-{i}".encode()), queue=mq)
    out = tmp_path / "events.jsonl"
    args = (ns, group, topic, str(out), str(LOCK_LIFETIME_S))

    def ended() -> set[tuple[int, int]]:
        return {(e["q"], e["off"]) for e in read_events(out) if e["ev"] == "end"}

    first = children.start(*args)
    eventually(lambda: len(ended()) >= 10, "the first consumer processes messages", timeout=90)
    children.start(*args)
    children.start(*args)
    eventually(lambda: len(ended()) >= QUEUES * PER_QUEUE * 0.4, "40% processed", timeout=90)
    # Kill the member that is processing right now (the first one holds queues in every allocation of 4 over 3).
    victim = first
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    kill_ns = time.time_ns()
    eventually(lambda: len(ended()) == QUEUES * PER_QUEUE, "every message processed after the kill", timeout=90)
    events = read_events(out)
    pids = {e["pid"] for e in events}
    assert len(pids) >= 2, "the survivors never took over"
    victim_queues = {e["q"] for e in events if e["pid"] == victim.pid and e["t"] > kill_ns - 2_000_000_000}
    taken_over = {e["q"] for e in events if e["pid"] != victim.pid and e["t"] >= kill_ns}
    assert victim_queues & taken_over, "the victim was not consuming when it was killed, or nobody took over"

    for q in range(QUEUES):
        qe = sorted((e for e in events if e["q"] == q), key=lambda e: e["t"])
        # 1. No two processings of this queue overlap in time, whoever runs them.
        intervals: list[tuple[int, int, int, int]] = []  # start, end, pid, offset
        succeeded: list[tuple[int, int, int]] = []  # start, pid, offset of processings that ended well
        open_: dict[int, dict[str, Any]] = {}
        for e in qe:
            if e["ev"] == "start":
                assert e["pid"] not in open_, f"queue {q}: pid {e['pid']} started two messages at once"
                open_[e["pid"]] = e
            else:
                s = open_.pop(e["pid"])
                assert s["off"] == e["off"]
                intervals.append((s["t"], e["t"], e["pid"], e["off"]))
                if e["ev"] == "end":
                    succeeded.append((s["t"], e["pid"], e["off"]))
        for pid, s in open_.items():  # the victim died mid-processing
            assert pid == victim.pid, f"queue {q}: pid {pid} left a processing unfinished"
            intervals.append((s["t"], kill_ns, pid, s["off"]))
        intervals.sort()
        for a, b in itertools.pairwise(intervals):
            assert b[0] >= a[1], f"queue {q}: offset {a[3]} (pid {a[2]}) and {b[3]} (pid {b[2]}) overlapped"
        # 2. In order: the next processing is the same message again (local retry, or a takeover re-processing
        #    what the victim had not committed) or the next one; never a skip, never back within one member's run.
        starts = [e for e in qe if e["ev"] == "start"]
        assert starts[0]["off"] == 0
        for a, b in itertools.pairwise(starts):
            if b["pid"] == a["pid"]:
                assert b["off"] in (a["off"], a["off"] + 1), f"queue {q}: {a['off']} then {b['off']} in pid {a['pid']}"
            else:
                assert b["off"] <= a["off"] + 1, f"queue {q}: skipped from {a['off']} to {b['off']} at a handover"
        # 3. A message processed successfully twice: only because the victim died before committing it, and the
        #    second processing started after the kill (after the victim's lock expired).
        done_by: dict[int, list[tuple[int, int]]] = {}
        for start, pid, off in succeeded:
            done_by.setdefault(off, []).append((pid, start))
        for off, runs in done_by.items():
            if len(runs) > 1:
                assert any(pid == victim.pid for pid, _ in runs), f"queue {q}: offset {off} processed twice: {runs}"
                later = [start for pid, start in runs if pid != victim.pid]
                assert all(t >= kill_ns for t in later), f"queue {q}: offset {off} re-processed before the kill"
        # 4. Every failing message was retried by the same member right after its failure (no re-ordering).
        for e in qe:
            if e["ev"] == "fail":
                following = [s for s in starts if s["t"] > e["t"]]
                if following and following[0]["pid"] == e["pid"]:
                    assert following[0]["off"] == e["off"]
