"""``txmq admin broker promote``: manual failover without a controller (a slave becomes the master)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from txmq.cli.admin import _with_admin


async def promote(args: argparse.Namespace) -> int:
    async def run(admin: Any) -> int:
        answer = await admin.promote_broker(args.broker, args.role, force=args.force)
        print(
            f"{args.broker} is now {answer.get('brokerRole')} (brokerId {answer.get('brokerId')}) at commit-log "
            f"offset {answer.get('maxOffset')}"
            + (f"; previous master {answer['previousMaster']}" if answer.get("previousMaster") else "")
        )
        return 0

    return await _with_admin(args, run)


def add_parser(what: Any, groups: dict[str, Any], run: Callable[..., Any]) -> None:
    broker = what.add_parser("broker", help="replicas: roles and failover").add_subparsers(dest="op", required=True)
    pro = broker.add_parser("promote", help="make a slave the master of its brokerName (stop the old master first)")
    pro.add_argument("broker", help="the slave's address, host:port")
    pro.add_argument("--role", choices=["ASYNC_MASTER", "SYNC_MASTER"], default="ASYNC_MASTER")
    pro.add_argument("--force", action="store_true", help="even while the name server still lists a master")
    pro.set_defaults(func=run(promote))
