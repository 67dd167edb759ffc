"""``txmq admin acl show|add|remove|whitelist``: ACL accounts and whitelists on every broker of a cluster.

Changes go to each target broker in turn (codes 50/51/53). The command reports every broker's outcome and exits
non-zero when any broker did not take the change, so a change that reached only some brokers never looks done.
``show`` compares what is in force on each broker and says when they disagree.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from txmq.errors import TxmqError


async def _targets(admin: Any, args: argparse.Namespace) -> list[str]:
    if args.broker:
        return [args.broker]
    addrs = await admin.master_broker_addrs(args.cluster)
    if not addrs:
        raise TxmqError("no master broker is registered with the name server")
    return addrs


async def _each_broker(args: argparse.Namespace, what: str, call: Callable[[Any, str], Awaitable[str]]) -> int:
    from txmq.cli.admin import _with_admin

    async def run(admin: Any) -> int:
        addrs = await _targets(admin, args)
        failed: list[str] = []
        for addr in addrs:
            try:
                remark = await call(admin, addr)
                print(f"{addr}: ok ({remark})" if remark else f"{addr}: ok")
            except TxmqError as exc:
                failed.append(addr)
                print(f"{addr}: FAILED: {exc}")
        if failed:
            print(
                f"txmq: {what} reached {len(addrs) - len(failed)} of {len(addrs)} broker(s); "
                f"not applied on {', '.join(failed)}. Fix the cause and run the command again.",
                file=sys.stderr,
            )
            return 1
        return 0

    return await _with_admin(args, run)


async def acl_add(args: argparse.Namespace) -> int:
    topic_perms = [] if args.clear_topic_perms else (args.topic_perm or None)
    group_perms = [] if args.clear_group_perms else (args.group_perm or None)

    def call(admin: Any, addr: str) -> Awaitable[str]:
        return admin.update_acl_account(
            addr,
            args.access_key_to_change,
            secret_key=args.secret,
            white_remote_address=args.white_remote_address,
            admin=args.admin,
            default_topic_perm=args.default_topic_perm,
            default_group_perm=args.default_group_perm,
            topic_perms=topic_perms,
            group_perms=group_perms,
        )

    return await _each_broker(args, f"the change to {args.access_key_to_change}", call)


async def acl_remove(args: argparse.Namespace) -> int:
    def call(admin: Any, addr: str) -> Awaitable[str]:
        return admin.delete_acl_account(addr, args.access_key_to_change)

    return await _each_broker(args, f"removing {args.access_key_to_change}", call)


async def acl_whitelist(args: argparse.Namespace) -> int:
    if not args.addresses and not args.clear:
        print("txmq: give addresses, or --clear to empty the global whitelist", file=sys.stderr)
        return 2

    def call(admin: Any, addr: str) -> Awaitable[str]:
        return admin.update_global_white_addrs(addr, [] if args.clear else args.addresses, args.file)

    return await _each_broker(args, "the global whitelist change", call)


def _fingerprint(info: dict[str, Any]) -> str:
    accounts = [{k: v for k, v in a.items() if k != "file"} for a in info.get("plainAccessConfigs") or []]
    data = {"accounts": accounts, "white": info.get("globalWhiteAddrs"), "strict": info.get("strictMode")}
    return hashlib.md5(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]


async def acl_show(args: argparse.Namespace) -> int:
    from txmq.cli.admin import _with_admin, table

    async def run(admin: Any) -> int:
        addrs = await _targets(admin, args)
        infos: dict[str, dict[str, Any]] = {}
        errors: dict[str, str] = {}
        for addr in addrs:
            try:
                infos[addr] = await admin.acl_info(addr)
            except TxmqError as exc:
                errors[addr] = str(exc)
        if args.json:
            print(json.dumps({"brokers": infos, "errors": errors}, indent=2, sort_keys=True))
            return 1 if errors else 0
        for addr, info in infos.items():
            print(
                f"broker {info.get('brokerName', '?')} ({addr}), cluster {info.get('clusterName', '?')}, "
                f"ACL in force {_fingerprint(info)}{', strict mode' if info.get('strictMode') else ''}"
            )
            for path, f in sorted((info.get("files") or {}).items()):
                status = "in force" if f.get("inForce") else f"REJECTED, last good version in force: {f.get('error')}"
                print(f"  file {path}  md5 {f.get('md5')}  {f.get('accounts', 0)} account(s)  {status}")
            white = info.get("globalWhiteAddrs") or []
            print(f"  global whitelist: {', '.join(white) if white else '(none)'}")
            rows = [
                (
                    a.get("accessKey"),
                    a.get("secretKey"),
                    "yes" if a.get("admin") else "no",
                    a.get("whiteRemoteAddress") or "-",
                    a.get("defaultTopicPerm") or "DENY",
                    a.get("defaultGroupPerm") or "DENY",
                    ",".join(a.get("topicPerms") or []) or "-",
                    ",".join(a.get("groupPerms") or []) or "-",
                )
                for a in info.get("plainAccessConfigs") or []
            ]
            headers = ["AccessKey", "Secret", "Admin", "Whitelist", "Topic dflt", "Group dflt", "Topics", "Groups"]
            print("\n".join("  " + line for line in table(headers, rows).splitlines()))
            print()
        for addr, error in errors.items():
            print(f"broker {addr}: cannot read its ACL: {error}")
        prints = {_fingerprint(i) for i in infos.values()}
        if len(prints) > 1:
            print("WARNING: the brokers do not have the same ACL in force (compare the fingerprints above)")
        elif len(infos) > 1:
            print(f"all {len(infos)} brokers have the same ACL in force")
        return 1 if errors or len(prints) > 1 else 0

    return await _with_admin(args, run)


def _targets_args(p: argparse.ArgumentParser) -> None:
    group = p.add_mutually_exclusive_group()
    group.add_argument("-b", "--broker", default=None, help="this broker address only")
    group.add_argument("-c", "--cluster", default=None, help="every master of this cluster (default: all masters)")


def add_parser(admin_subparsers: Any, _groups: dict[str, Any], run: Any) -> None:
    acl = admin_subparsers.add_parser(
        "acl", help="ACL accounts and whitelists (brokers with aclEnable=true; needs an admin account)"
    ).add_subparsers(dest="op", required=True)

    show = acl.add_parser("show", help="accounts, whitelist and file status in force on each broker")
    _targets_args(show)
    show.add_argument("--json", action="store_true", help="print the brokers' answers as JSON")
    show.set_defaults(func=run(acl_show))

    add = acl.add_parser("add", help="create or update an account (only the given fields change)")
    add.add_argument("access_key_to_change", metavar="ACCESS_KEY")
    add.add_argument("--secret", default=None, help="the account's secretKey (required for a new account)")
    add.add_argument("--white-remote-address", default=None, help="e.g. 192.168.1.*")
    add.add_argument("--admin", action=argparse.BooleanOptionalAction, default=None)
    add.add_argument("--default-topic-perm", default=None, choices=["DENY", "PUB", "SUB", "PUB|SUB"])
    add.add_argument("--default-group-perm", default=None, choices=["DENY", "PUB", "SUB", "PUB|SUB"])
    add.add_argument(
        "--topic-perm", action="append", metavar="TOPIC=PERM", help="repeatable; replaces the account's topic list"
    )
    add.add_argument(
        "--group-perm", action="append", metavar="GROUP=PERM", help="repeatable; replaces the account's group list"
    )
    add.add_argument("--clear-topic-perms", action="store_true", help="empty the account's topicPerms")
    add.add_argument("--clear-group-perms", action="store_true", help="empty the account's groupPerms")
    _targets_args(add)
    add.set_defaults(func=run(acl_add))

    remove = acl.add_parser("remove", help="delete an account")
    remove.add_argument("access_key_to_change", metavar="ACCESS_KEY")
    _targets_args(remove)
    remove.set_defaults(func=run(acl_remove))

    white = acl.add_parser("whitelist", help="replace the global whitelist (globalWhiteRemoteAddresses)")
    white.add_argument("addresses", nargs="*", help="patterns such as 10.0.0.1, 192.168.*.*, 10.1.1.{1,2}")
    white.add_argument("--clear", action="store_true", help="empty the global whitelist")
    white.add_argument("--file", default=None, help="which of the broker's ACL files to edit (default the main one)")
    _targets_args(white)
    white.set_defaults(func=run(acl_whitelist))
