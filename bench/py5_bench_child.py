"""The 5.x side of bench_grpc.py, run in the official client's venv (.venv-py5): sends with the official
``rocketmq-python-client`` Producer for a while at N in flight, or receives and acks with its SimpleConsumer, and
prints one JSON line of figures (after two "window" lines around the measured send window). Never imports txmq."""

from __future__ import annotations

import argparse
import json
import threading
import time


def window(phase: str) -> None:
    """Marks the measured window on stdout: bench_grpc.py samples the broker's CPU at these lines."""
    print(json.dumps({"event": "window", "phase": phase}), flush=True)


def send(args: argparse.Namespace) -> dict[str, float]:
    from rocketmq import ClientConfiguration, Credentials, Message, Producer

    producer = Producer(ClientConfiguration(args.endpoints, Credentials()), (args.topic,))
    producer.startup()
    body = b"x" * 1024

    def message() -> Message:
        m = Message()
        m.topic = args.topic
        m.body = body
        return m

    for _ in range(20):  # warm up: route, channel, settings
        producer.send(message())
    latencies: list[float] = []
    lock = threading.Lock()
    slots = threading.Semaphore(args.inflight)
    cpu0 = time.process_time()
    window("start")
    deadline = time.perf_counter() + args.seconds
    started = time.perf_counter()
    while time.perf_counter() < deadline:
        slots.acquire()
        t0 = time.perf_counter()
        future = producer.send_async(message())

        def done(f, t0=t0) -> None:
            if f.exception() is None:
                with lock:
                    latencies.append(time.perf_counter() - t0)
            slots.release()

        future.add_done_callback(done)
    for _ in range(args.inflight):
        slots.acquire()
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu0
    window("end")
    producer.shutdown()
    ordered = sorted(latencies)
    return {
        "client_cpu_s": cpu,
        "msgs": len(ordered),
        "rate": len(ordered) / elapsed,
        "p50_ms": ordered[len(ordered) // 2] * 1000 if ordered else float("nan"),
        "p99_ms": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1000 if ordered else float("nan"),
    }


def receive(args: argparse.Namespace) -> dict[str, float]:
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer

    consumer = SimpleConsumer(
        ClientConfiguration(args.endpoints, Credentials()), args.group, {args.topic: FilterExpression("*")}, 1
    )
    consumer.startup()
    got = 0
    started = time.perf_counter()
    while got < args.count and time.perf_counter() - started < args.seconds:
        for m in consumer.receive(32, 60):
            consumer.ack(m)
            got += 1
    elapsed = time.perf_counter() - started
    consumer.shutdown()
    return {"msgs": got, "rate": got / elapsed}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["send", "receive"])
    parser.add_argument("--endpoints", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", default="bench_py5_group")
    parser.add_argument("--inflight", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--count", type=int, default=0)
    args = parser.parse_args()
    print(json.dumps(send(args) if args.mode == "send" else receive(args)), flush=True)


if __name__ == "__main__":
    main()
