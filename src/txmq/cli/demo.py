"""``txmq demo ...``: runnable demonstrations (``orders``: the transactional order service)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path


def cmd_demo_orders(args: argparse.Namespace) -> int:
    from txmq.cli import _run
    from txmq.demo import orders

    logging.getLogger("txmq").setLevel(logging.INFO if args.verbose else logging.WARNING)
    code = 0

    async def main() -> None:
        nonlocal code
        code = await orders.main(args.orders, args.namesrv, lambda line: print(line, flush=True), args.data_dir)

    status = _run(main)
    return status or code


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    demo = subparsers.add_parser("demo", help="runnable demonstrations")
    demos = demo.add_subparsers(dest="demo", required=True)
    orders = demos.add_parser(
        "orders",
        help="an order service (SQLite) publishing 'order created' with transactional messages, then a reconciliation",
    )
    orders.add_argument("--orders", type=int, default=30, help="how many orders to place (default 30)")
    orders.add_argument(
        "--namesrv", default=None, help="use this name server; by default an embedded name server and broker start"
    )
    orders.add_argument("--data-dir", type=Path, default=None, help="keep the databases (and broker data) here")
    orders.add_argument("-v", "--verbose", action="store_true", help="keep txmq's INFO log")
    orders.set_defaults(func=cmd_demo_orders)
