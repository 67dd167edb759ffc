"""The floor of a replicated acknowledgement on this machine, with no broker in the way.

Three small programs of blocking sockets and ``pwrite`` + ``fdatasync``, one request in flight, 1 KiB each, every
party a process of its own on loopback (as ``bench_replication.py`` runs txmq):

- ``single``: the server writes the request, fdatasyncs it and answers;
- ``replicated``: the master writes it, sends it to the slave, fdatasyncs, and answers once the slave has written,
  fdatasynced and acknowledged it too (what a SYNC_MASTER with one in-sync replica must wait for, issue 21);
- ``replicated-slave-in-memory``: the same without the slave's fdatasync (what Apache RocketMQ's slave reports: its
  written offset, not its flushed one), to show how much of the added time is the second fdatasync on the shared disk.

Nothing here parses a frame, keeps an index or runs an event loop, so what the replicated variant adds to the single
one is the cost of the chain itself on this VM: a loopback hop each way, a process woken on each side, and a second
fdatasync on the same disk at the same moment. For a broker whose single send takes ``S`` ms at 1 in flight, the best
replicated/single ratio it can reach is ``S / (S + added)``; ``--single-ms`` prints that ceiling for given values of
``S`` (for example the single broker's p50 from ``bench_replication.py``). Rounds alternate the variants. Not a test.

    .venv/bin/python bench/bench_replication_floor.py [--rounds 5] [--requests 3000] [--single-ms 0.55]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path

SIZE = 1024
FILE_BYTES = 16 << 20


def _open_log(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    os.pwrite(fd, b"\0" * FILE_BYTES, 0)  # written beforehand, as txmq zero-fills ahead of its writer
    os.fsync(fd)
    return fd


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    got = bytearray()
    while len(got) < n:
        chunk = sock.recv(n - len(got))
        if not chunk:
            raise EOFError
        got += chunk
    return bytes(got)


def _listen() -> socket.socket:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    return server


def _accept(server: socket.socket) -> socket.socket:
    conn, _ = server.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    server.close()
    return conn


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _serve(server: socket.socket, path: Path, durable: bool, slave_port: int) -> None:
    """One party: write each request, ship it to the slave at ``slave_port`` first (0: none), fdatasync when
    ``durable``, wait for the slave's acknowledgement, answer."""
    fd = _open_log(path)
    slave = _connect(slave_port) if slave_port else None
    conn = _accept(server)
    offset = 0
    try:
        while True:
            data = _recv_exactly(conn, SIZE)
            os.pwrite(fd, data, offset % FILE_BYTES)
            offset += SIZE
            if slave is not None:
                slave.sendall(data)  # shipped before the master's own fdatasync, so both run at once
            if durable:
                os.fdatasync(fd)
            if slave is not None:
                _recv_exactly(slave, 1)
            conn.sendall(b"k")
    except EOFError:
        pass
    finally:
        os.close(fd)
        if slave is not None:
            slave.close()


def run_variant(variant: str, requests: int, folder: Path) -> tuple[float, float]:
    """(requests per second, p50 in ms) of one variant."""
    ctx = mp.get_context("fork")
    procs = []
    slave_port = 0
    if variant != "single":
        slave_server = _listen()
        slave_port = slave_server.getsockname()[1]
        durable = variant == "replicated"
        procs.append(ctx.Process(target=_serve, args=(slave_server, folder / "slave.log", durable, 0)))
        procs[-1].start()
        slave_server.close()
    master_server = _listen()
    port = master_server.getsockname()[1]
    procs.append(ctx.Process(target=_serve, args=(master_server, folder / "master.log", True, slave_port)))
    procs[-1].start()
    master_server.close()
    client = _connect(port)
    body = b"x" * SIZE
    for _ in range(50):  # warm up
        client.sendall(body)
        _recv_exactly(client, 1)
    latencies = []
    started = time.perf_counter()
    for _ in range(requests):
        t0 = time.perf_counter()
        client.sendall(body)
        _recv_exactly(client, 1)
        latencies.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - started
    client.close()
    for proc in procs:
        proc.join(10)
    return requests / elapsed, statistics.median(latencies) * 1000


VARIANTS = ("single", "replicated", "replicated-slave-in-memory")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--single-ms", default="0.55", help="comma-separated single-send p50s to print ceilings for")
    args = parser.parse_args()
    results: dict[str, list[tuple[float, float]]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="txmq-floor-", dir=os.environ.get("TXMQ_BENCH_DIR")) as tmp:
        for r in range(args.rounds):
            order = VARIANTS if r % 2 == 0 else tuple(reversed(VARIANTS))
            for variant in order:
                folder = Path(tmp) / f"{variant}-{r}"
                folder.mkdir()
                results[variant].append(run_variant(variant, args.requests, folder))
                for f in folder.iterdir():
                    f.unlink()
    print(f"{args.rounds} rounds of {args.requests} requests, 1 in flight, {SIZE} B, blocking sockets")
    print("| variant | req/s (median) | p50 ms (median) | ratio to single (median of rounds) | added p50 ms |")
    print("|---|---|---|---|---|")
    single = results["single"]
    added_by_variant = {}
    for variant in VARIANTS:
        rows = results[variant]
        ratios = [rows[i][0] / single[i][0] for i in range(len(rows))]
        added = [rows[i][1] - single[i][1] for i in range(len(rows))]
        added_by_variant[variant] = statistics.median(added)
        print(
            f"| {variant} | {statistics.median(r[0] for r in rows):,.0f} | {statistics.median(r[1] for r in rows):.3f}"
            f" | {statistics.median(ratios):.2f} | {statistics.median(added):.3f} |"
        )
    added = added_by_variant["replicated"]
    for s in (float(x) for x in args.single_ms.split(",") if x):
        print(
            f"a broker whose single send takes {s:.2f} ms: replicated at best {s + added:.3f} ms, "
            f"ratio at most {s / (s + added):.2f}; 0.7 needs its own replication overhead under "
            f"{s / 0.7 - s - added:.3f} ms beyond this floor"
        )


if __name__ == "__main__":
    main()
