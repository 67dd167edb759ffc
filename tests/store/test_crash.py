"""kill -9 a real appending process at random moments, many times, and check that every acknowledged record
survives byte for byte, queue offsets stay dense, and nothing past the torn tail is visible."""

from __future__ import annotations

import hashlib
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers_store import segment_names, small_config

from txmq.protocol.record import decode_record
from txmq.store.message_store import MessageStore

CHILD = Path(__file__).parent / "helpers_crash_child.py"
ROUNDS = 24


class Acked:
    __slots__ = ("phys", "qid", "qoff", "sha", "size", "sys_flag", "topic")

    def __init__(self, line: str) -> None:
        phys, qoff, topic, qid, size, sys_flag, sha = line.split()
        self.phys, self.qoff, self.qid, self.size = int(phys), int(qoff), int(qid), int(size)
        self.topic, self.sys_flag, self.sha = topic, int(sys_flag), sha


def run_child(root: Path, seed: int, rnd: random.Random, flush: str = "SYNC_FLUSH") -> tuple[list[Acked], str]:
    """Start the child, kill it with SIGKILL at a random moment, return the lines it acknowledged."""
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), str(root), str(seed), flush],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    moment = rnd.random()
    try:
        if moment < 0.15:
            # During start-up: possibly in the middle of recovering the previous crash.
            time.sleep(rnd.uniform(0.05, 0.4))
            how = "during start-up"
        else:
            assert proc.stdout.readline() == "ready\n", proc.stderr.read() if proc.poll() is not None else ""
            want = rnd.randint(1, 400)
            deadline = time.monotonic() + 20
            while len(lines) < want and time.monotonic() < deadline:
                line = proc.stdout.readline()
                if not line:
                    break
                lines.append(line)
            how = f"after {len(lines)} acks"
    finally:
        proc.send_signal(signal.SIGKILL)
        # Not communicate(): it reads the pipe's descriptor and would skip what the text wrapper has buffered
        # already (a line would lose its head). The child is dead, so both reads end.
        rest = proc.stdout.read()
        err = proc.stderr.read() if proc.stderr is not None else ""
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, f"child ended by itself ({proc.returncode}): {err[-2000:]}"
    lines.extend(rest.splitlines(keepends=True))
    complete = [line for line in lines if line.endswith("\n") and line != "ready\n"]  # a cut last line was not read
    return [Acked(line) for line in complete], how


def verify(root: Path, acked: list[Acked]) -> MessageStore:
    store = MessageStore(small_config(root, mapped_file_size_commit_log=256 * 1024))
    store.open()
    for a in acked:
        data = store.read_record(a.phys, a.size)
        assert data is not None, f"acknowledged record at {a.phys} is gone"
        rec = decode_record(data)
        assert hashlib.sha1(rec.body).hexdigest() == a.sha and (rec.topic, rec.queue_id) == (a.topic, a.qid)
        if a.sys_flag & 0xC == 0x4:
            assert store.read_record(a.phys) == data
            continue
        assert store.read_consume_queue(a.topic, a.qid, a.qoff, 1) == [(a.phys, a.size, 0)]
    end = store.max_physical_offset()
    for topic, qid in store.queues():
        lo, hi = store.min_offset(topic, qid), store.max_offset(topic, qid)
        entries = store.read_consume_queue(topic, qid, lo, hi - lo)
        assert len(entries) == hi - lo, "queue offsets are not dense"
        assert len({e[0] for e in entries}) == len(entries), "a record appears twice in a queue"
        for i, (phys, size, _code) in enumerate(entries):
            assert phys + size <= end
            rec = decode_record(store.read_record(phys, size))
            assert (rec.topic, rec.queue_id, rec.queue_offset) == (topic, qid, lo + i)
    for name in segment_names(root):  # nothing past the torn tail
        data = (root / "commitlog" / name).read_bytes()
        start = int(name)
        tail = data[max(0, end - start) :] if end < start + len(data) else b""
        assert tail == bytes(len(tail)), f"bytes after the recovered end {end} in {name}"
    return store


@pytest.mark.parametrize(("flush", "rounds"), [("SYNC_FLUSH", ROUNDS), ("ASYNC_FLUSH", 8)])
def test_kill_9_at_random_moments_loses_no_acknowledged_record(tmp_path: Path, flush: str, rounds: int) -> None:
    """ASYNC_FLUSH only promises to survive a process crash (the page cache keeps the bytes); check that too."""
    root = tmp_path / "store"
    rnd = random.Random(20240601)
    acked: list[Acked] = []
    started = time.monotonic()
    hows = []
    for round_no in range(rounds):
        new, how = run_child(root, round_no, rnd, flush)
        hows.append(how)
        acked.extend(new)
        if not root.exists():  # killed before it created anything
            continue
        # Verify on a copy, so that the next child recovers from the crash itself (crash after crash).
        copy = tmp_path / "verify"
        shutil.copytree(root, copy)
        store = verify(copy, acked)
        assert store.recovery.mode in ("crash", "empty")
        store.shutdown()
        shutil.rmtree(copy)
        if time.monotonic() - started > 45:  # keep the suite fast on a slow disk: fewer rounds, never a flake
            break
    assert len(acked) > 40 * rounds, f"too few acknowledged records to mean anything: {len(acked)} ({hows})"
    assert sum(h.startswith("after") for h in hows) >= len(hows) // 2
    final = verify(root, acked)
    final.shutdown()


def test_records_acknowledged_by_a_killed_child_survive_a_second_crash(tmp_path: Path) -> None:
    """Recovery itself may be killed: the store it leaves must still be recoverable."""
    root = tmp_path / "store"
    rnd = random.Random(5)
    acked, _ = run_child(root, 1, random.Random(99))
    for i in range(4):
        proc = subprocess.Popen([sys.executable, str(CHILD), str(root), str(100 + i)], stdout=subprocess.PIPE)
        time.sleep(rnd.uniform(0.0, 0.3))
        proc.kill()
        out, _ = proc.communicate()
        acked.extend(Acked(x) for x in out.decode().splitlines(keepends=True) if x.endswith("\n") and x != "ready\n")
    verify(root, acked).shutdown()
