"""What checking every served record costs a pull: the store's getMessage (32 records of 1 KiB, the broker's default
pull) timed, and with ``--instructions`` counted under valgrind's callgrind (two runs, the difference per pull).

Run it against two trees to compare, e.g. main (no check) and a branch (the check):

    PYTHONPATH=/work/main/src .venv/bin/python bench/bench_pull_check.py --instructions
    PYTHONPATH=src .venv/bin/python bench/bench_pull_check.py --instructions

It prints which txmq it imported and whether its record walk is compiled.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from txmq.protocol.record import MessageRecord
from txmq.store.config import StoreConfig
from txmq.store.message_store import MessageStore

RECORDS = 4096
BATCH = 32


def build(root: str, body: int) -> MessageStore:
    store = MessageStore(StoreConfig(store_path_root_dir=root, mapped_file_size_commit_log=64 << 20))
    store.open()
    records = [
        MessageRecord(
            topic="BenchPull",
            body=bytes((i + j) % 251 for j in range(body)),
            queue_id=0,
            born_host=("10.0.0.1", 1000),
            store_host=("10.0.0.2", 10911),
            properties={"TAGS": "t"},
        )
        for i in range(RECORDS)
    ]
    for i in range(0, RECORDS, 256):
        store.put_many_sync(records[i : i + 256])
    return store


def pulls(store: MessageStore, count: int) -> int:
    total = 0
    offset = 0
    for _ in range(count):
        got = store.get_messages("BenchPull", 0, offset, BATCH, None, None, None)
        total += got.message_count
        offset = got.next_begin_offset if got.next_begin_offset < RECORDS - BATCH else 0
    return total


def run(count: int, body: int) -> float:
    with tempfile.TemporaryDirectory(prefix="txmq-bench-pull-") as tmp:
        store = build(tmp, body)
        try:
            pulls(store, 50)  # warm the page cache and the code
            t0 = time.perf_counter()
            got = pulls(store, count)
            seconds = time.perf_counter() - t0
            assert got == count * BATCH, got
        finally:
            store.shutdown()
    return seconds / count * 1e6


def instructions(count: int, body: int) -> float:
    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
    counts = []
    small = count // 5
    for n in (small, count):
        with tempfile.TemporaryDirectory(prefix="txmq-bench-pull-cg-") as tmp:
            out = subprocess.run(
                [
                    "valgrind",
                    "--tool=callgrind",
                    f"--callgrind-out-file={tmp}/cg.out",
                    sys.executable,
                    __file__,
                    "--pulls",
                    str(n),
                    "--body",
                    str(body),
                    "--runs",
                    "1",
                ],
                capture_output=True,
                text=True,
                check=True,
            )
        found = re.search(r"Collected : (\d+)", out.stderr)
        if found is None:
            raise SystemExit(f"callgrind printed no count:\n{out.stderr[-2000:]}")
        counts.append(int(found.group(1)))
    return (counts[1] - counts[0]) / (count - small)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pulls", type=int, default=5000)
    parser.add_argument("--body", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--instructions", action="store_true", help="count instructions under valgrind's callgrind")
    args = parser.parse_args()
    import txmq.protocol.record.walk as walk

    print(f"txmq from {walk.__file__.rsplit('/txmq/', 1)[0]}; walk compiled: {not walk.__file__.endswith('.py')}")
    if args.instructions:
        per = instructions(args.pulls, args.body)
        print(f"{per:,.0f} instructions per pull of {BATCH} x {args.body} B ({per / BATCH:,.0f} per record)")
        return
    times = [run(args.pulls, args.body) for _ in range(args.runs)]
    print(
        f"{statistics.median(times):.1f} us per pull of {BATCH} x {args.body} B (median of {args.runs}; "
        f"min {min(times):.1f}, max {max(times):.1f})"
    )


if __name__ == "__main__":
    main()
