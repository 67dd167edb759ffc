"""Message-store benchmark (not a test): append throughput, group commit, and crash recovery, against the disk's own
write+fdatasync rate and sequential speed measured in the same run.

    .venv/bin/python bench/bench_store.py                    # everything, 1 GiB recovery
    .venv/bin/python bench/bench_store.py --recovery-mib 256 --rounds 3
    .venv/bin/python bench/bench_store.py --skip-recovery
    .venv/bin/python bench/bench_store.py --broker --inflight 1,128 --rounds 3 --window 5   # `txmq dev` + client
    .venv/bin/python bench/bench_store.py --raw --rounds 5 --window 1    # the disk alone, by kind of file

``--broker`` measures the commit cycle through a real broker: ``txmq dev`` (SYNC_FLUSH) in a child process and txmq's
asyncio client at each in-flight count, with the broker's fdatasync count and time and its stored bytes read from
``/metrics`` around each window: fsyncs per second, bytes per fsync and the mean fdatasync, next to the raw disk.

The disk of a cloud VM is noisy, so every store figure is taken in short windows interleaved with windows of the raw
disk baseline, and medians are reported with the ratio of each store window to its neighbouring raw window.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from txmq.protocol.record import MessageRecord
from txmq.store.config import FlushDiskType, StoreConfig
from txmq.store.message_store import MessageStore

BODY = b"x" * 1024
RAW_FILE_SIZE = 1 << 30


def record(worker: int, i: int) -> MessageRecord:
    """What a broker builds for a 1 KiB send: a tag, a unique key, the two hosts."""
    return MessageRecord(
        topic="BenchTopic",
        body=BODY,
        queue_id=worker % 8,
        born_timestamp=1_700_000_000_000,
        born_host=("10.0.0.1", 50000 + worker),
        store_host=("10.0.0.2", 10911),
        properties={"UNIQ_KEY": f"0A00000100002A9F{worker:08X}{i:08X}", "TAGS": "TagA", "WAIT": "true"},
    )


# -- the disk on its own ---------------------------------------------------------------------------------------


class RawDisk:
    """1 KiB pwrite + fdatasync in a loop on a preallocated file: the bound a single synchronous appender can reach."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "raw-disk"
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        os.posix_fallocate(self.fd, 0, RAW_FILE_SIZE)
        os.fsync(self.fd)
        self.pos = 0

    def fsync_rate(self, seconds: float) -> float:
        n = 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            if self.pos + 1024 > RAW_FILE_SIZE:
                self.pos = 0
            os.pwrite(self.fd, BODY, self.pos)
            os.fdatasync(self.fd)
            self.pos += 1024
            n += 1
        return n / (time.perf_counter() - start)

    def close(self) -> None:
        os.close(self.fd)
        os.unlink(self.path)


def raw_modes(directory: Path, seconds: float, rounds: int) -> list[str]:
    """pwrite + fdatasync in a loop, 1 KiB and 128 KiB per call (a group of 1 and of ~100 records), into a file whose
    blocks are fallocate'd (unwritten extents: each fdatasync converts some), zero-filled beforehand (data only), or
    grown by the writes (size changes: metadata each time). Interleaved, medians of ``rounds`` windows."""
    path = directory / "raw-modes"
    size = 256 << 20
    rates: dict[tuple[str, int], list[float]] = {}
    for _ in range(rounds):
        for mode in ("fallocate", "zero-filled", "growing"):
            for chunk in (1024, 128 << 10):
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
                try:
                    if mode == "fallocate":
                        os.posix_fallocate(fd, 0, size)
                    elif mode == "zero-filled":
                        zeros = bytes(1 << 20)
                        for pos in range(0, size, len(zeros)):
                            os.pwrite(fd, zeros, pos)
                    os.fsync(fd)
                    data = b"x" * chunk
                    n = pos = 0
                    start = time.perf_counter()
                    while time.perf_counter() - start < seconds and pos + chunk <= size:
                        os.pwrite(fd, data, pos)
                        os.fdatasync(fd)
                        pos += chunk
                        n += 1
                    rates.setdefault((mode, chunk), []).append(n / (time.perf_counter() - start))
                finally:
                    os.close(fd)
                    os.unlink(path)
    lines = []
    for (mode, chunk), values in rates.items():
        line = f"raw {chunk >> 10:>3} KiB pwrite+fdatasync, {mode:<11} file: {fmt_rate(values)} /s"
        print(line, flush=True)
        lines.append(line)
    return lines


