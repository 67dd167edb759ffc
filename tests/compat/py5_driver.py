"""Scenario driver for the official RocketMQ 5.x Python client (``rocketmq-python-client``, gRPC).

Runs in its own venv (``.ci/setup-py5-client.sh``), never imports txmq, and prints one JSON object per line:
what it sent or received and a final ``summary``. Pytest (``tests/compat/py5_client.py``) decides what is right.

    produce  --endpoints E --topic T --count N [--tag A] [--delay-ms D] [--message-group G]
    receive  --endpoints E --topic T --group G --expect N --invisible S --seconds S [--no-ack]
    push     --endpoints E --topic T --group G --seconds S [--fail] [--stop-after N]
    transaction --endpoints E --topic T --count N --resolution commit|rollback|none --checker commit|rollback
                [--die-after-half] [--hold S --stop-after-checks N]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

_print_lock = threading.Lock()  # a push consumer's listener runs on many threads


def emit(event: str, **fields: object) -> None:
    line = json.dumps({"event": event, **fields})
    with _print_lock:
        print(line, flush=True)


CLIENT_LOG = Path.home() / "logs" / "rocketmq_python" / "rocketmq_client.log"
_log_start = CLIENT_LOG.stat().st_size if CLIENT_LOG.exists() else 0


def client_errors() -> str:
    """The errors the client logged during this run: why a route query failed, which the exception does not say."""
    try:
        with CLIENT_LOG.open("rb") as f:
            f.seek(_log_start)
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(line for line in text.splitlines() if "[ERROR]" in line)


def configuration(args: argparse.Namespace):
    from rocketmq import ClientConfiguration, Credentials

    return ClientConfiguration(args.endpoints, Credentials(args.ak, args.sk), request_timeout=args.request_timeout)


def describe(message) -> dict:
    return {
        "id": message.message_id,
        "topic": message.topic,
        "body": message.body.decode(errors="replace"),
        "tag": message.tag,
        "keys": list(message.keys or []),
        "attempt": message.delivery_attempt,
        "group": message.message_group,
        "properties": dict(message.properties or {}),
        "at": time.time(),
    }


def produce(args: argparse.Namespace) -> int:
    from rocketmq import Message, Producer

    producer = Producer(configuration(args), (args.topic,))
    producer.startup()
    sent = failed = 0
    try:
        for i in range(args.count):
            message = Message()
            message.topic = args.topic
            message.body = f"{args.body_prefix}{i}".encode()
            if args.tag:
                message.tag = args.tag
            message.keys = f"key-{i}"
            message.add_property("index", str(i))
            if args.message_group:
                message.message_group = args.message_group.format(i=i, k=i % 3)
            if args.delay_ms:
                message.delivery_timestamp = int(time.time() * 1000) + args.delay_ms
            try:
                receipt = producer.send(message)
            except Exception as exc:  # the scenario reports; pytest decides
                failed += 1
                emit("send_failed", index=i, error=f"{type(exc).__name__}: {exc}", log=client_errors())
                continue
            sent += 1
            emit("sent", index=i, id=receipt.message_id, body=message.body.decode(), at=time.time())
    finally:
        producer.shutdown()
    emit("summary", sent=sent, failed=failed)
    return 0


def receive(args: argparse.Namespace) -> int:
    from rocketmq import FilterExpression, SimpleConsumer

    expression = FilterExpression(args.tag_expression)
    consumer = SimpleConsumer(configuration(args), args.group, {args.topic: expression}, await_duration=args.await_s)
    consumer.startup()
    got = acked = errors = 0
    end = time.monotonic() + args.seconds
    try:
        while time.monotonic() < end and (args.expect <= 0 or got < args.expect):
            try:
                messages = consumer.receive(args.batch, args.invisible)
            except Exception as exc:
                errors += 1
                emit("receive_failed", error=f"{type(exc).__name__}: {exc}")
                time.sleep(0.2)
                continue
            for message in messages:
                got += 1
                emit("received", **describe(message))
                if not args.no_ack:
                    try:
                        consumer.ack(message)
                        acked += 1
                        emit("acked", id=message.message_id)
                    except Exception as exc:
                        emit("ack_failed", id=message.message_id, error=f"{type(exc).__name__}: {exc}")
    finally:
        consumer.shutdown()
    emit("summary", received=got, acked=acked, errors=errors)
    return 0


def push(args: argparse.Namespace) -> int:
    from rocketmq import ConsumeResult, FilterExpression, MessageListener, PushConsumer

    consumed = 0
    lock = threading.Lock()
    done = threading.Event()

    class Listener(MessageListener):
        def consume(self, message):
            nonlocal consumed
            failing = args.fail or message.body.decode(errors="replace") == args.fail_body
            result = ConsumeResult.FAILURE if failing else ConsumeResult.SUCCESS
            emit("consumed", result=result.name, **describe(message))
            with lock:
                consumed += 1
                if args.stop_after and consumed >= args.stop_after:
                    done.set()
            return result

    consumer = PushConsumer(configuration(args), args.group, Listener(), {args.topic: FilterExpression("*")})
    consumer.startup()
    try:
        done.wait(args.seconds)
    finally:
        consumer.shutdown()
    emit("summary", consumed=consumed)
    return 0


def transaction(args: argparse.Namespace) -> int:
    from rocketmq import Message, Producer, TransactionChecker, TransactionResolution

    answer = {"commit": TransactionResolution.COMMIT, "rollback": TransactionResolution.ROLLBACK}[args.checker]
    checked = threading.Event()
    checks = 0
    lock = threading.Lock()

    class Checker(TransactionChecker):
        def check(self, message):  # the broker asks about a half message nobody decided
            nonlocal checks
            emit("checked", id=message.message_id, body=message.body.decode(errors="replace"), answer=args.checker)
            with lock:
                checks += 1
                if args.stop_after_checks and checks >= args.stop_after_checks:
                    checked.set()
            return answer

    producer = Producer(configuration(args), (args.topic,), checker=Checker())
    producer.startup()
    try:
        for i in range(args.count):
            message = Message()
            message.topic = args.topic
            message.body = f"{args.body_prefix}{i}".encode()
            message.keys = f"key-{i}"
            tx = producer.begin_transaction()
            try:
                receipt = producer.send(message, tx)
            except Exception as exc:
                emit("send_failed", index=i, error=f"{type(exc).__name__}: {exc}", log=client_errors())
                continue
            emit("half", index=i, id=receipt.message_id, body=message.body.decode())
            if args.die_after_half:
                os.kill(os.getpid(), signal.SIGKILL)  # the orphan: no decision, no goodbye
            try:
                if args.resolution == "commit":
                    tx.commit()
                elif args.resolution == "rollback":
                    tx.rollback()
                emit("ended", index=i, id=receipt.message_id, resolution=args.resolution)
            except Exception as exc:
                emit("end_failed", index=i, error=f"{type(exc).__name__}: {exc}")
        if args.hold and checked.wait(args.hold):
            time.sleep(2)  # the client answers (EndTransaction) after check() returns, on its own thread
    finally:
        producer.shutdown()
    emit("summary", checks=checks)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="py5_driver")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("produce", "receive", "push", "transaction"):
        p = sub.add_parser(name)
        p.add_argument("--endpoints", required=True)
        p.add_argument("--topic", required=True)
        p.add_argument("--ak", default="")
        p.add_argument("--sk", default="")
        p.add_argument("--request-timeout", type=int, default=3)
    produce_p = sub.choices["produce"]
    produce_p.add_argument("--count", type=int, default=1)
    produce_p.add_argument("--body-prefix", default="m-")
    produce_p.add_argument("--tag", default="")
    produce_p.add_argument("--delay-ms", type=int, default=0)
    produce_p.add_argument("--message-group", default="")
    receive_p = sub.choices["receive"]
    receive_p.add_argument("--group", required=True)
    receive_p.add_argument("--expect", type=int, default=0)
    receive_p.add_argument("--batch", type=int, default=16)
    receive_p.add_argument("--invisible", type=int, default=15)
    receive_p.add_argument("--await-s", type=int, default=2)
    receive_p.add_argument("--seconds", type=float, default=20)
    receive_p.add_argument("--tag-expression", default="*")
    receive_p.add_argument("--no-ack", action="store_true")
    push_p = sub.choices["push"]
    push_p.add_argument("--group", required=True)
    push_p.add_argument("--seconds", type=float, default=20)
    push_p.add_argument("--fail", action="store_true")
    push_p.add_argument("--fail-body", default=None, help="fail only the message with this body")
    push_p.add_argument("--stop-after", type=int, default=0)
    tx_p = sub.choices["transaction"]
    tx_p.add_argument("--count", type=int, default=1)
    tx_p.add_argument("--body-prefix", default="tx-")
    tx_p.add_argument("--resolution", choices=["commit", "rollback", "none"], default="commit")
    tx_p.add_argument("--checker", choices=["commit", "rollback"], default="commit")
    tx_p.add_argument("--die-after-half", action="store_true")
    tx_p.add_argument("--hold", type=float, default=0)
    tx_p.add_argument("--stop-after-checks", type=int, default=0)
    args = parser.parse_args(argv)
    commands = {"produce": produce, "receive": receive, "push": push, "transaction": transaction}
    return commands[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
