"""txmq in the peer harness: same method and output as the RabbitMQ / NATS / PostgreSQL anchors.

The repository's copy of the harness's ``bench/txmq_bench.py`` (from ``../shared/peers``, the peer harness of issue
16; see ``bench/peers/harness/README.md``). Changes from the shared copy: ``--system``/``--variant`` so that the same
client and method also measure Apache RocketMQ (a broker speaking the same 4.x remoting protocol), the consumer
reads the broker name from the topic's route instead of assuming ``broker-a``, and the consume window runs right
after the pipelined publish it reads back (before the transaction windows, so that a broker's work left over from
transactions does not fall on it).

Starts nothing itself: run_all.sh's EXTRA_BENCH_CMD starts the broker (``txmq_extra.sh``: `txmq dev`, SYNC_FLUSH
default; ``rocketmq_extra.sh``: Apache RocketMQ 5.5.0, SYNC_FLUSH) and passes its pid(s).
Cases, each emitted as one JSON line:
  publish sync (1 in flight)            txmq asyncio Producer.send, ack after fsync
  publish pipelined (N in flight)       N concurrent send() coroutines on one producer
  tx prepare+commit (K producers)       K concurrent send_message_in_transaction (no-op local tx, COMMIT);
                                        the window closes when every committed copy is stored (END is oneway)
  consume (pull, 32 per request)        PullConsumer reading back the pipelined topic

    $PY txmq_bench.py --namesrv 127.0.0.1:9876 --server-pid PID --data-dir D --out results.jsonl
"""

import argparse
import asyncio
import time

from common import Probe, emit, lat_stats, payload

from txmq.client import (
    Admin,
    LocalTransactionState,
    Message,
    MessageQueue,
    Producer,
    PullConsumer,
    PullStatus,
    TransactionProducer,
)
from txmq.errors import MQBrokerError

try:
    import uvloop
except ImportError:  # pragma: no cover
    uvloop = None


class NoOp:
    async def execute_local_transaction(self, message, arg):
        return LocalTransactionState.COMMIT

    async def check_local_transaction(self, message):
        return LocalTransactionState.COMMIT


async def make_topic(admin, topic, queues):
    info = await admin.cluster_info()
    await admin.create_topic(topic, cluster=next(iter(info.clusters)), read_queue_nums=queues, write_queue_nums=queues)


async def stored(admin, topic):
    stats = await admin.topic_stats(topic)
    return sum(t.max_offset - t.min_offset for t in stats.values())


async def publish_case(ns, topic, window, duration, warmup, probe_args):
    body = payload()
    p = Producer(f"peer_pg_{window}", ns)
    await p.start()
    for _ in range(20):
        await p.send(Message(topic, body))
    probe = Probe(**probe_args).start()
    t_meas = time.perf_counter() + warmup
    t_end = t_meas + duration
    lat = []
    errors = []

    async def worker():
        while (a := time.perf_counter()) < t_end:
            try:
                await p.send(Message(topic, body))
            except MQBrokerError as exc:  # e.g. RocketMQ's flow control (SYSTEM_BUSY): counted, not acknowledged
                errors.append(exc.code)
                continue
            b = time.perf_counter()
            if t_meas <= b < t_end:
                lat.append(b - a)

    await asyncio.gather(*(worker() for _ in range(window)))
    pr = probe.stop()
    await p.shutdown()
    return dict(
        errors=len(errors),
        count=len(lat),
        seconds=duration,
        rate=len(lat) / duration,
        lat_what=f"send -> durable ack, {window} in flight",
        **lat_stats(lat),
        **pr,
    )


