"""Command-line driver for the official RocketMQ C++ client (PyPI `rocketmq` 0.4.4: librocketmq.so via ctypes).

Runs only inside the .venv-cpp interpreter made by .ci/setup-cpp-client.sh, never in the main venv, and prints one
JSON object per line on stdout. docs/cpp-client.md describes the subcommands, events and exit codes.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any, NoReturn

EXIT_OK = 0
EXIT_CLIENT_ERROR = 1  # the C++ client raised, or a send failed
EXIT_USAGE = 2
EXIT_DEADLINE = 3  # the watchdog fired: something blocked inside librocketmq
EXIT_INCOMPLETE = 4  # consume/pull: --expect not reached before --timeout

# Properties worth reporting on received messages. The API has no way to list a message's properties.
REPORTED_PROPERTIES = (
    "UNIQ_KEY",
    "KEYS",
    "TAGS",
    "WAIT",
    "DELAY",
    "RETRY_TOPIC",
    "REAL_TOPIC",
    "REAL_QID",
    "TRAN_MSG",
    "PGROUP",
    "MIN_OFFSET",
    "MAX_OFFSET",
    "ORIGIN_MESSAGE_ID",
    "RECONSUME_TIME",
    "MAX_RECONSUME_TIMES",
    "CONSUME_START_TIME",
    "TRACE_ON",
    "MSG_REGION",
)

_output_lock = threading.Lock()
_started = time.monotonic()


def emit(event: str, **fields: Any) -> None:
    """Write one JSON line. Callbacks run on C++ threads, hence the lock."""
    line = json.dumps({"event": event, **fields}, default=str)
    with _output_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def finish(code: int) -> NoReturn:
    # os._exit skips the wrappers' __del__ (a second shutdown plus Destroy*) and C++ static destructors, which
    # only cost time at exit. Output is flushed line by line already.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def fail(error: str, message: str, code: int = EXIT_CLIENT_ERROR, **fields: Any) -> NoReturn:
    emit("error", error=error, message=message, **fields)
    finish(code)


def elapsed() -> float:
    return round(time.monotonic() - _started, 3)


def log_path() -> str:
    # librocketmq logs to $HOME/logs/rocketmq-cpp/<pid>_rocketmq-cpp.log.0 (from the first start() on).
    home = os.environ.get("HOME") or os.path.expanduser("~")
    return os.path.join(home, "logs", "rocketmq-cpp", f"{os.getpid()}_rocketmq-cpp.log.0")


class Watchdog:
    """Bounds the whole run: librocketmq can block far longer than its configured timeouts.

    It also ends the driver when its parent dies, so a killed test run leaves no clients behind.
    """

    def __init__(self, deadline: float, describe: Any = None) -> None:
        self.deadline = deadline
        self.phase = "init"
        self.describe = describe or (lambda: {})
        self._parent = os.getppid()
        threading.Thread(target=self._run, name="watchdog", daemon=True).start()

    def _run(self) -> None:
        end = _started + self.deadline
        while True:
            if os.getppid() != self._parent:
                finish(EXIT_DEADLINE)
            if time.monotonic() >= end:
                emit(
                    "error",
                    error="DeadlineExceeded",
                    message=f"no result within --deadline {self.deadline:g}s while in phase {self.phase!r} "
                    "(librocketmq blocks on an unresponsive name server or broker)",
                    phase=self.phase,
                    elapsed_s=elapsed(),
                    **self.describe(),
                )
                finish(EXIT_DEADLINE)
            time.sleep(min(0.1, max(0.0, end - time.monotonic())))


class StopFlag:
    """Set by SIGTERM/SIGINT: consumers stop, shut down and print their summary."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.reason = ""
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, _frame: Any) -> None:
        self.reason = signal.Signals(signum).name
        self.event.set()


def text_or_none(value: bytes | str | None) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


