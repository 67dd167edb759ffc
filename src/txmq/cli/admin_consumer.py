"""``txmq admin consumer reset-offset`` and ``txmq admin dlq list|resend``: consumer offsets and dead letters."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Callable
from typing import Any

from txmq.cli.admin import _body_text, _ts, _with_admin, table
from txmq.errors import MQClientError


def parse_reset_target(text: str) -> str:
    """``earliest``, ``latest``, epoch milliseconds, ISO 8601 (naive = local time) or mqadmin's
    ``yyyy-MM-dd#HH:mm:ss:SSS``; returns what the broker takes (``earliest``/``latest``/ms)."""
    value = text.strip()
    if value.lower() in ("earliest", "latest"):
        return value.lower()
    if value.isdigit():
        return value
    try:
        if "#" in value:
            when = dt.datetime.strptime(value, "%Y-%m-%d#%H:%M:%S:%f")
        else:
            when = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not earliest, latest, epoch ms, ISO 8601 or yyyy-MM-dd#HH:mm:ss:SSS"
        ) from None
    return str(int(when.timestamp() * 1000))


async def reset_offset(args: argparse.Namespace) -> int:
    async def run(admin: Any) -> int:
        rows = await admin.reset_offset(args.group, args.topic, args.to)
        if not rows:
            print(f"no broker serves {args.topic}", file=sys.stderr)
            return 1
        print(
            table(
                ["Topic", "Broker", "Queue", "New offset"],
                [(r["topic"], r["brokerName"], r["queueId"], r["offset"]) for r in rows],
            )
        )
        told = sum({r["brokerName"]: int(r.get("notifiedConsumers", 0)) for r in rows}.values())
        print(f"\n{args.group} reset on {args.topic}; {told} online consumer connection(s) told to restart there")
        return 0

    return await _with_admin(args, run)


async def dlq_list(args: argparse.Namespace) -> int:
    async def run(admin: Any) -> int:
        rows = await admin.dead_letters(args.group, args.max)
        if not rows:
            print(f"%DLQ%{args.group} is empty")
            return 0
        print(
            table(
                ["Msg id", "Origin topic", "Origin msg id", "Reconsumed", "Dead since", "Resent", "Reason"],
                [
                    (
                        r["msgId"],
                        r["originTopic"],
                        r["originMsgId"] or "-",
                        r["reconsumeTimes"],
                        _ts(int(r["storeTimestamp"])),
                        "yes" if r.get("resent") else "no",
                        "; ".join(x for x in (r.get("reason"), r.get("lastFailure")) if x) or "-",
                    )
                    for r in rows
                ],
            )
        )
        print(f"\n{len(rows)} dead letter(s), {sum(1 for r in rows if r.get('resent'))} already resent")
        return 0

    return await _with_admin(args, run)


async def dlq_resend(args: argparse.Namespace) -> int:
    async def run(admin: Any) -> int:
        if not args.all and not args.id:
            raise MQClientError("give --id MSGID (repeatable) or --all")
        report = await admin.resend_dead_letters(args.group, args.id, all_messages=args.all)
        for key, label in (
            ("resent", "resent"),
            ("alreadyResent", "already resent earlier (not sent again)"),
            ("notFound", "not in the DLQ"),
            ("failed", "failed"),
        ):
            for item in report.get(key) or []:
                print(f"{label}: {_body_text(str(item).encode())}")
        print(f"\n{len(report['resent'])} message(s) put back on %RETRY%{args.group}, for that group only")
        return 1 if report["failed"] or report["notFound"] else 0

    return await _with_admin(args, run)


def add_parser(what: Any, groups: dict[str, Any], run: Callable[..., Any]) -> None:
    consumer = groups["consumer"]
    reset = consumer.add_parser(
        "reset-offset", help="move a group's offsets on a topic; running consumers restart from there"
    )
    reset.add_argument("group")
    reset.add_argument("topic")
    reset.add_argument(
        "--to",
        required=True,
        type=parse_reset_target,
        help="earliest | latest | epoch ms | ISO 8601 time | yyyy-MM-dd#HH:mm:ss:SSS (first message at or after it)",
    )
    reset.set_defaults(func=run(reset_offset))

    dlq = what.add_parser("dlq", help="dead letters of a consumer group").add_subparsers(dest="op", required=True)
    lst = dlq.add_parser("list", help="messages in %%DLQ%%GROUP with their origin and reason")
    lst.add_argument("group")
    lst.add_argument("--max", type=int, default=1000)
    lst.set_defaults(func=run(dlq_list))
    resend = dlq.add_parser("resend", help="put dead letters back on %%RETRY%%<group> (that group only)")
    resend.add_argument("group")
    resend.add_argument("--id", action="append", default=[], help="msgId (UNIQ_KEY), offsetMsgId or origin msg id")
    resend.add_argument("--all", action="store_true", help="every dead letter not resent yet")
    resend.set_defaults(func=run(dlq_resend))
