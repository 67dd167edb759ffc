"""``txmq admin tx``: list in-doubt transactions, show one transaction's history, resolve or resume it, counters."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from typing import Any

from txmq.cli.admin import _ts, _with_admin, table

_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|h|d)?\s*$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}

# Counter rows of ``txmq admin tx stats``, in display order, with their labels.
COUNTER_LABELS = (
    ("halfMessages", "Half messages"),
    ("commits", "Commits"),
    ("rollbacks", "Rollbacks"),
    ("checksSent", "Checks sent"),
    ("checkAnswers", "Check answers"),
    ("discards", "Discards"),
    ("resumes", "Resumes"),
    ("operatorResolutions", "Operator resolutions"),
    ("refusedDecisions", "Refused decisions"),
    ("inDoubt", "In doubt now"),
    ("discardedNow", "Discarded now"),
    ("resolutionSamples", "Resolution samples"),
    ("resolutionP50Ms", "Time to resolution p50"),
    ("resolutionP99Ms", "Time to resolution p99"),
    ("resolutionMaxMs", "Time to resolution max"),
)


def parse_duration_ms(text: str) -> int:
    """``500ms``, ``30s``, ``5m``, ``1h``, ``2d`` (a bare number is milliseconds) -> milliseconds."""
    match = _DURATION.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration such as 30s, 5m, 1h or 500ms")
    return int(match.group(1)) * _UNIT_MS[match.group(2) or "ms"]


def _duration(ms: Any) -> str:
    if ms is None:
        return "-"
    ms = int(ms)
    if ms < 1000:
        return f"{ms}ms"
    seconds = ms // 1000
    if seconds < 120:
        return f"{ms / 1000:.1f}s"
    if seconds < 7200:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _when(ms: Any) -> str:
    return _ts(int(ms)) if ms else "-"


async def tx_list(args: argparse.Namespace) -> int:
    async def run(admin: Any) -> int:
        rows = await admin.list_transactions(
            group=args.group, topic=args.topic, older_than_ms=args.older_than, limit=args.limit
        )
        if not rows:
            print("no in-doubt transaction")
            return 0
        print(
            table(
                ["Broker", "Transaction id", "State", "Group", "Topic", "Age", "Checks", "Next check", "Note"],
                [
                    (
                        r.get("brokerName"),
                        r.get("transactionId"),
                        r.get("state"),
                        r.get("producerGroup"),
                        r.get("topic"),
                        _duration(r.get("ageMs")),
                        r.get("checks"),
                        _when(r.get("nextCheckAt")),
                        "no producer online" if r.get("waitingForProducer") else "",
                    )
                    for r in rows
                ],
            )
        )
        print(f"\n{len(rows)} in-doubt transaction(s) shown")
        return 0

    return await _with_admin(args, run)


def describe_transaction(t: dict[str, Any]) -> str:
    """The text of ``txmq admin tx show``."""
    state = t.get("state")
    resolved = f"{_when(t.get('resolvedAt'))} by {t.get('resolvedBy') or '-'}" if t.get("resolvedAt") else "-"
    resumed = ", ".join(_when(ms) for ms in t.get("resumedAt") or []) or "-"
    rows = [
        ("Transaction id", t.get("transactionId")),
        ("UNIQ_KEY", t.get("uniqKey") or "-"),
        ("State", state),
        ("Producer group", t.get("producerGroup")),
        ("Real topic", f"{t.get('topic')} (queue {t.get('queueId')})"),
        ("Broker", f"{t.get('brokerName')} {t.get('brokerAddr')}"),
        ("Half msgId", f"{t.get('halfMsgId')} (commit-log offset {t.get('commitLogOffset')})"),
        ("Born", _when(t.get("bornTimestamp"))),
        ("Prepared", _when(t.get("preparedAt"))),
        ("Resolved", resolved),
        ("Delivered msgId", t.get("deliveredMsgId") or "-"),
        ("Discarded", f"{_when(t.get('discardedAt'))} as {t.get('discardedMsgId')}" if t.get("discardedAt") else "-"),
        ("Resumed", resumed),
    ]
    if state == "PREPARED":
        waiting = " (waiting: no producer of the group online)" if t.get("waitingForProducer") else ""
        rows.append(("Next check", f"{_when(t.get('nextCheckAt'))}{waiting}"))
        rows.append(("Checks toward max", t.get("checksTowardMax")))
    width = max(len(k) for k, _ in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    checks = t.get("checkLog") or []
    lines.append("")
    if checks:
        lines.append(
            table(
                ["#", "Check sent", "Answer", "Answered"],
                [
                    (i, _when(c.get("sentAt")), c.get("answer") or "(none yet)", _when(c.get("answeredAt")))
                    for i, c in enumerate(checks, 1)
                ],
            )
        )
    elif t.get("historyComplete", True):
        lines.append("No check was sent.")
    if not t.get("historyComplete", True):
        lines.append("Check history no longer kept for this transaction (older than the broker's history window).")
    return "\n".join(lines)


async def tx_show(args: argparse.Namespace) -> int:
    async def run(admin: Any) -> int:
        print(describe_transaction(await admin.transaction(args.id)))
        return 0

    return await _with_admin(args, run)


async def tx_resolve(args: argparse.Namespace) -> int:
    async def run(admin: Any) -> int:
        t = await admin.resolve_transaction(args.id, args.decision)
        done = {"COMMITTED": "committed", "ROLLED_BACK": "rolled back"}.get(str(t.get("state")), t.get("state"))
        line = f"transaction {t.get('transactionId')} {done} by operator on broker {t.get('brokerName')}"
        if t.get("deliveredMsgId"):
            line += f"; delivered as {t['deliveredMsgId']}"
        print(line)
        return 0

    return await _with_admin(args, run)


async def tx_resume(args: argparse.Namespace) -> int:
    async def run(admin: Any) -> int:
        t = await admin.resume_transaction(args.id)
        print(
            f"transaction {t.get('transactionId')} resumed on broker {t.get('brokerName')}: {t.get('state')}, "
            f"next check at {_when(t.get('nextCheckAt'))}"
        )
        return 0

    return await _with_admin(args, run)


async def tx_stats(args: argparse.Namespace) -> int:
    async def run(admin: Any) -> int:
        by_broker = await admin.transaction_counters()
        addrs = sorted(by_broker)
        rows = []
        for key, label in COUNTER_LABELS:
            values = [by_broker[a].get(key, "-") for a in addrs]
            if key.startswith("resolution") and key.endswith("Ms"):
                values = [_duration(v) if v != "-" else v for v in values]
            rows.append((label, *values))
        print(table(["Counter", *addrs], rows))
        return 0

    return await _with_admin(args, run)


def add_parser(admin_subparsers: Any, groups: dict[str, Any], run: Callable[..., Any]) -> None:
    tx = admin_subparsers.add_parser(
        "tx", help="transactions: list in-doubt ones, show a history, resolve or resume by hand, counters"
    ).add_subparsers(dest="op", required=True)

    lst = tx.add_parser("list", help="in-doubt transactions (PREPARED and DISCARDED), oldest first")
    lst.add_argument("-g", "--group", default=None, help="producer group")
    lst.add_argument("-t", "--topic", default=None, help="real topic")
    lst.add_argument(
        "--older-than", type=parse_duration_ms, default=None, metavar="AGE", help="e.g. 30s, 5m, 1h (bare number: ms)"
    )
    lst.add_argument("--limit", type=int, default=100)
    lst.set_defaults(func=run(tx_list))

    show = tx.add_parser("show", help="one transaction's history: state, times, every check and its answer")
    show.add_argument("id", help="transaction id, UNIQ_KEY, or msgId (half, delivered or discarded message)")
    show.set_defaults(func=run(tx_show))

    resolve = tx.add_parser("resolve", help="commit or roll back an in-doubt transaction by hand")
    resolve.add_argument("id")
    resolve.add_argument("decision", choices=["commit", "rollback"])
    resolve.set_defaults(func=run(tx_resolve))

    resume = tx.add_parser("resume", help="put a DISCARDED transaction back under checks")
    resume.add_argument("id")
    resume.set_defaults(func=run(tx_resume))

    tx.add_parser("stats", help="transaction counters of every broker").set_defaults(func=run(tx_stats))
