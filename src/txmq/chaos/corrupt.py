"""Damaged commit-log files: a real ``txmq dev`` is stopped (cleanly, or with SIGKILL), one of its commit-log files
is damaged in the middle (not at the tail: bits flipped in one record's body, a record's header overwritten so that
it is no record, or the file cut short), and the broker is started again on it.

Counted per scenario: whether the start reported the damage with its offset (or refused to start naming the file),
damaged records served as if they were good (their body differs from what was sent), good records (every other
acknowledged one) no longer served, and damage the offline check (``txmq admin store verify``) does not list.
``--quick`` runs two of the six scenarios with fewer messages (the cut file is tested in tests/store).
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from typing import Any

from txmq.chaos.common import create_topics, read_topic
from txmq.chaos.report import PartResult
from txmq.client import Message, Producer
from txmq.testing import DevCluster

log = logging.getLogger("txmq.chaos")

TOPIC = "ChaosCorruptTopic"
SEGMENT = 1024 * 1024
MESSAGES = 1200  # about 4 segments of 3 KB bodies
SCENARIOS = (
    ("flip", "clean"),
    ("flip", "kill"),
    ("smash", "clean"),
    ("smash", "kill"),
    ("cut", "clean"),
    ("cut", "kill"),
)
QUICK_MESSAGES = 400  # still two segments: the victim is in the first, the tail in the second
QUICK_SCENARIOS = (("flip", "clean"), ("smash", "kill"))


def _body(n: int) -> bytes:
    return f"corrupt-{n:08d}|".encode() + bytes((n * 7 + i) % 251 for i in range(3000))


async def _send(ns: str, count: int) -> dict[bytes, tuple[int, int]]:
    """Send the messages; returns body -> (commit-log offset of the record, record size) from the offsetMsgId."""
    sent: dict[bytes, tuple[int, int]] = {}
    await create_topics(ns, {TOPIC: 1})
    async with Producer("ChaosCorruptProducers", ns, instance_name="corrupt-p") as producer:
        for n in range(count):
            body = _body(n)
            result = await producer.send(Message(TOPIC, body))
            sent[body] = (int(result.offset_msg_id[-16:], 16), 0)
    return sent


async def _read(ns: str) -> list[bytes]:
    return [m.body for m in await read_topic(ns, TOPIC, tolerate_errors=True)]


def _damage(commitlog: Path, how: str, phys: int) -> tuple[str, int]:
    """Flip bits in the body of the record at ``phys``, overwrite its header, or cut its file in the middle; returns
    the file and the offset of the damage."""
    name = f"{phys - phys % SEGMENT:020d}"
    path = commitlog / name
    data = bytearray(path.read_bytes())
    at = phys % SEGMENT
    if how == "flip":
        where = at + 200  # inside the body (the header, topic and properties come before it, about 150 bytes)
        data[where] ^= 0x5A
        data[where + 1] ^= 0x01
        path.write_bytes(bytes(data))
        return name, phys + 200
    if how == "smash":
        data[at : at + 40] = b"\xee" * 40  # TOTALSIZE, magic, CRC, queue and commit-log offsets: no record any more
        path.write_bytes(bytes(data))
        return name, phys
    path.write_bytes(bytes(data[:at]))  # cut short just before this record
    return name, phys


def _check_verify(result: PartResult, scenario: str, commitlog: Path, phys: int) -> None:
    """The offline check, on the stopped broker's files, lists a damaged range holding the damaged record."""
    from txmq.store.verify import verify_directory

    report = verify_directory(str(commitlog), SEGMENT)
    if not any(d.start <= phys < d.end for d in report.damage):
        result.fail("not_found_by_verify", f"{scenario}: verify lists {[d.describe() for d in report.damage]}")


async def run_corrupt_campaign(work_dir: Path, progress: Any = None, *, quick: bool = False) -> PartResult:
    result = PartResult("corrupt")
    result.zero("not_reported_at_start", "served_damaged", "good_records_lost", "not_found_by_verify")
    started = time.monotonic()
    count = QUICK_MESSAGES if quick else MESSAGES
    try:
        for how, stop in QUICK_SCENARIOS if quick else SCENARIOS:
            scenario = f"{how} after a {'clean stop' if stop == 'clean' else 'kill -9'}"
            cluster = DevCluster(work_dir / f"{how}-{stop}", {"mappedFileSizeCommitLog": str(SEGMENT)})
            phys = -1
            cluster.start(timeout=60)
            try:
                sent = await _send(cluster.namesrv_addr, count)
                if stop == "clean":
                    cluster.stop()
                else:
                    cluster.kill()
                bodies = list(sent)
                victim = bodies[len(bodies) // 4]  # in an early segment, far from the tail
                phys = sent[victim][0]
                name, offset = _damage(cluster.data_dir / "store" / "commitlog", how, phys)
                log_before = len(cluster.log_text())
                try:
                    cluster.start(timeout=60)
                except RuntimeError as exc:
                    text = cluster.log_text()[log_before:] + str(exc)
                    # Refusing to start, naming the damaged file, is a handling (the operator decides); silence is not.
                    named = str(offset) in text or name in text
                    result.info[scenario] = f"refused to start ({'naming' if named else 'NOT naming'} {name})"
                    if not named:
                        result.fail("not_reported_at_start", f"{scenario}: start refused without naming {name}")
                    continue
                served = await _read(cluster.namesrv_addr)
                # The start's scan (after kill -9) or its background scrub (after a clean stop) names the offset.
                text = cluster.log_text()[log_before:]
                reported = bool(re.search(rf"\b{offset}\b|\b{phys}\b", text))
                if not reported:
                    result.fail("not_reported_at_start", f"{scenario}: nothing at start names offset {phys}/{offset}")
                good = set(bodies) - {victim}
                served_set = set(served)
                damaged = [b for b in served if b not in sent]
                for b in damaged[:3]:
                    result.fail("served_damaged", f"{scenario}: served a damaged body {b[:24]!r}")
                lost = good - served_set
                if lost:
                    result.fail("good_records_lost", f"{scenario}: {len(lost)} good acknowledged records not served")
                result.info[scenario] = (
                    f"{'reported' if reported else 'not reported'}, {len(damaged)} damaged served, "
                    f"{len(lost)} good lost"
                )
                if progress:
                    progress(f"corrupt: {scenario}: {result.info[scenario]}")
            finally:
                cluster.stop()
                if phys >= 0:
                    _check_verify(result, scenario, cluster.data_dir / "store" / "commitlog", phys)
    except Exception as exc:
        log.exception("corrupt-file campaign stopped")
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        result.seconds = time.monotonic() - started
    return result