def sequential_write_mib_s(directory: Path, mib: int = 512) -> tuple[float, float]:
    """Sequential 4 MiB writes + one fdatasync, then a cold sequential read; MiB/s each."""
    path = directory / "seq-disk"
    chunk = os.urandom(4 << 20)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        start = time.perf_counter()
        for i in range(mib // 4):
            os.pwrite(fd, chunk, i * len(chunk))
        os.fdatasync(fd)
        write = mib / (time.perf_counter() - start)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        start = time.perf_counter()
        pos = 0
        while True:
            data = os.pread(fd, 4 << 20, pos)
            if not data:
                break
            pos += len(data)
        read = pos / (1 << 20) / (time.perf_counter() - start)
    finally:
        os.close(fd)
        os.unlink(path)
    return write, read


# -- the store ---------------------------------------------------------------------------------------------------


async def store_rate(store: MessageStore, appenders: int, seconds: float) -> tuple[float, float]:
    """``appenders`` tasks, each awaiting store.put in a loop; returns (msg/s, messages per group)."""
    stop = False
    count = 0

    async def appender(w: int) -> None:
        nonlocal count
        i = 0
        while not stop:
            result = await store.put(record(w, i))
            if not result.ok:
                raise RuntimeError(result)
            i += 1
            count += 1

    tasks = [asyncio.create_task(appender(w)) for w in range(appenders)]
    await asyncio.sleep(min(0.2, seconds / 4))  # warm up: the first groups are small
    stats = store.statistics
    c0, g0, m0 = count, stats.groups, stats.put_messages
    start = time.perf_counter()
    await asyncio.sleep(seconds)
    c1, g1, m1 = count, stats.groups, stats.put_messages
    elapsed = time.perf_counter() - start
    stop = True
    await asyncio.gather(*tasks)
    return (c1 - c0) / elapsed, (m1 - m0) / max(1, g1 - g0)


def blocking_rate(store: MessageStore, seconds: float) -> float:
    """One thread calling the blocking ``put_sync`` in a loop (the raw loop's shape); returns msg/s."""
    n = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        if not store.put_sync(record(0, n)).ok:
            raise RuntimeError("put_sync failed")
        n += 1
    return n / (time.perf_counter() - start)


def fmt_rate(values: list[float]) -> str:
    return f"{statistics.median(values):>9,.0f}  ({min(values):,.0f}..{max(values):,.0f})"


async def warm_up(store: MessageStore, lines: list[str], raw: RawDisk, args: argparse.Namespace) -> None:
    """Measure x64 once in the first segment (fallocate'd at creation), then append until the log runs in a
    segment that was zero-filled in the background: the steady state of a broker that has been up for a while."""
    before = raw.fsync_rate(args.window / 2)
    rate, _ = await store_rate(store, 64, args.window)
    after = raw.fsync_rate(args.window / 2)
    ratio = rate / ((before + after) / 2)
    line = f"SYNC x64   {rate:>9,.0f} msg/s in the first segment (fallocate'd), ratio {ratio:.2f}"
    print(line, flush=True)
    lines.append(line)
    stop = False

    async def appender(w: int) -> None:
        i = 0
        while not stop:
            await store.put_many([record(w, i + k) for k in range(16)])
            i += 16

    tasks = [asyncio.create_task(appender(w)) for w in range(64)]
    while store.commit_log.segments[-1].start == 0:
        await asyncio.sleep(0.1)
    stop = True
    await asyncio.gather(*tasks)
    line = f"{'':10} (then appended {store.max_physical_offset() >> 20} MiB: now in a zero-filled segment)"
    print(line, flush=True)
    lines.append(line)


async def throughput(args: argparse.Namespace, workdir: Path, raw: RawDisk) -> list[str]:
    lines: list[str] = []
    for flush in (FlushDiskType.SYNC_FLUSH, FlushDiskType.ASYNC_FLUSH):
        root = workdir / f"store-{flush.value}"
        shutil.rmtree(root, ignore_errors=True)
        cfg = StoreConfig(
            store_path_root_dir=str(root), flush_disk_type=flush, mapped_file_size_commit_log=args.segment_mib << 20
        )
        store = MessageStore(cfg)
        await store.start()
        try:
            if flush is FlushDiskType.SYNC_FLUSH:
                await warm_up(store, lines, raw, args)
            counts: list[int | str] = [*args.appenders] if flush is FlushDiskType.SYNC_FLUSH else [64]
            if flush is FlushDiskType.SYNC_FLUSH and 1 in counts:
                counts.insert(counts.index(1), "1 blocking")
            for n in counts:
                rates: list[float] = []
                raws: list[float] = []
                ratios: list[float] = []
                groups: list[float] = []
                for _ in range(args.rounds):
                    before = raw.fsync_rate(args.window / 2)
                    if isinstance(n, str):  # one thread calling put_sync: it writes its own groups
                        rate, group = await asyncio.to_thread(blocking_rate, store, args.window), 1.0
                    else:
                        rate, group = await store_rate(store, n, args.window)
                    after = raw.fsync_rate(args.window / 2)
                    rates.append(rate)
                    groups.append(group)
                    raws.extend((before, after))
                    ratios.append(rate / ((before + after) / 2))
                label = f"{'SYNC' if flush is FlushDiskType.SYNC_FLUSH else 'ASYNC'} x{n}"
                line = (
                    f"{label:<15} {fmt_rate(rates)} msg/s | raw fsync {statistics.median(raws):>7,.0f}/s | "
                    f"ratio {statistics.median(ratios):5.2f} ({min(ratios):.2f}..{max(ratios):.2f}) | "
                    f"msgs/group {statistics.median(groups):6.1f}"
                )
                print(line, flush=True)
                lines.append(line)
            snap = store.stats()
            lat = snap["flush_latency_us"]
            line = (
                f"{'':10} store fdatasync latency over the whole {flush.value} run: mean {lat['mean']:.0f} us, "
                f"p50 <= {lat['p50']} us, p99 <= {lat['p99']} us, {snap['flushes']:,} flushes for "
                f"{snap['put_messages']:,} messages"
            )
            print(line, flush=True)
            lines.append(line)
        finally:
            await store.close()
            shutil.rmtree(root, ignore_errors=True)
    return lines


# -- through a broker -------------------------------------------------------------------------------------------


def _scrape(url: str) -> dict[str, float]:
    """The broker's commit-cycle counters from /metrics: fdatasyncs, their seconds, stored messages and bytes."""
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    out = {"flushes": 0.0, "flush_s": 0.0, "messages": 0.0, "bytes": 0.0}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, value = line.rsplit(" ", 1)
        if name.startswith("txmq_storage_flush_latency_seconds_count"):
            out["flushes"] += float(value)
        elif name.startswith("txmq_storage_flush_latency_seconds_sum"):
            out["flush_s"] += float(value)
        elif name.startswith("rocketmq_messages_in_total"):
            out["messages"] += float(value)
        elif name.startswith("rocketmq_throughput_in_total"):
            out["bytes"] += float(value)
    return out


def broker_cycle(args: argparse.Namespace, workdir: Path) -> list[str]:
    """``txmq dev`` + txmq's client at each in-flight count: msg/s, fsyncs/s, bytes per fsync, mean fdatasync."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_e2e import run, send_phase
    from txmq.testing import DevCluster

    lines: list[str] = []
    root = workdir / "broker"
    shutil.rmtree(root, ignore_errors=True)
    raw = RawDisk(workdir)
    cluster = DevCluster(root, {"flushDiskType": "SYNC_FLUSH", "grpcListenPort": "0"}).start()
    try:
        for n in args.inflight:
            rows: list[tuple[float, float, float, float, float]] = []
            for k in range(args.rounds):
                before_raw = raw.fsync_rate(0.5)
                m0 = _scrape(cluster.metrics_url)
                r = run(send_phase(cluster.namesrv_addr, f"Cycle{n}_{k}", n, args.window))
                m1 = _scrape(cluster.metrics_url)
                raw_rate = (before_raw + raw.fsync_rate(0.5)) / 2
                flushes = m1["flushes"] - m0["flushes"]
                seconds = r["msgs"] / r["rate"]
                rows.append(
                    (
                        r["rate"],
                        flushes / seconds,
                        (m1["bytes"] - m0["bytes"]) / max(1.0, flushes),
                        (m1["flush_s"] - m0["flush_s"]) / max(1.0, flushes) * 1000,
                        raw_rate,
                    )
                )
            med = [statistics.median(col) for col in zip(*rows, strict=True)]
            line = (
                f"broker x{n:<4} {fmt_rate([r[0] for r in rows])} msg/s | {med[1]:7,.0f} fsync/s | "
                f"{med[2]:9,.0f} B/fsync | fdatasync mean {med[3]:.2f} ms | raw 1 KiB fsync {med[4]:7,.0f}/s | "
                f"fsync/s / raw {med[1] / med[4]:.2f}"
            )
            print(line, flush=True)
            lines.append(line)
    finally:
        cluster.stop()
        raw.close()
        shutil.rmtree(root, ignore_errors=True)
    return lines


# -- recovery ----------------------------------------------------------------------------------------------------


def child_writer(root: str, target_bytes: int) -> None:
    """Runs in a child process: append ~target_bytes of 1 KiB records (ASYNC flush for speed), then wait to be
    killed. Prints 'done' when the target is reached."""

    async def main() -> None:
        store = MessageStore(StoreConfig(store_path_root_dir=root, flush_disk_type=FlushDiskType.ASYNC_FLUSH))
        await store.start()

        async def appender(w: int) -> None:
            i = 0
            while store.max_physical_offset() < target_bytes:
                await store.put_many([record(w, i + k) for k in range(32)])
                i += 32

        await asyncio.gather(*(appender(w) for w in range(16)))
        print("done", store.max_physical_offset(), flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())


def drop_cache(root: Path) -> None:
    """Evict the store's files from the page cache, so recovery reads from the disk as after a power cut."""
    os.sync()
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def timed_open(root: Path) -> tuple[float, MessageStore]:
    start = time.perf_counter()
    store = MessageStore(StoreConfig(store_path_root_dir=str(root))).open()
    return time.perf_counter() - start, store


def recovery(args: argparse.Namespace, workdir: Path) -> list[str]:
    root = workdir / "store-recovery"
    shutil.rmtree(root, ignore_errors=True)
    # Stay inside the first 1 GiB segment: a crash just before the roll is the longest verification the normal
    # crash path does (it always verifies the whole last segment).
    target = min(args.recovery_mib << 20, (1 << 30) - (1 << 20))
    print(f"writing {args.recovery_mib} MiB of 1 KiB records in a child process ...", flush=True)
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child-writer", str(root), str(target)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    written = time.perf_counter() - start
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    if not line.startswith("done"):
        raise RuntimeError(f"the writer child failed: {line!r}")
    log_bytes = int(line.split()[1])
    lines = [f"wrote {log_bytes / (1 << 20):,.0f} MiB of 1 KiB records in {written:.1f} s, then kill -9"]
    print(lines[0], flush=True)
    copy = workdir / "store-recovery-copy"
    scenarios: list[tuple[str, Callable[[Path], None]]] = [
        ("kill -9, cold cache", lambda p: None),
        ("kill -9, consume queues + index lost, cold cache", lambda p: _drop_derived(p)),
    ]
    for label, damage in scenarios:
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(root, copy)
        damage(copy)
        if args.cold:
            drop_cache(copy)
        seconds, store = timed_open(copy)
        info = store.recovery
        assert info is not None
        line = (
            f"{label:<50} {seconds:6.2f} s | mode {info.mode}, verified {info.scanned_bytes / (1 << 20):,.0f} MiB "
            f"({info.scanned_records:,} records, {info.scanned_bytes / (1 << 20) / max(seconds, 1e-9):,.0f} MiB/s), "
            f"replayed {info.cq_replayed:,} CQ / {info.index_replayed:,} index entries"
        )
        print(line, flush=True)
        lines.append(line)
        store.shutdown()
        if label.startswith("kill -9, cold"):
            if args.cold:
                drop_cache(copy)
            seconds, store = timed_open(copy)
            line = f"{'clean restart after that, cold cache':<50} {seconds:6.2f} s | mode {store.recovery.mode}"
            print(line, flush=True)
            lines.append(line)
            store.shutdown()
    shutil.rmtree(copy, ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)
    return lines


def _drop_derived(root: Path) -> None:
    shutil.rmtree(root / "consumequeue")
    shutil.rmtree(root / "index")


# -- main --------------------------------------------------------------------------------------------------------


def machine() -> str:
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{os.cpu_count()} CPU ({cpu}), {platform.system()} {platform.release()}, Python {platform.python_version()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default=str(Path(__file__).parent / "out"), help="work directory (same disk)")
    parser.add_argument("--window", type=float, default=1.0, help="seconds per measurement window")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved windows per case")
    parser.add_argument("--appenders", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16, 64, 256])
    parser.add_argument("--segment-mib", type=int, default=256, help="commit-log segment size for the throughput runs")
    parser.add_argument("--recovery-mib", type=int, default=1024)
    parser.add_argument("--skip-recovery", action="store_true")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--warm", dest="cold", action="store_false", help="recover from the page cache")
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    parser.add_argument("--raw", action="store_true", help="only the disk: fdatasync rates by file kind and size")
    parser.add_argument("--broker", action="store_true", help="only the commit cycle through `txmq dev` + client")
    parser.add_argument("--inflight", type=lambda s: [int(x) for x in s.split(",")], default=[1, 128])
    parser.add_argument("--child-writer", nargs=2, metavar=("ROOT", "BYTES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_writer:
        child_writer(args.child_writer[0], int(args.child_writer[1]))
        return
    workdir = Path(args.dir)
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"machine: {machine()}; event loop: {args.loop}; work dir: {workdir}", flush=True)
    print(f"load average: {os.getloadavg()[0]:.2f}", flush=True)
    if args.raw:
        raw_modes(workdir, args.window, args.rounds)
        print(f"load average: {os.getloadavg()[0]:.2f}", flush=True)
        return
    if args.broker:
        broker_cycle(args, workdir)
        print(f"load average: {os.getloadavg()[0]:.2f}", flush=True)
        return
    out: list[str] = []
    if not args.skip_throughput:
        raw = RawDisk(workdir)
        try:
            rates = [raw.fsync_rate(0.5) for _ in range(4)]
            seq_w, seq_r = sequential_write_mib_s(workdir)
            for line in (
                f"raw 1 KiB write+fdatasync: {fmt_rate(rates)} /s",
                f"raw sequential write: {seq_w:,.0f} MiB/s (4 MiB writes + fdatasync); cold read {seq_r:,.0f} MiB/s",
            ):
                print(line, flush=True)
                out.append(line)
            if args.loop == "uvloop":
                import uvloop

                out += uvloop.run(throughput(args, workdir, raw))
            else:
                out += asyncio.run(throughput(args, workdir, raw))
        finally:
            raw.close()
    if not args.skip_recovery:
        out += recovery(args, workdir)


if __name__ == "__main__":
    main()