def describe_message(msg: Any, extra_properties: list[str]) -> dict[str, Any]:
    body = msg.body or b""  # a c_char_p: the wrapper truncates the body at its first NUL byte
    try:
        body_text, encoding = body.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        body_text, encoding = base64.b64encode(body).decode("ascii"), "base64"
    properties = {}
    for name in (*REPORTED_PROPERTIES, *extra_properties):
        value = text_or_none(msg.get_property(name))
        if value:
            properties[name] = value
    return {
        "msg_id": msg.id,
        "topic": msg.topic,
        "tags": text_or_none(msg.tags),
        "keys": text_or_none(msg.keys),
        "body": body_text,
        "body_encoding": encoding,
        "body_len": len(body),
        "queue_id": msg.queue_id,
        "queue_offset": msg.queue_offset,
        "reconsume_times": msg.reconsume_times,
        "delay_time_level": msg.delay_time_level,
        "store_size": msg.store_size,
        "born_timestamp": msg.born_timestamp,
        "store_timestamp": msg.store_timestamp,
        "commit_log_offset": msg.commit_log_offset,
        "prepared_transaction_offset": msg.prepared_transaction_offset,
        "properties": properties,
    }


def identity(record: dict[str, Any]) -> str:
    # Redeliveries from %RETRY% are new messages on the broker; UNIQ_KEY (or ORIGIN_MESSAGE_ID) ties them together.
    props = record["properties"]
    return props.get("UNIQ_KEY") or props.get("ORIGIN_MESSAGE_ID") or record["msg_id"]


def parse_properties(pairs: list[str]) -> list[tuple[str, str]]:
    result = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--property expects KEY=VALUE, got {pair!r}")
        result.append((key, value))
    return result


def exception_fields(exc: BaseException) -> dict[str, Any]:
    message = exc.args[0] if len(exc.args) == 1 else str(exc)
    if isinstance(message, bytes):  # ProducerSendAsyncFailed carries the raw C string
        message = message.decode("utf-8", "replace")
    fields: dict[str, Any] = {"error": type(exc).__name__, "message": str(message)}
    if isinstance(getattr(exc, "error", None), int):
        fields["code"] = exc.error  # type: ignore[attr-defined]
    return fields


# ---------------------------------------------------------------------------------------------------- produce


