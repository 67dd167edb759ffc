"""``txmq admin``: topics, cluster, messages, consumer progress, and ``send`` / ``tail`` for quick tries."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import importlib
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from txmq.errors import TxmqError
from txmq.protocol.topics import (
    AUTO_CREATE_TOPIC_KEY,
    BENCHMARK_TOPIC,
    DLQ_GROUP_TOPIC_PREFIX,
    NOT_ALLOWED_SEND_TOPICS,
    RETRY_GROUP_TOPIC_PREFIX,
    SYSTEM_TOPIC_PREFIX,
)

DEFAULT_NAMESRV = "127.0.0.1:9876"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain aligned text table."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _ts(ms: int) -> str:
    if ms <= 0:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def _body_text(body: bytes, limit: int = 200) -> str:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return f"<{len(body)} bytes, not UTF-8>"
    return text if len(text) <= limit else text[:limit] + f"... ({len(body)} bytes)"


def _describe_message(msg: Any) -> str:
    props = {k: v for k, v in msg.properties.items()}
    rows = [
        ("Topic", msg.topic),
        ("Msg id (UNIQ_KEY)", msg.msg_id),
        ("Offset msg id", msg.offset_msg_id),
        ("Queue", f"{msg.queue_id} @ offset {msg.queue_offset}"),
        ("Commit-log offset", msg.commit_log_offset),
        ("Tags", msg.tags or "-"),
        ("Keys", msg.properties.get("KEYS", "-")),
        ("Born", f"{_ts(msg.born_timestamp)} from {msg.born_host[0]}:{msg.born_host[1]}"),
        ("Stored", f"{_ts(msg.store_timestamp)} on {msg.store_host[0]}:{msg.store_host[1]}"),
        ("Reconsume times", msg.reconsume_times),
        ("Sys flag", msg.sys_flag),
        ("Properties", ", ".join(f"{k}={v}" for k, v in sorted(props.items()))),
        ("Body", _body_text(msg.body)),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


# -- commands ------------------------------------------------------------------------------------------------------


def credentials(args: argparse.Namespace) -> dict[str, str]:
    """``access_key``/``secret_key`` client options from ``--access-key``/``--secret-key`` (or the environment)."""
    access_key, secret_key = getattr(args, "access_key", None), getattr(args, "secret_key", None)
    return {"access_key": access_key, "secret_key": secret_key} if access_key or secret_key else {}


async def _with_admin(args: argparse.Namespace, fn: Callable[[Any], Awaitable[int]]) -> int:
    from txmq.client import Admin

    admin = Admin(args.namesrv, **credentials(args))
    await admin.start()
    try:
        return await fn(admin)
    finally:
        await admin.shutdown()


async def topic_create(args: argparse.Namespace) -> int:
    async def run(admin: Any) -> int:
        cluster = None if args.broker else args.cluster
        if cluster is None and not args.broker:
            info = await admin.cluster_info()
            cluster = next(iter(sorted(info.clusters)), None)
            if cluster is None:
                print("txmq: no broker is registered with the name server", file=sys.stderr)
                return 1
        addrs = await admin.create_topic(
            args.topic,
            cluster=cluster,
            broker_addr=args.broker,
            read_queue_nums=args.queues,
            write_queue_nums=args.queues,
            order=args.order,
        )
        print(f"topic {args.topic} created with {args.queues} queues on {', '.join(addrs)}")
        return 0

    return await _with_admin(args, run)


async def topic_list(args: argparse.Namespace) -> int:
    async def run(admin: Any) -> int:
        topics = await admin.topic_list()
        shown = [t for t in topics if args.all or not _is_system(t)]
        print(table(["Topic"], [[t] for t in shown]))
        return 0

    return await _with_admin(args, run)


_SYSTEM_TOPICS = frozenset({AUTO_CREATE_TOPIC_KEY, BENCHMARK_TOPIC}) | NOT_ALLOWED_SEND_TOPICS


def _is_system(topic: str) -> bool:
    return (
        topic.startswith((RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX))
        or topic.lower().startswith(SYSTEM_TOPIC_PREFIX)
        or topic in _SYSTEM_TOPICS
    )


async def topic_stats(args: argparse.Namespace) -> int:
    async def run(admin: Any) -> int:
        stats = await admin.topic_stats(args.topic)
        rows = [
            (mq.broker_name, mq.queue_id, s.min_offset, s.max_offset, _ts(s.last_update_timestamp))
            for mq, s in stats.items()
        ]
        print(table(["Broker", "Queue", "Min offset", "Max offset", "Last stored"], rows))
        return 0

    return await _with_admin(args, run)


def _replication_column(rt: dict[str, Any]) -> str:
    """A master: slaves in sync and the smallest lag; a slave: its link's state and durable offset. In controller
    mode also the replica's controller role, the epoch and the in-sync set as etcd holds them."""
    out = "-"
    if "haSlavesInSync" in rt:
        lag = rt.get("haSlaveLagBytes", "-1")
        out = f"{rt['haSlavesInSync']} in sync" + (f", lag {lag} B" if str(lag) != "-1" else "")
    elif "haReplicaState" in rt:
        out = f"{rt['haReplicaState']} at {rt.get('haSlaveDurableOffset', '-')}"
    if "haEpoch" in rt:
        role, members = rt.get("haControllerRole", "-"), rt.get("haSyncStateSet", "")
        out += f"; {role}, epoch {rt['haEpoch']}, in-sync set [{members}]"
    return out