async def tx_case(ns, admin, topic, producers, duration, warmup, probe_args):
    body = payload()
    p = TransactionProducer(f"peer_tpg_{producers}", ns, NoOp())
    await p.start()
    for _ in range(20):
        await p.send_message_in_transaction(Message(topic, body))
    t_w = time.perf_counter() + warmup

    async def warm():
        while time.perf_counter() < t_w:
            await p.send_message_in_transaction(Message(topic, body))

    await asyncio.gather(*(warm() for _ in range(producers)))
    await asyncio.sleep(0.2)
    before = await stored(admin, topic)
    probe = Probe(**probe_args).start()
    lat = []
    t0 = time.perf_counter()
    t_end = t0 + duration

    async def worker():
        while (a := time.perf_counter()) < t_end:
            await p.send_message_in_transaction(Message(topic, body))
            lat.append(time.perf_counter() - a)

    await asyncio.gather(*(worker() for _ in range(producers)))
    while await stored(admin, topic) - before < len(lat):
        await asyncio.sleep(0.005)
    el = time.perf_counter() - t0
    pr = probe.stop()
    await p.shutdown()
    return dict(
        count=len(lat),
        seconds=el,
        rate=len(lat) / el,
        unit="tx/s",
        lat_what=f"half sent -> local tx -> END sent, {producers} in flight; window ends when every commit is stored",
        **lat_stats(lat),
        **pr,
    )


async def consume_case(ns, admin, topic, probe_args):
    route = await admin.topic_route(topic)
    queues = [MessageQueue(topic, qd.broker_name, q) for qd in route.queue_datas for q in range(qd.read_queue_nums)]
    c = PullConsumer("peer_consumer", ns)
    await c.start()
    probe = Probe(**probe_args).start()
    n, t0 = 0, time.perf_counter()
    for mq in queues:
        off, end = await c.min_offset(mq), await c.max_offset(mq)
        while off < end:
            r = await c.pull(mq, "*", off, 32)
            if r.status is not PullStatus.FOUND:
                break
            n += len(r.messages)
            off = r.next_begin_offset
    el = time.perf_counter() - t0
    pr = probe.stop()
    await c.shutdown()
    return dict(count=n, seconds=el, rate=n / el, lat_what="pull 32 per request, one queue after another", **pr)


async def main_async(a):
    ns = a.namesrv
    admin = Admin(ns)
    await admin.start()
    probe_args = dict(server_pids=a.server_pid, data_dir=a.data_dir)
    common = dict(system=a.system, variant=a.variant, client="txmq asyncio client")
    for t in ("PeerSync", "PeerPipe", "PeerTx", "PeerWarm"):
        await make_topic(admin, t, 4)
    if a.warm_pass:
        # Unrecorded: a JVM broker's JIT compiles its send path here rather than in the first windows. Sends only:
        # after transactions RocketMQ 5.5's op-batch service keeps a core busy for minutes (bench/RESULTS.md).
        for window in (1, a.window):
            await publish_case(ns, "PeerWarm", window, a.warm_pass / 2, 0, probe_args)
        print(f"  (warm pass: {a.warm_pass:g} s of unrecorded sends at 1 and {a.window} in flight)", flush=True)
    r = await publish_case(ns, "PeerSync", 1, a.duration, a.warmup, probe_args)
    emit(a.out, mode="publish sync (1 in flight)", **common, **r)
    r = await publish_case(ns, "PeerPipe", a.window, a.duration, a.warmup, probe_args)
    emit(a.out, mode=f"publish pipelined ({a.window} in flight)", **common, **r)
    r = await consume_case(ns, admin, "PeerPipe", probe_args)
    emit(a.out, mode="consume (pull 32)", **common, **r)
    for k in a.tx_producers:
        r = await tx_case(ns, admin, "PeerTx", k, a.duration, a.warmup, probe_args)
        emit(a.out, mode=f"tx prepare+commit ({k} in flight)", **common, **r)
    await admin.shutdown()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--namesrv", default="127.0.0.1:9876")
    ap.add_argument(
        "--server-pid",
        type=int,
        action="append",
        default=[],
        help="a broker process to account (repeat for several: RocketMQ's broker and name server)",
    )
    ap.add_argument("--system", default="txmq")
    ap.add_argument("--variant", default="SYNC_FLUSH (default)")
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--duration", type=float, default=10)
    ap.add_argument("--warmup", type=float, default=1)
    ap.add_argument("--window", type=int, default=128)
    ap.add_argument(
        "--warm-pass",
        type=float,
        default=0,
        help="seconds of unrecorded sends (half at 1, half at --window in flight) before the windows",
    )
    ap.add_argument("--tx-producers", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16])
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if uvloop:
        uvloop.install()
    asyncio.run(main_async(a))
