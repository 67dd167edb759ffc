"""Broker work per message, plain sends against transactions, without sockets or a client process.

bench_tx.py measures throughput, which on a shared 2-vCPU VM moves 20-30 % from one window to the next. This one
measures what a change to the broker's code does to its own work: an in-process broker (SYNC_FLUSH, a temporary
store) serves one connection whose transport is a stand-in, fed with pre-encoded frames the way a pipelining client
sends them: N sends in flight, and each answered prepare is followed at once by its oneway END_TRANSACTION (COMMIT)
and the next prepare. Frame building and response decoding are timed apart and left out.

It prints CPU microseconds per message (plain) or per transaction (tx) for the process and for each thread. With
``--instructions`` it runs itself twice under valgrind's callgrind (Debian package ``valgrind``), with few and with
more messages, and prints the difference in instructions per message. The VM's noise does not reach it: the same
code gives a plain send's count to within 0.3 % and a transaction's to within about 2 % (how the writer's groups fall
still varies), so the median of a few runs shows a change of a few per cent. Instructions leave out cache misses and
the kernel, so the throughput ratio in bench_tx.py stays the figure that counts; this is the one to compare two
versions of the code with.

    .venv/bin/python bench/bench_tx_cpu.py [--mode plain,tx] [--messages 25600] [--inflight N] [--instructions]

It runs on uvloop, as txmq's server commands do (``--loop asyncio`` for asyncio's own loop, whose interpreted
scheduling adds to every message's count). The broker runs without ``/metrics`` (metricsPort=0) unless
``--metrics`` is given, which turns it on with its request timing (``rocketmq_rpc_latency``): run both to see what
the metrics cost per message.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from txmq.broker.broker import Broker
from txmq.broker.config import BrokerConfig
from txmq.cli import SERVER_GC_THRESHOLDS
from txmq.client.api import send_v2_ext
from txmq.net import install_event_loop
from txmq.net.connection import Connection
from txmq.protocol.codes import RequestCode
from txmq.protocol.frame import FrameDecoder, RemotingCommand, encode_frame_parts
from txmq.protocol.record import decode_offset_msg_id, encode_properties

BODY = b"x" * 1024
TOPIC = "BenchCpu"
GROUP = "bench_cpu_pg"


class Client:
    """The client side, inside this process: a stand-in transport for the broker's connection that answers each
    batch of responses (one per event-loop turn) with the END_TRANSACTIONs they call for and the next sends."""

    def __init__(self, conn: Connection, transactional: bool, inflight: int) -> None:
        self.conn = conn
        self.transactional = transactional
        self.inflight = inflight
        self.decoder = FrameDecoder()
        self.responses: list[RemotingCommand] = []
        self.opaque = 0
        self.uniq: dict[int, str] = {}
        self.own = 0.0  # thread CPU seconds spent here, not in the broker
        self.total = 0
        self.sent = 0
        self.answered = 0
        self.scheduled = False
        self.finished: asyncio.Event = asyncio.Event()

    # -- the transport the broker writes to --------------------------------------------------------------------------

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name in ("peername", "sockname") else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass

    def write(self, data: bytes) -> None:
        started = time.thread_time()
        for cmd in self.decoder.feed(data):
            if cmd.code != 0:
                raise RuntimeError(f"the broker refused a request: {cmd.code} {cmd.remark}")
            self.responses.append(cmd)
        if not self.scheduled:
            self.scheduled = True
            asyncio.get_running_loop().call_soon(self._answer)
        self.own += time.thread_time() - started

    def writelines(self, parts: list[bytes]) -> None:
        self.write(b"".join(parts))

    # -- the client ----------------------------------------------------------------------------------------------

    def _frame(self, cmd: RemotingCommand) -> bytes:
        self.opaque += 1
        cmd.opaque = self.opaque
        head, body = encode_frame_parts(cmd)
        return head + body

    def _send(self) -> bytes:
        uniq = f"7F0000010000{self.opaque + 1:020X}"
        props = {"UNIQ_KEY": uniq, "WAIT": "true"}
        if self.transactional:
            props.update({"TRAN_MSG": "true", "PGROUP": GROUP})
            self.uniq[self.opaque + 1] = uniq
        ext = send_v2_ext(
            GROUP,
            TOPIC,
            4,
            self.opaque % 4,
            4 if self.transactional else 0,  # sysFlag PREPARED for a half message
            int(time.time() * 1000),
            0,
            encode_properties(props),
            0,
            None,
            False,
        )
        self.sent += 1
        return self._frame(RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, ext, BODY))

    def _end(self, response: RemotingCommand) -> bytes:
        ext = response.ext_fields
        uniq = self.uniq.pop(response.opaque)
        header = {
            "producerGroup": GROUP,
            "tranStateTableOffset": ext["queueOffset"],
            "commitLogOffset": str(decode_offset_msg_id(ext["msgId"])[1]),
            "commitOrRollback": "8",
            "fromTransactionCheck": "false",
            "msgId": uniq,
            "transactionId": uniq,
        }
        return self._frame(RemotingCommand.request(RequestCode.END_TRANSACTION, header, oneway=True))

    def _answer(self) -> None:
        started = time.thread_time()
        self.scheduled = False
        responses, self.responses = self.responses, []
        self.answered += len(responses)
        parts = [self._end(r) for r in responses] if self.transactional else []
        parts += [self._send() for _ in range(min(len(responses), self.total - self.sent))]
        data = b"".join(parts)
        self.own += time.thread_time() - started
        if data:
            self.conn.data_received(data)
        if self.answered >= self.total:
            self.finished.set()

    async def run(self, total: int, service: Any) -> None:
        self.total, self.sent, self.answered = total, 0, 0
        self.finished.clear()
        started = time.thread_time()
        data = b"".join(self._send() for _ in range(min(self.inflight, total)))
        self.own += time.thread_time() - started
        self.conn.data_received(data)
        await self.finished.wait()
        while service.busy:  # the last decisions are stored
            await asyncio.sleep(0.001)


def _threads() -> dict[str, float]:
    """CPU seconds (user + system) of each thread of this process, by its Python name."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):  # the thread ended since the listing
            continue
        out[names.get(int(tid), f"thread {tid}")] = (int(fields[11]) + int(fields[12])) / tick
    return out