async def cluster(args: argparse.Namespace) -> int:
    async def run(admin: Any) -> int:
        info = await admin.cluster_info()
        rows = []
        for cluster_name, names in sorted(info.clusters.items()):
            for name in names:
                for broker_id, addr in sorted(info.broker_addrs.get(name, {}).items()):
                    try:
                        rt = await admin.broker_runtime_info(addr)
                    except TxmqError as exc:
                        rt = {"brokerVersionDesc": f"unreachable: {exc}"}
                    rows.append(
                        (
                            cluster_name,
                            name,
                            broker_id,
                            addr,
                            rt.get("brokerRole", "-"),
                            _replication_column(rt),
                            rt.get("brokerVersionDesc", "-"),
                            rt.get("msgPutTotalTodayNow", "-"),
                            rt.get("msgGetTotalTodayNow", "-"),
                            rt.get("flushDiskType", "-"),
                        )
                    )
        print(
            table(["Cluster", "Broker", "Id", "Address", "Role", "Replication", "Version", "Put", "Get", "Flush"], rows)
        )
        return 0

    return await _with_admin(args, run)


async def message_by_id(args: argparse.Namespace) -> int:
    async def run(admin: Any) -> int:
        msg = await admin.view_message(args.id, args.topic)
        print(_describe_message(msg))
        return 0

    return await _with_admin(args, run)


async def message_by_key(args: argparse.Namespace) -> int:
    async def run(admin: Any) -> int:
        found = await admin.query_message_by_key(args.topic, args.key, args.max)
        if not found:
            print(f"no message of {args.topic} has key {args.key}")
            return 1
        for i, msg in enumerate(found):
            if i:
                print()
            print(_describe_message(msg))
        return 0

    return await _with_admin(args, run)


async def consumer_progress(args: argparse.Namespace) -> int:
    async def run(admin: Any) -> int:
        stats = await admin.consume_stats(args.group, args.topic)
        rows = [
            (
                mq.topic,
                mq.broker_name,
                mq.queue_id,
                w.broker_offset,
                w.consumer_offset,
                max(0, w.broker_offset - w.consumer_offset),
                _ts(w.last_timestamp),
            )
            for mq, w in stats.offset_table.items()
        ]
        print(table(["Topic", "Broker", "Queue", "Broker offset", "Consumer offset", "Lag", "Last consumed"], rows))
        print(f"\nTotal lag: {stats.diff_total}")
        try:
            ids = await admin.consumer_ids(args.group)
        except TxmqError:
            ids = []
        print(f"Online consumers: {', '.join(ids) if ids else 'none'}")
        return 0

    return await _with_admin(args, run)


async def send(args: argparse.Namespace) -> int:
    from txmq.client import Message, Producer

    producer = Producer(args.group, args.namesrv, **credentials(args))
    await producer.start()
    try:
        for i in range(args.count):
            body = args.body if args.count == 1 else f"{args.body} {i}"
            result = await producer.send(Message(args.topic, body, tags=args.tags, keys=args.keys))
            mq = result.message_queue
            print(
                f"{result.status.value} msgId={result.msg_id} offsetMsgId={result.offset_msg_id} "
                f"queue={mq.broker_name}:{mq.queue_id} offset={result.queue_offset}"
            )
    finally:
        await producer.shutdown()
    return 0


async def tail(args: argparse.Namespace) -> int:
    from txmq.client import PullConsumer, PullStatus

    consumer = PullConsumer(args.group, args.namesrv, **credentials(args))
    await consumer.start()
    seen = 0
    try:
        queues = await consumer.fetch_queues(args.topic)
        offsets = {}
        for mq in queues:
            offsets[mq] = await (consumer.min_offset(mq) if args.from_beginning else consumer.max_offset(mq))
        print(
            f"tailing {args.topic} ({len(queues)} queues){' from the beginning' if args.from_beginning else ''}; "
            "Ctrl-C to stop",
            file=sys.stderr,
            flush=True,
        )

        async def follow(mq: Any) -> None:
            nonlocal seen
            while args.count is None or seen < args.count:
                result = await consumer.pull_blocking(mq, args.expression, offsets[mq], 32)
                if result.status is PullStatus.FOUND:
                    for msg in result.messages:
                        print(
                            f"[{mq.broker_name}:{mq.queue_id}@{msg.queue_offset}] {_ts(msg.store_timestamp)} "
                            f"tags={msg.tags or '-'} keys={msg.properties.get('KEYS', '-')} "
                            f"{_body_text(msg.body)}",
                            flush=True,
                        )
                        seen += 1
                offsets[mq] = result.next_begin_offset

        tasks = [asyncio.create_task(follow(mq)) for mq in queues]
        if args.count is None:
            await asyncio.gather(*tasks)
        else:
            while seen < args.count:
                await asyncio.sleep(0.05)
            for t in tasks:
                t.cancel()
    finally:
        await consumer.shutdown()
    return 0