def cmd_produce(args: argparse.Namespace) -> NoReturn:
    from rocketmq.client import Message, Producer

    properties = parse_properties(args.property)
    progress = {"sent": 0, "failed": 0}
    watchdog = Watchdog(args.deadline, lambda: dict(progress))

    def build(i: int) -> Any:
        msg = Message(args.topic)
        if args.tag is not None:
            msg.set_tags(args.tag.format(i=i))
        if args.keys is not None:
            msg.set_keys(args.keys.format(i=i))
        body = f"{args.body_prefix}{i}"
        if args.body_size is not None:
            body = body.ljust(args.body_size, "x")
        msg.set_body(body)
        for key, value in properties:
            msg.set_property(key, value.format(i=i))
        if args.delay_level:
            msg.set_delay_time_level(args.delay_level)
        return msg

    def sent(i: int, result: Any, **extra: Any) -> None:
        progress["sent"] += 1
        fields: dict[str, Any] = {"i": i}
        if result is not None:
            fields.update(msg_id=result.msg_id, status=result.status.name, queue_offset=result.offset)
        emit("sent", **fields, **extra)

    def failed(i: int, exc: BaseException) -> None:
        progress["failed"] += 1
        emit("send_failed", i=i, **exception_fields(exc))

    watchdog.phase = "start"
    producer = Producer(args.group, timeout=args.send_timeout_ms)
    producer.set_namesrv_addr(args.namesrv)
    if args.access_key is not None:
        producer.set_session_credentials(args.access_key, args.secret_key or "", args.channel)
    if args.compress_level is not None:
        producer.set_compress_level(args.compress_level)
    if args.max_message_size is not None:
        producer.set_max_message_size(args.max_message_size)
    t0 = time.monotonic()
    producer.start()
    emit("started", role="producer", group=args.group, start_s=round(time.monotonic() - t0, 3), log=log_path())

    watchdog.phase = "send"
    t_send = time.monotonic()
    stop_on_error = not args.keep_going
    if args.mode == "async":
        # Outcomes arrive on C++ threads. Without a route the wrapper both calls the exception callback and
        # raises from send_async, so the first outcome per message wins.
        outcomes: dict[int, bool] = {}
        cond = threading.Condition()

        def settle(i: int, ok: bool, payload: Any) -> None:
            with cond:
                if i in outcomes:
                    return
                outcomes[i] = ok
                if ok:
                    sent(i, payload)
                else:
                    failed(i, payload)
                cond.notify_all()

        # A failure reported by the callback while send_async is still running is held back: send_async then
        # raises too, with the better message.
        issuing: dict[str, Any] = {"i": None, "held": None}

        def on_exception(i: int, exc: BaseException) -> None:
            with cond:
                if issuing["i"] == i:
                    issuing["held"] = exc
                    return
            settle(i, False, exc)

        issued = 0
        for i in range(args.count):
            issued += 1
            with cond:
                issuing.update(i=i, held=None)
            raised: Exception | None = None
            try:
                producer.send_async(
                    build(i),
                    lambda result, i=i: settle(i, True, result),
                    lambda exc, i=i: on_exception(i, exc),
                )
            except Exception as exc:
                raised = exc
            with cond:
                held = issuing["held"]
                issuing.update(i=None, held=None)
            if raised is not None or held is not None:
                settle(i, False, raised or held)
                if stop_on_error:
                    break
        watchdog.phase = "await_async"
        with cond:
            cond.wait_for(lambda: len(outcomes) >= issued)
    elif args.mode == "batch":
        size = args.batch_size or max(args.count, 1)
        for start in range(0, args.count, size):
            indexes = range(start, min(start + size, args.count))
            try:
                result = producer.send_batch([build(i) for i in indexes])
            except Exception as exc:
                for i in indexes:
                    failed(i, exc)
                if stop_on_error:
                    break
                continue
            # The C++ client reports one result per batch; its msg_id may list every id, comma-separated.
            ids = result.msg_id.split(",")
            for n, i in enumerate(indexes):
                sent(i, result, batch=start // size, batch_msg_id=ids[n] if len(ids) == len(indexes) else None)
    else:
        for i in range(args.count):
            try:
                if args.mode == "sync":
                    sent(i, producer.send_sync(build(i)))
                elif args.mode == "oneway":
                    producer.send_oneway(build(i))
                    sent(i, None)
                else:  # orderly: the package's hashing selector picks queue = sharding_key % queue_count
                    key = i % args.sharding_key_mod
                    sent(i, producer.send_orderly(build(i), key, retry_times=args.retry_times), sharding_key=key)
            except Exception as exc:
                failed(i, exc)
                if stop_on_error:
                    break
    send_s = time.monotonic() - t_send

    watchdog.phase = "shutdown"
    t0 = time.monotonic()
    producer.shutdown()
    shutdown_s = round(time.monotonic() - t0, 3)
    emit(
        "summary",
        mode=args.mode,
        requested=args.count,
        sent=progress["sent"],
        failed=progress["failed"],
        send_s=round(send_s, 3),
        rate_per_s=round(progress["sent"] / send_s, 1) if send_s > 0 else None,
        shutdown_s=shutdown_s,
        elapsed_s=elapsed(),
    )
    if progress["failed"]:
        fail("SendFailed", f"{progress['failed']} of {args.count} messages failed", **progress)
    finish(EXIT_OK)


# ---------------------------------------------------------------------------------------------------- consume


class Tally:
    """Deliveries per message identity, and the accept/reject decision for --fail-first / --fail-all."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.lock = threading.Lock()
        self.deliveries: dict[str, int] = {}
        self.accepted: set[str] = set()
        self.total = 0
        self.first_message_s: float | None = None
        self.reached = threading.Event()

    def record(self, msg: Any) -> bool:
        """Emit one `received` line; return True to acknowledge the message."""
        record = describe_message(msg, self.args.property_key)
        key = identity(record)
        with self.lock:
            self.total += 1
            if self.first_message_s is None:
                self.first_message_s = elapsed()
            delivery = self.deliveries.get(key, 0) + 1
            self.deliveries[key] = delivery
            # Count earlier deliveries by the broker's reconsume_times as well as by what this process saw: when a
            # callback rejects a message, librocketmq sends back the rest of its pull batch without showing it.
            earlier = max(record["reconsume_times"], delivery - 1)
            fail_first = getattr(self.args, "fail_first", 0) or 0
            accept = not getattr(self.args, "fail_all", False) and earlier >= fail_first
            if accept:
                self.accepted.add(key)
            emit("received", **record, identity=key, delivery=delivery, accepted=accept)
            if self.args.expect is not None and self.distinct() >= self.args.expect:
                self.reached.set()
        return accept

    def distinct(self) -> int:
        # With --fail-all nothing is ever acknowledged: count what arrived instead.
        return len(self.deliveries) if getattr(self.args, "fail_all", False) else len(self.accepted)

    def summary(self) -> dict[str, Any]:
        with self.lock:
            return {
                "received": self.total,
                "distinct": self.distinct(),
                "redelivered": sum(1 for n in self.deliveries.values() if n > 1),
                "first_message_s": self.first_message_s,
            }


def wait_until_done(args: argparse.Namespace, tally: Tally, stop: StopFlag) -> str:
    """Wait for --expect (plus --linger), --timeout or a signal; return why we stopped."""
    end = time.monotonic() + args.timeout
    while time.monotonic() < end and not stop.event.is_set():
        if tally.reached.is_set():
            linger_end = min(end, time.monotonic() + args.linger)
            while time.monotonic() < linger_end and not stop.event.is_set():
                stop.event.wait(min(0.1, max(0.0, linger_end - time.monotonic())))
            return "signal" if stop.event.is_set() else "expected"
        stop.event.wait(min(0.1, max(0.0, end - time.monotonic())))
    if stop.event.is_set():
        return "signal"
    return "expected" if tally.reached.is_set() else "timeout"


def finish_consumer(args: argparse.Namespace, tally: Tally, reason: str, shutdown_s: float) -> NoReturn:
    complete = args.expect is None or tally.distinct() >= args.expect
    emit(
        "summary",
        **tally.summary(),
        expected=args.expect,
        complete=complete,
        stopped=reason,
        shutdown_s=shutdown_s,
        elapsed_s=elapsed(),
    )
    if reason == "signal" or complete:
        finish(EXIT_OK)
    fail(
        "Incomplete",
        f"got {tally.distinct()} of {args.expect} expected messages within {args.timeout:g}s",
        code=EXIT_INCOMPLETE,
    )


def cmd_consume(args: argparse.Namespace) -> NoReturn:
    from rocketmq.client import MessageModel, PushConsumer, RecvMessage
    from rocketmq.exceptions import ffi_check
    from rocketmq.ffi import _CConsumeStatus, dll

    stop = StopFlag()
    tally = Tally(args)
    watchdog = Watchdog(args.deadline, tally.summary)

    model = MessageModel.BROADCASTING if args.mode == "broadcasting" else MessageModel.CLUSTERING
    consumer = PushConsumer(args.group, orderly=args.orderly, message_model=model)
    consumer.set_namesrv_addr(args.namesrv)
    if args.access_key is not None:
        consumer.set_session_credentials(args.access_key, args.secret_key or "", args.channel)
    if args.threads is not None:
        consumer.set_thread_count(args.threads)
    if args.batch_max_size is not None:
        consumer.set_message_batch_max_size(args.batch_max_size)
    instance_name = args.instance_name
    if instance_name is None and args.mode == "broadcasting":
        # Broadcasting offsets live in $HOME/.rocketmq_offsets/<ip>@<instance>/<group>/offsets.Json, shared by
        # every process on the host with the same instance name: isolate each driver run.
        instance_name = f"cpp_driver_{os.getpid()}"
    if instance_name is not None:
        consumer.set_instance_name(instance_name)

    if args.reject_by == "raise":
        # The package's own path: subscribe() turns an exception into RECONSUME_LATER by re-raising it out of the
        # ctypes callback, which hands librocketmq an uninitialised int (non-zero, i.e. RECONSUME_LATER, in
        # practice; not guaranteed). Each rejection also prints a traceback on stderr.
        def on_message(msg: Any) -> None:
            if not tally.record(msg):
                raise RuntimeError("rejected by cpp_driver (--fail-first/--fail-all)")

        consumer.subscribe(args.topic, on_message, args.expression)
    else:
        # Same registration as subscribe(), but the callback returns the status itself.
        def on_raw_message(_consumer: Any, msg: Any) -> int:
            try:
                ok = tally.record(RecvMessage(msg))
            except Exception:
                traceback.print_exc()
                ok = False
            status = _CConsumeStatus.CONSUME_SUCCESS if ok else _CConsumeStatus.RECONSUME_LATER
            return status.value

        ffi_check(dll.Subscribe(consumer._handle, args.topic.encode(), args.expression.encode()))
        consumer._register_callback(on_raw_message)

    watchdog.phase = "start"
    t0 = time.monotonic()
    consumer.start()
    emit(
        "started",
        role="push_consumer",
        group=args.group,
        orderly=args.orderly,
        mode=args.mode,
        instance_name=instance_name or "DEFAULT",
        start_s=round(time.monotonic() - t0, 3),
        log=log_path(),
    )

    watchdog.phase = "consume"
    reason = wait_until_done(args, tally, stop)

    watchdog.phase = "shutdown"
    t0 = time.monotonic()
    consumer.shutdown()  # callbacks may still run (and print) until this returns
    finish_consumer(args, tally, reason, round(time.monotonic() - t0, 3))


# ---------------------------------------------------------------------------------------------------- pull


def fetch_queues(consumer: Any, topic: str) -> list[dict[str, Any]] | None:
    """The queues the pull consumer sees. PullConsumer.pull() hides them, and yields nothing when there is no route."""
    import ctypes

    from rocketmq.ffi import _CMessageQueue, dll

    queues = ctypes.POINTER(_CMessageQueue)()
    size = ctypes.c_int()
    status = dll.FetchSubscriptionMessageQueues(
        consumer._handle, topic.encode(), ctypes.pointer(queues), ctypes.pointer(size)
    )
    if status != 0:
        return None
    try:
        return [{"broker": queues[n].brokerName.decode(), "queue_id": queues[n].queueId} for n in range(size.value)]
    finally:
        if size.value:
            dll.ReleaseSubscriptionMessageQueue(queues)


def cmd_pull(args: argparse.Namespace) -> NoReturn:
    from rocketmq.client import PullConsumer

    stop = StopFlag()
    tally = Tally(args)
    watchdog = Watchdog(args.deadline, tally.summary)

    consumer = PullConsumer(args.group)
    consumer.set_namesrv_addr(args.namesrv)
    if args.access_key is not None:
        consumer.set_session_credentials(args.access_key, args.secret_key or "", args.channel)
    watchdog.phase = "start"
    t0 = time.monotonic()
    consumer.start()
    emit("started", role="pull_consumer", group=args.group, start_s=round(time.monotonic() - t0, 3), log=log_path())

    end = time.monotonic() + args.timeout
    seen_queues: list[dict[str, Any]] | None = None
    reason = "timeout"
    while time.monotonic() < end:
        if stop.event.is_set():
            reason = "signal"
            break
        watchdog.phase = "route"
        queues = fetch_queues(consumer, args.topic)
        if queues != seen_queues:
            emit("queues", queues=queues)
            seen_queues = queues
        watchdog.phase = "pull"
        # pull() walks every queue from the offsets it keeps in memory (starting at 0; nothing is committed to the
        # broker) until NO_NEW_MSG. It spins on BROKER_TIMEOUT, which the watchdog bounds.
        for msg in consumer.pull(args.topic, args.expression, args.max_num):
            tally.record(msg)
            if tally.reached.is_set():
                break
        if tally.reached.is_set():
            reason = "expected"
            break
        stop.event.wait(min(args.interval, max(0.0, end - time.monotonic())))

    watchdog.phase = "shutdown"
    t0 = time.monotonic()
    consumer.shutdown()
    finish_consumer(args, tally, reason, round(time.monotonic() - t0, 3))


# ---------------------------------------------------------------------------------------------------- info


def cmd_info(_args: argparse.Namespace) -> NoReturn:
    from importlib.metadata import version

    import rocketmq.client  # loads librocketmq.so
    import rocketmq.ffi

    emit(
        "info",
        rocketmq_version=version("rocketmq"),
        library=rocketmq.ffi._DYLIB_PATH,
        library_loaded=rocketmq.client.dll is not None,
        python=sys.version.split()[0],
        executable=sys.executable,
        log_dir=os.path.dirname(log_path()),
    )
    finish(EXIT_OK)


# ---------------------------------------------------------------------------------------------------- CLI


class JsonArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        fail("UsageError", f"{self.prog}: {message}", code=EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    client = JsonArgumentParser(add_help=False)
    client.add_argument("--namesrv", required=True, help="name server HOST:PORT (several: separated by ';')")
    client.add_argument("--access-key")
    client.add_argument("--secret-key")
    client.add_argument("--channel", default="ALIYUN", help="OnsChannel sent with credentials")
    client.add_argument("--deadline", type=float, help="watchdog: give up after this many seconds in total")

    consuming = JsonArgumentParser(add_help=False)
    consuming.add_argument("--topic", required=True)
    consuming.add_argument("--group", required=True)
    consuming.add_argument("--expression", default="*", help="tag expression, e.g. 'TagA || TagB'")
    consuming.add_argument("--expect", type=int, help="stop after this many distinct acknowledged messages")
    consuming.add_argument("--timeout", type=float, default=30.0, help="stop after this many seconds")
    consuming.add_argument("--property-key", action="append", default=[], help="also report this property")

    parser = JsonArgumentParser(prog="cpp_driver", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=JsonArgumentParser)

    sub.add_parser("info", help="report the package and library")

    produce = sub.add_parser("produce", parents=[client], help="send messages")
    produce.add_argument("--topic", required=True)
    produce.add_argument("--count", type=int, default=1)
    produce.add_argument("--mode", choices=["sync", "async", "oneway", "orderly", "batch"], default="sync")
    produce.add_argument("--group", default="txmq_cpp_producer")
    produce.add_argument("--tag", help="tag; '{i}' is replaced by the message index")
    produce.add_argument("--keys", help="keys (space-separated); '{i}' is replaced by the message index")
    produce.add_argument("--body-prefix", default="msg-", help="body is PREFIX followed by the index")
    produce.add_argument("--body-size", type=int, help="pad bodies with 'x' to this many bytes")
    produce.add_argument("--property", action="append", default=[], help="KEY=VALUE user property ('{i}' ok)")
    produce.add_argument("--sharding-key-mod", type=int, default=1, help="orderly: sharding key = index %% M")
    produce.add_argument("--retry-times", type=int, default=3, help="orderly: retries")
    produce.add_argument("--batch-size", type=int, help="batch: messages per batch (default: all)")
    produce.add_argument("--delay-level", type=int, default=0)
    produce.add_argument("--send-timeout-ms", type=int, default=3000)
    produce.add_argument("--compress-level", type=int)
    produce.add_argument("--max-message-size", type=int)
    produce.add_argument("--keep-going", action="store_true", help="continue after a failed send")

    consume = sub.add_parser("consume", parents=[client, consuming], help="run a push consumer")
    consume.add_argument("--mode", choices=["clustering", "broadcasting"], default="clustering")
    consume.add_argument("--orderly", action="store_true")
    failing = consume.add_mutually_exclusive_group()
    failing.add_argument(
        "--fail-first",
        type=int,
        default=0,
        help="reject a delivery while reconsume_times (or this process's count of earlier deliveries) < K",
    )
    failing.add_argument("--fail-all", action="store_true", help="reject every delivery")
    consume.add_argument(
        "--reject-by",
        choices=["return", "raise"],
        default="return",
        help="return RECONSUME_LATER from the callback (default) or raise like an application would",
    )
    consume.add_argument("--linger", type=float, default=0.0, help="keep consuming this long after --expect")
    consume.add_argument("--threads", type=int)
    consume.add_argument("--batch-max-size", type=int, help="set_message_batch_max_size (messages per callback batch)")
    consume.add_argument("--instance-name")

    pull = sub.add_parser("pull", parents=[client, consuming], help="poll with the pull consumer")
    pull.add_argument("--max-num", type=int, default=32)
    pull.add_argument("--interval", type=float, default=0.2, help="pause between rounds over all queues")
    return parser


COMMANDS = {"info": cmd_info, "produce": cmd_produce, "consume": cmd_consume, "pull": cmd_pull}


def main(argv: list[str] | None = None) -> NoReturn:
    args = build_parser().parse_args(argv)
    if getattr(args, "deadline", None) is None and args.command != "info":
        args.deadline = 60.0 if args.command == "produce" else args.timeout + 30.0
    if args.command == "produce" and args.sharding_key_mod < 1:
        fail("UsageError", "--sharding-key-mod must be at least 1", code=EXIT_USAGE)
    try:
        COMMANDS[args.command](args)
    except Exception as exc:
        fail(**exception_fields(exc), elapsed_s=elapsed())


if __name__ == "__main__":
    main()