def _metrics_port() -> int:
    if os.environ.get("TXMQ_BENCH_METRICS") != "1":
        return 0
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def measure(mode: str, messages: int, inflight: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="txmq-bench-cpu-") as tmp:
        config = BrokerConfig(
            listen_port=0,
            grpc_listen_port=0,
            metrics_port=_metrics_port(),
            broker_ip1="127.0.0.1",
            store_path_root_dir=tmp,
            flush_disk_type="SYNC_FLUSH",
        )
        broker = Broker(config)
        await broker.start("127.0.0.1")
        try:
            broker.topics.ensure(TOPIC, 4, 6)
            gc.collect()
            gc.freeze()
            gc.set_threshold(*SERVER_GC_THRESHOLDS)  # as txmq's server commands run
            conn = Connection(broker.dispatcher)
            client = Client(conn, mode == "tx", inflight)
            conn.connection_made(client)  # type: ignore[arg-type]
            await client.run(min(messages, 5 * inflight), broker.transactions)  # warm up
            client.own = 0.0
            threads0, process0, wall0 = _threads(), time.process_time(), time.perf_counter()
            await client.run(messages, broker.transactions)
            wall = time.perf_counter() - wall0
            process = time.process_time() - process0 - client.own
            threads1 = _threads()
        finally:
            await broker.close()
    main_thread = threading.main_thread().name
    per_thread = {}
    for name, seconds in threads1.items():
        used = seconds - threads0.get(name, 0.0) - (client.own if name == main_thread else 0.0)
        if used > 0:
            per_thread[name] = used / messages * 1e6
    return {"process_us": process / messages * 1e6, "threads_us": per_thread, "rate": messages / wall}


