"""Disk faults: the store's disk fills up under load, on a size-limited tmpfs the campaign mounts (root only) and
unmounts afterwards.

Each cycle: a ballast file takes most of the free space, producers send until the broker refuses with a disk-full
error, every message acknowledged so far is read back through the running broker, the ballast is deleted, and the
same broker (no restart) must accept sends again within seconds. At the end the broker is killed with SIGKILL and
restarted on the same data (once space is freed), and every acknowledged message must still be there.

The broker runs with ``cleanFileForciblyEnable=false``: with RocketMQ's default (true) a disk above 85 % has its
oldest segments deleted even when unexpired and unconsumed, which is RocketMQ's documented trade (room for new
messages over old ones), not a loss this campaign should count.

Counted: acknowledged messages lost (after reads, after the restart), sends refused without a clear disk-full error,
reads that failed while the disk was full, cycles where writes did not resume without a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from txmq.chaos.common import create_topics, read_topic
from txmq.chaos.fuzz import unhandled_lines
from txmq.chaos.report import PartResult
from txmq.client import Message, Producer
from txmq.testing import DevCluster, fill, tmpfs_unavailable
from txmq.testing._disk import mount_tmpfs, umount

log = logging.getLogger("txmq.chaos")

TOPIC = "ChaosDiskTopic"
# Every cycle keeps what it stored (nothing expires), so the file system grows with the number of cycles.
FS_BASE_MB, FS_PER_CYCLE_MB = 40, 6
SEGMENT = 2 * 1024 * 1024
BODY = 4000


@dataclass
class DiskSettings:
    cycles: int = 2
    seed: int = 20261125


async def _read_all(ns: str) -> dict[bytes, int]:
    found: dict[bytes, int] = {}
    for m in await read_topic(ns, TOPIC):
        found[m.body[:24]] = found.get(m.body[:24], 0) + 1
    return found


def _body(n: int) -> bytes:
    head = f"disk-{n:012d}".encode().ljust(24, b".")
    return head + b"x" * (BODY - len(head))


async def run_disk_campaign(settings: DiskSettings, work_dir: Path, progress: Any = None) -> PartResult:
    result = PartResult("disk")
    result.zero(
        "lost",
        "unclear_errors",
        "read_failures",
        "no_resume_without_restart",
        "full_never_reached",
        "broker_unhandled_exceptions",
    )
    started = time.monotonic()
    why_not = tmpfs_unavailable()
    if why_not:
        result.error = f"not run: {why_not}"
        result.seconds = time.monotonic() - started
        return result
    mnt = work_dir / "mnt"
    cluster: DevCluster | None = None
    mounted = False
    acked: set[bytes] = set()
    errors_seen: dict[str, int] = {}
    try:
        mount_tmpfs(mnt, FS_BASE_MB + FS_PER_CYCLE_MB * settings.cycles)
        mounted = True
        conf = {
            "mappedFileSizeCommitLog": str(SEGMENT),
            "cleanFileForciblyEnable": "false",
            "grpcListenPort": "0",
        }
        cluster = DevCluster(mnt / "broker", conf).start(timeout=60)
        ns = cluster.namesrv_addr
        await create_topics(ns, {TOPIC: 2})
        ballast = mnt / "ballast"
        counter = 0
        producer = Producer("ChaosDiskProducers", ns, instance_name="disk-p", retry_times_when_send_failed=0)
        async with producer:
            for cycle in range(1, settings.cycles + 1):
                fill(ballast, leave=2 * SEGMENT)
                # 1. send until the broker says the disk is full
                full = unclear = False
                deadline = time.monotonic() + 120
                while not full and time.monotonic() < deadline:
                    batch = []
                    for _ in range(8):
                        counter += 1
                        batch.append(_body(counter))
                    outcomes = await asyncio.gather(
                        *(producer.send(Message(TOPIC, b), timeout=10) for b in batch), return_exceptions=True
                    )
                    for body, outcome in zip(batch, outcomes, strict=True):
                        if isinstance(outcome, BaseException):
                            text = str(outcome)
                            if "disk is full" in text:
                                full = True
                                errors_seen["disk is full"] = errors_seen.get("disk is full", 0) + 1
                            else:
                                result.fail("unclear_errors", f"cycle {cycle}: {type(outcome).__name__}: {text}")
                                unclear = True
                        else:
                            acked.add(body[:24])
                    if unclear:
                        break
                if not full:
                    result.fail("full_never_reached", f"cycle {cycle}: no disk-full refusal within 120 s")
                    break
                # 2. reads keep working while the disk is full
                try:
                    found = await _read_all(ns)
                except Exception as exc:
                    result.fail("read_failures", f"cycle {cycle}: {type(exc).__name__}: {exc}")
                    found = {}
                for body in sorted(acked - set(found))[:50]:
                    result.fail("lost", f"cycle {cycle}: acknowledged {body.decode()} not readable while full")
                # 3. free space; the same broker must take writes again
                ballast.unlink()
                resumed = False
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline and not resumed:
                    counter += 1
                    body = _body(counter)
                    try:
                        await producer.send(Message(TOPIC, body), timeout=5)
                        acked.add(body[:24])
                        resumed = True
                    except Exception:
                        await asyncio.sleep(0.2)
                if not resumed:
                    result.fail("no_resume_without_restart", f"cycle {cycle}: sends still refused 15 s after freeing")
                if progress:
                    progress(
                        f"disk: cycle {cycle}/{settings.cycles}: full after {len(acked)} acknowledged, "
                        f"{'resumed' if resumed else 'NOT resumed'}"
                    )
        result.info["cycles"] = settings.cycles
        result.info["acknowledged"] = len(acked)
        result.info["disk_full_refusals"] = errors_seen.get("disk is full", 0)
        # 4. kill -9 with the disk full, free the space, restart on the same data: every acknowledged message is
        # there and readable, and it takes writes. (A start on a disk with no byte free is not handled yet: the
        # recovery's consume-queue and key-index writes need room.)
        fill(ballast, leave=0)
        cluster.kill()
        with contextlib.suppress(FileNotFoundError):
            ballast.unlink()
        cluster.start(timeout=60)
        found = await _read_all(cluster.namesrv_addr)
        for body in sorted(acked - set(found)):
            result.fail("lost", f"after kill -9 on a full disk and a restart: {body.decode()} is missing")
        result.info["stored_after_restart"] = len(found)
        with contextlib.suppress(FileNotFoundError):
            ballast.unlink()
        async with Producer("ChaosDiskProducers", cluster.namesrv_addr, instance_name="disk-p2") as again:
            deadline = time.monotonic() + 15
            while True:
                try:
                    await again.send(Message(TOPIC, _body(counter + 1)), timeout=5)
                    break
                except Exception as exc:
                    if time.monotonic() > deadline:
                        result.fail("no_resume_without_restart", f"after the restart: {exc}")
                        break
                    await asyncio.sleep(0.2)
        for line in unhandled_lines(cluster.log_text()):
            result.fail("broker_unhandled_exceptions", line)
    except Exception as exc:
        log.exception("disk campaign stopped")
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        if cluster is not None:
            cluster.stop()
            with contextlib.suppress(OSError):
                shutil.copy(cluster.data_dir / "txmq.log", work_dir / "disk-broker.log")
        if mounted:
            umount(mnt)
        result.seconds = time.monotonic() - started
    return result
