"""What the campaign parts share: creating a topic on a fresh cluster, reading a topic back whole, counting a
broker that died."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from txmq.chaos.report import PartResult
from txmq.client import Admin, MessageExt, PullConsumer, PullStatus
from txmq.testing import DevCluster


async def create_topics(namesrv: str, topics: dict[str, int]) -> None:
    """Create each topic (name -> queue count) on the cluster's brokers and wait until the name server routes it."""
    async with Admin(namesrv, instance_name=f"chaos-admin-{time.monotonic_ns()}") as admin:
        (cluster,) = (await admin.cluster_info()).clusters
        for topic, queues in topics.items():
            await admin.create_topic(topic, cluster=cluster, read_queue_nums=queues, write_queue_nums=queues)
        for topic in topics:
            deadline = time.monotonic() + 20
            while True:
                try:
                    await admin.topic_route(topic)
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.1)


async def read_topic(namesrv: str, topic: str, *, tolerate_errors: bool = False) -> list[MessageExt]:
    """Every message stored in ``topic``, queue by queue from offset 0, in queue order. With ``tolerate_errors`` a
    queue whose pull fails is read up to there."""
    out: list[MessageExt] = []
    async with PullConsumer("ChaosReader", namesrv, instance_name=f"chaos-r{time.monotonic_ns()}") as reader:
        for mq in sorted(await reader.fetch_queues(topic), key=lambda q: q.queue_id):
            offset = 0
            while True:
                try:
                    result = await reader.pull(mq, "*", offset, 32)
                except Exception:
                    if not tolerate_errors:
                        raise
                    break
                if result.status is PullStatus.NO_MATCHED_MSG and result.next_begin_offset > offset:
                    offset = result.next_begin_offset  # nothing servable there (a damaged record): move on
                    continue
                if result.status is not PullStatus.FOUND:
                    break
                out.extend(result.messages)
                offset = result.next_begin_offset
    return out


def check_broker(cluster: DevCluster, result: PartResult, when: str, *, restart: bool) -> None:
    """Count a broker crash (its process is gone) as ``broker_crashes``; with ``restart``, start it again."""
    if cluster.proc is None or cluster.proc.poll() is not None:
        result.fail("broker_crashes", f"the broker died {when}")
        if restart:
            cluster.proc = None
            cluster.start(timeout=60)


def flip_bits(rng: random.Random, data: bytes, most: int) -> bytes:
    """``data`` with 1 to ``most`` single bits flipped at random places (``data`` must not be empty)."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, most)):
        buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
    return bytes(buf)


class DriverProcess:
    """``cpp_driver.py`` (the official C++ client) in a process group of its own. ``on_event(when, event)`` runs on a
    reader thread for every whole JSON line it prints, ``when`` being the monotonic time the line was read; a line
    cut by a kill is dropped."""

    def __init__(
        self, python: Path, driver: Path, args: list[str], on_event: Callable[[float, dict[str, Any]], None]
    ) -> None:
        self.proc = subprocess.Popen(
            [str(python), str(driver), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        self.reader = threading.Thread(target=self._read, args=(on_event,), daemon=True)
        self.reader.start()

    def _read(self, on_event: Callable[[float, dict[str, Any]], None]) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if not line.endswith("\n"):
                break
            try:
                event = json.loads(line)
            except ValueError:
                continue
            on_event(time.monotonic(), event)

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self.reader.join(10)