def instructions(mode: str, messages: int, inflight: int) -> float:
    """Instructions per message: two runs under callgrind, and the difference between them."""
    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
    counts = []
    small = max(inflight, messages // 5)
    for n in (small, messages):
        with tempfile.TemporaryDirectory(prefix="txmq-bench-cpu-cg-") as tmp:
            out = subprocess.run(
                [
                    "valgrind",
                    "--tool=callgrind",
                    f"--callgrind-out-file={tmp}/cg.out",
                    sys.executable,
                    __file__,
                    "--mode",
                    mode,
                    "--messages",
                    str(n),
                    "--inflight",
                    str(inflight),
                    "--loop",
                    os.environ["TXMQ_BENCH_LOOP"],
                ],
                capture_output=True,
                text=True,
                check=True,
            )
        found = re.search(r"Collected : (\d+)", out.stderr)
        if found is None:
            raise SystemExit(f"callgrind printed no count:\n{out.stderr[-2000:]}")
        counts.append(int(found.group(1)))
    return (counts[1] - counts[0]) / (messages - small)


def default_inflight(mode: str, counting: bool) -> int:
    """256 sends in flight, except for transactions counted under callgrind: there a round trip at 256 in flight
    takes longer than the transaction table's fresh window (``FRESH_MS``), so most half messages would be
    materialized and read back from the store before their decision, a path real runs (16 in flight, as the
    side-by-side benchmark and the load generator use) do not take."""
    return 16 if mode == "tx" and counting else 256


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", default="plain,tx")
    parser.add_argument("--messages", type=int, default=25_600)
    parser.add_argument(
        "--inflight",
        type=int,
        default=None,
        help="sends in flight (default 256; 16 for --mode tx under --instructions, see below)",
    )
    parser.add_argument("--instructions", action="store_true", help="count instructions under valgrind's callgrind")
    parser.add_argument(
        "--loop",
        choices=("uvloop", "asyncio"),
        default="uvloop",
        help="the event loop: uvloop as txmq's server commands run (when installed), or asyncio's default",
    )
    parser.add_argument("--metrics", action="store_true", help="serve /metrics (and time every request) as brokers do")
    args = parser.parse_args()
    if args.metrics:
        os.environ["TXMQ_BENCH_METRICS"] = "1"  # callgrind's runs of this script inherit it
    os.environ["TXMQ_BENCH_LOOP"] = args.loop  # callgrind's runs of this script too
    if args.loop == "uvloop" and install_event_loop() != "uvloop":
        raise SystemExit("uvloop is not installed (--loop asyncio runs without it)")
    modes = args.mode.split(",")
    rows = {}
    for mode in modes:
        if mode not in ("plain", "tx"):
            raise SystemExit(f"unknown mode {mode!r} (plain or tx)")
        inflight = args.inflight if args.inflight is not None else default_inflight(mode, args.instructions)
        if args.instructions:
            rows[mode] = instructions(mode, args.messages, inflight)
            print(f"{mode}: {rows[mode]:,.0f} instructions per {'transaction' if mode == 'tx' else 'message'}")
        else:
            r = asyncio.run(measure(mode, args.messages, inflight))
            rows[mode] = r["process_us"]
            threads = ", ".join(f"{name} {us:.1f}" for name, us in sorted(r["threads_us"].items()))
            print(f"{mode}: {r['process_us']:.1f} us CPU per message ({threads}); {r['rate']:.0f}/s", flush=True)
    if len(rows) == 2:
        print(
            f"transaction / plain send: {rows['tx'] / rows['plain']:.2f} (throughput ratio at saturation about "
            f"{rows['plain'] / rows['tx']:.2f})"
        )


if __name__ == "__main__":
    main()
