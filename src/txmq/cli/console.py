"""``txmq console``: the web console (txmq.console) on its own, against a cluster's name server."""

from __future__ import annotations

import argparse
from typing import Any


def cmd_console(args: argparse.Namespace) -> int:
    from txmq.cli import _run, _serve_until_signalled
    from txmq.console import Console, ConsoleSettings

    acl: Any = None
    if args.acl_file:
        from txmq.acl.manager import AclManager

        manager = AclManager(args.acl_file, args.acl_dir)
        manager.reload(force=True)

        def acl() -> Any:
            manager.reload()  # an edited plain_acl.yml counts from the next login (a broken one is refused whole)
            return manager.state

    if bool(args.access_key) != bool(args.secret_key):
        print("txmq: give --access-key and --secret-key together", flush=True)
        return 2
    if args.access_key and not args.acl_file:
        # The brokers check ACL: without a login anyone who reaches the console would act with this admin account.
        print("txmq: with --access-key, give --acl-file too, so people log in with their own accounts", flush=True)
        return 2

    async def main() -> None:
        console = Console(
            ConsoleSettings(
                namesrv=args.namesrv,
                host=args.host,
                port=args.port,
                access_key=args.access_key,
                secret_key=args.secret_key,
                acl=acl,
            )
        )

        async def start() -> None:
            await console.start()
            print(f"txmq console on http://{args.host}:{console.port}/ (name server {args.namesrv})", flush=True)

        await _serve_until_signalled(start, console.close)

    return _run(main)


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser("console", help="the web console against a cluster (topics, lag, transactions, DLQ)")
    p.add_argument("-n", "--namesrv", required=True, help="name server address(es), host:port;host:port")
    p.add_argument("--host", default="127.0.0.1", help="where to listen (default 127.0.0.1: this machine only)")
    p.add_argument("-p", "--port", type=int, default=8080, help="port (default 8080; 0 picks a free one)")
    p.add_argument("--acl-file", default=None, help="plain_acl.yml: people log in with its accounts (ACL on)")
    p.add_argument("--acl-dir", default=None, help="conf/acl: more account files, as the broker reads them")
    p.add_argument("--access-key", default=None, help="the console's own account toward brokers with aclEnable")
    p.add_argument("--secret-key", default=None)
    p.set_defaults(func=cmd_console)