# -- parser ----------------------------------------------------------------------------------------------------------


def _run(coro_fn: Callable[[argparse.Namespace], Awaitable[int]]) -> Callable[[argparse.Namespace], int]:
    def runner(args: argparse.Namespace) -> int:
        try:
            return asyncio.run(coro_fn(args))  # type: ignore[arg-type]
        except TxmqError as exc:
            print(f"txmq: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 130

    return runner


def add_admin_parser(sub: Any) -> None:
    admin = sub.add_parser("admin", help="manage and inspect a running cluster")
    admin.add_argument(
        "-n",
        "--namesrv",
        default=os.environ.get("TXMQ_NAMESRV", DEFAULT_NAMESRV),
        help=f"name server address(es), ';'-separated (default $TXMQ_NAMESRV or {DEFAULT_NAMESRV})",
    )
    admin.add_argument(
        "--access-key",
        default=os.environ.get("TXMQ_ACCESS_KEY"),
        help="ACL accessKey to sign requests with (default $TXMQ_ACCESS_KEY)",
    )
    admin.add_argument(
        "--secret-key",
        default=os.environ.get("TXMQ_SECRET_KEY"),
        help="ACL secretKey (default $TXMQ_SECRET_KEY; the environment keeps it out of the process list)",
    )
    what = admin.add_subparsers(dest="admin_command", required=True)

    topic = what.add_parser("topic", help="create, list and inspect topics").add_subparsers(dest="op", required=True)
    create = topic.add_parser("create", help="create or update a topic")
    create.add_argument("topic")
    create.add_argument("-q", "--queues", type=int, default=8)
    create.add_argument(
        "-c", "--cluster", default=None, help="create on every master of this cluster (default: the first)"
    )
    create.add_argument("-b", "--broker", default=None, help="create on this broker address only")
    create.add_argument("--order", action="store_true")
    create.set_defaults(func=_run(topic_create))
    lst = topic.add_parser("list", help="list topics")
    lst.add_argument("-a", "--all", action="store_true", help="include system, retry and DLQ topics")
    lst.set_defaults(func=_run(topic_list))
    stats = topic.add_parser("stats", help="offsets of every queue of a topic")
    stats.add_argument("topic")
    stats.set_defaults(func=_run(topic_stats))

    cluster_parser = what.add_parser("cluster", help="brokers, roles, replication (epochs, in-sync sets) and figures")
    cluster_parser.add_argument("op", nargs="?", choices=["list"], default="list", help="list (the default)")
    cluster_parser.set_defaults(func=_run(cluster))

    message = what.add_parser("message", help="find messages").add_subparsers(dest="op", required=True)
    by_id = message.add_parser("id", help="by offsetMsgId, or by msgId (UNIQ_KEY) with --topic")
    by_id.add_argument("id")
    by_id.add_argument("-t", "--topic", default=None)
    by_id.set_defaults(func=_run(message_by_id))
    by_key = message.add_parser("key", help="by one of its KEYS")
    by_key.add_argument("topic")
    by_key.add_argument("key")
    by_key.add_argument("--max", type=int, default=32)
    by_key.set_defaults(func=_run(message_by_key))

    consumer = what.add_parser("consumer", help="consumer groups").add_subparsers(dest="op", required=True)
    progress = consumer.add_parser("progress", help="committed offsets and lag per queue")
    progress.add_argument("group")
    progress.add_argument("-t", "--topic", default=None)
    progress.set_defaults(func=_run(consumer_progress))

    snd = what.add_parser("send", help="send a message")
    snd.add_argument("topic")
    snd.add_argument("body")
    snd.add_argument("--tags", default=None)
    snd.add_argument("--keys", default=None)
    snd.add_argument("--count", type=int, default=1)
    snd.add_argument("--group", default="txmq_admin_producer")
    snd.set_defaults(func=_run(send))

    tl = what.add_parser("tail", help="print messages as they arrive")
    tl.add_argument("topic")
    tl.add_argument("-e", "--expression", default="*", help="tag expression, e.g. 'TagA || TagB'")
    tl.add_argument("--from-beginning", action="store_true")
    tl.add_argument("--count", type=int, default=None, help="stop after this many messages")
    tl.add_argument("--group", default="txmq_admin_tail")
    tl.set_defaults(func=_run(tail))

    # Feature areas add their own subcommands from their own modules (transactions, consumer control, ACL).
    groups = {"topic": topic, "message": message, "consumer": consumer}
    for name in ADMIN_EXTENSIONS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue
            raise
        module.add_parser(what, groups, _run)


# Modules with ``add_parser(admin_subparsers, groups, run)``; a missing one is simply not offered.
ADMIN_EXTENSIONS = (
    "txmq.cli.admin_tx",
    "txmq.cli.admin_consumer",
    "txmq.cli.admin_acl",
    "txmq.cli.admin_replica",
    "txmq.cli.admin_store",
)
