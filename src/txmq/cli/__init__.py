"""The ``txmq`` command: ``dev``, ``namesrv``, ``broker`` and ``admin``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib
import logging
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from txmq.errors import TxmqError


def _setup_logging(level: str, log_file: str | None = None) -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_file))
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        handlers=handlers,
    )


async def _serve_until_signalled(start: Callable[[], Awaitable[Any]], stop: Callable[[], Awaitable[None]]) -> None:
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, done.set)
    from txmq import _hotpath

    hot_path = _hotpath.STATE
    # A build that cannot be used (a compiled module's source edited since) is worth a warning: it runs slower.
    level = logging.WARNING if hot_path.modules and not hot_path.compiled and not _hotpath.forced() else logging.INFO
    logging.getLogger("txmq").log(level, "hot path %s", hot_path.describe())
    await start()
    _tune_gc_for_serving()
    try:
        await done.wait()
    finally:
        await stop()


# A server allocates a few dozen short-lived objects per message and holds a large long-lived state (topics,
# queues, clients, transaction history). The default young-generation threshold (700) runs a collection every few
# messages and took about a tenth of the broker's CPU under load; nearly all of those objects die by reference
# counting anyway, so collect less often, and keep what exists once serving starts out of every collection.
SERVER_GC_THRESHOLDS = (50_000, 20, 10)


def _tune_gc_for_serving() -> None:
    gc.collect()
    gc.freeze()
    gc.set_threshold(*SERVER_GC_THRESHOLDS)


def _run(coro_factory: Callable[[], Awaitable[None]]) -> int:
    from txmq.net import install_event_loop

    install_event_loop()
    try:
        asyncio.run(coro_factory())  # type: ignore[arg-type]
    except TxmqError as exc:
        print(f"txmq: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"txmq: {exc}", file=sys.stderr)
        return 2
    return 0


# -- namesrv ---------------------------------------------------------------------------------------------------------


def cmd_namesrv(args: argparse.Namespace) -> int:
    from txmq.namesrv.server import NameServer

    async def main() -> None:
        ns = NameServer(kv_path=args.kv_file)

        async def start() -> None:
            port = await ns.start(args.host, args.port)
            print(f"txmq name server listening on {args.host}:{port}", flush=True)

        await _serve_until_signalled(start, ns.close)

    return _run(main)


# -- broker ----------------------------------------------------------------------------------------------------------


def _broker_config(args: argparse.Namespace) -> Any:
    from txmq.broker.config import BrokerConfig

    config = BrokerConfig.from_file(args.config) if getattr(args, "config", None) else BrokerConfig()
    for key, value in vars(args).items():
        if key.startswith("set_") and value is not None:
            setattr(config, key[4:], value)
    return config


def cmd_broker(args: argparse.Namespace) -> int:
    from txmq.broker.broker import Broker

    async def main() -> None:
        broker = Broker(_broker_config(args))

        async def start() -> None:
            await broker.start(args.host)
            print(f"txmq broker {broker.config.broker_name} listening on {broker.config.broker_addr}", flush=True)

        await _serve_until_signalled(start, broker.close)

    return _run(main)


# -- dev -------------------------------------------------------------------------------------------------------------


async def _wait_in_sync(ha_master: Any, count: int, timeout: float = 15.0) -> None:
    """Before saying it runs, let the slaves connect: a SYNC_MASTER's first sends would find none in sync."""
    deadline = asyncio.get_running_loop().time() + timeout
    while sum(s["state"] == "streaming" for s in ha_master.slaves()) < count:
        if asyncio.get_running_loop().time() > deadline:
            print("txmq dev: the slaves did not connect in time; see the log", file=sys.stderr)
            return
        await asyncio.sleep(0.05)


async def _wait_elected(broker: Any, count: int, timeout: float = 20.0) -> None:
    """Controller mode: the first replica started is elected; wait until its slaves are in its in-sync set."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        ha = broker.app.ha_master
        if ha is not None and len(ha.in_sync_replicas()) >= count:
            return
        if asyncio.get_running_loop().time() > deadline:
            print("txmq dev: no replica was elected with its slaves in sync in time; see the log", file=sys.stderr)
            return
        await asyncio.sleep(0.1)


def _sets_role(config_path: str | None) -> bool:
    if not config_path:
        return False
    from txmq.config import load_properties

    return "brokerRole" in load_properties(config_path)


def cmd_dev(args: argparse.Namespace) -> int:
    from txmq.broker.broker import Broker
    from txmq.broker.config import BrokerConfig
    from txmq.namesrv.server import NameServer

    data = Path(args.data_dir).resolve()

    async def main() -> None:
        ns = NameServer(kv_path=data / "namesrv" / "kv.json")
        broker: Broker | None = None
        slaves: list[Broker] = []
        etcd: Any = None

        async def start() -> None:
            nonlocal broker, etcd
            ns_port = await ns.start(args.host, args.namesrv_port)
            config = BrokerConfig.from_file(args.config) if args.config else BrokerConfig()
            config.store_path_root_dir = str(data / "store")
            config.listen_port = args.broker_port
            if args.grpc_port is not None:
                config.grpc_listen_port = args.grpc_port
            if args.metrics_port is not None:
                config.metrics_port = args.metrics_port
            if args.console_port is not None:
                config.console_port = args.console_port
            config.namesrv_addr = f"127.0.0.1:{ns_port}"
            config.broker_ip1 = config.broker_ip1 or "127.0.0.1"
            if args.flush:
                config.flush_disk_type = args.flush
            if args.segment_size:
                config.mapped_file_size_commit_log = args.segment_size
            elif config.mapped_file_size_commit_log == BrokerConfig().mapped_file_size_commit_log:
                # A development broker starts with a 128 MiB segment instead of reserving RocketMQ's 1 GiB.
                config.mapped_file_size_commit_log = DEV_SEGMENT_SIZE
            if args.replicas and config.broker_role == "ASYNC_MASTER" and not _sets_role(args.config):
                config.broker_role = "SYNC_MASTER"  # a replica is there to make acknowledged sends survive
            if args.controller and args.replicas:
                if args.controller == "etcd":
                    from txmq.broker.ha.etcd_process import EtcdServer

                    etcd = await asyncio.to_thread(EtcdServer(data / "etcd").start)
                    config.controller_addr = etcd.endpoint
                else:
                    config.controller_addr = args.controller
                config.enable_controller_mode = True
                config.broker_id = 1  # in controller mode every replica has its own id; the elected one serves as 0
            broker = Broker(config)
            await broker.start(args.host)
            for i in range(1, args.replicas + 1):
                slave_config = config.replace(
                    broker_role=broker.master_role if config.enable_controller_mode else "SLAVE",
                    broker_id=i + 1 if config.enable_controller_mode else i,
                    listen_port=args.broker_port + 10 * i,
                    store_path_root_dir=str(data / f"store-slave{i}"),
                    grpc_listen_port=0,
                    metrics_port=0,  # the master's /metrics port is taken; a slave serves none here
                    console_port=0,
                    ha_listen_port=-1,
                    ha_master_address=broker.app.ha_master.ha_addr if broker.app.ha_master else "",
                    extra=dict(config.extra),
                )
                slave = Broker(slave_config)
                await slave.start(args.host)
                slaves.append(slave)
            if slaves and broker.app.ha_master is not None:
                await _wait_in_sync(broker.app.ha_master, len(slaves))
            elif slaves and config.enable_controller_mode:
                await _wait_elected(broker, len(slaves))
            replica_lines = "".join(
                f"  slave {s.config.broker_id}       {s.config.broker_addr}   (SLAVE of {config.broker_name}, "
                f"store {s.config.store_path_root_dir})\n"
                for s in slaves
            ) + (
                f"  controller    etcd {config.controller_addr}   (automatic failover: the elected replica is "
                "the master)\n"
                if config.enable_controller_mode
                else ""
            )
            print(
                "txmq dev is running: a name server and a broker"
                + (f" with {len(slaves)} slave(s)" if slaves else "")
                + " in one process\n"
                f"  name server   127.0.0.1:{ns_port}   (namesrvAddr for clients)\n"
                f"  broker        {config.broker_addr}   ({config.broker_name}, {config.broker_cluster_name}, "
                f"{config.flush_disk_type}{', ' + config.broker_role if slaves else ''})\n"
                + replica_lines
                + (
                    f"  gRPC (5.x)    {config.advertised_ip}:{config.grpc_listen_port}   (endpoints of 5.x clients)\n"
                    if config.grpc_listen_port
                    else ""
                )
                + (
                    f"  metrics       http://{_shown_host(config.metrics_host or args.host)}:"
                    f"{config.metrics_port}/metrics\n"
                    if config.metrics_port
                    else ""
                )
                + (
                    f"  console       http://{config.console_host}:{config.console_port}/\n"
                    if config.console_port
                    else ""
                )
                + f"  data          {data}\n"
                "Try it:\n"
                f"  txmq admin --namesrv 127.0.0.1:{ns_port} send TopicTest 'hello'\n"
                f"  txmq admin --namesrv 127.0.0.1:{ns_port} tail TopicTest\n"
                "Stop with Ctrl-C.",
                flush=True,
            )

        async def stop() -> None:
            for slave in slaves:
                await slave.close()
            if broker is not None:
                await broker.close()
            await ns.close()
            if etcd is not None:
                etcd.stop()

        try:
            await _serve_until_signalled(start, stop)
        finally:
            if etcd is not None:
                etcd.stop()  # also when the start failed half-way

    return _run(main)


def _shown_host(host: str) -> str:
    return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host


# -- parser ------------------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="txmq", description="A RocketMQ-compatible broker centred on transactions.")
    parser.add_argument(
        "--log-level",
        default=None,
        help="DEBUG, INFO, WARNING or ERROR (default INFO for servers, WARNING for admin, demo and spark commands)",
    )
    parser.add_argument("--log-file", default=None, help="also write the log to this file")
    sub = parser.add_subparsers(dest="command", required=True)

    dev = sub.add_parser("dev", help="a name server and a broker in one process, data in ./txmq-data")
    dev.add_argument("--data-dir", default="txmq-data")
    dev.add_argument("--host", default="0.0.0.0")
    dev.add_argument("--namesrv-port", type=int, default=9876)
    dev.add_argument("--broker-port", type=int, default=10911)
    dev.add_argument(
        "--grpc-port", type=int, default=None, help="the RocketMQ 5 gRPC door's port (default 8081; 0 turns it off)"
    )
    dev.add_argument(
        "--metrics-port", type=int, default=None, help="Prometheus /metrics port (default 5557; 0 turns it off)"
    )
    dev.add_argument("--console-port", type=int, default=None, help="the web console's port (default 0: off)")
    dev.add_argument("-c", "--config", default=None, help="a broker.conf whose settings apply to the broker")
    dev.add_argument("--flush", choices=["SYNC_FLUSH", "ASYNC_FLUSH"], default=None)
    dev.add_argument(
        "--replicas",
        type=int,
        default=0,
        help="slaves of the broker in the same process (brokerId 1.., ports broker-port + 10*i); the master becomes "
        "SYNC_MASTER unless -c sets brokerRole",
    )
    dev.add_argument(
        "--controller",
        default=None,
        metavar="ETCD",
        help="with --replicas: automatic failover in controller mode; 'etcd' starts a private etcd (Debian's "
        "etcd-server) in the data directory, HOST:PORT uses a running one",
    )
    dev.add_argument(
        "--segment-size", type=int, default=None, help="commit-log segment size in bytes (default 128 MiB for dev)"
    )
    dev.set_defaults(func=cmd_dev)

    ns = sub.add_parser("namesrv", help="run a name server")
    ns.add_argument("--host", default="0.0.0.0")
    ns.add_argument("-p", "--port", type=int, default=9876)
    ns.add_argument("--kv-file", default=None, help="where KV config is kept (default: memory only)")
    ns.set_defaults(func=cmd_namesrv)

    br = sub.add_parser("broker", help="run a broker from a RocketMQ-style broker.conf")
    br.add_argument("-c", "--config", default=None, help="broker.conf (key=value, RocketMQ's key names)")
    br.add_argument("--host", default="0.0.0.0")
    br.add_argument("-n", "--namesrv", dest="set_namesrv_addr", default=None, help="overrides namesrvAddr")
    br.add_argument("-p", "--port", dest="set_listen_port", type=int, default=None, help="overrides listenPort")
    br.add_argument("--store", dest="set_store_path_root_dir", default=None, help="overrides storePathRootDir")
    br.add_argument(
        "--grpc-port", dest="set_grpc_listen_port", type=int, default=None, help="overrides grpcListenPort (0: off)"
    )
    br.add_argument(
        "--metrics-port", dest="set_metrics_port", type=int, default=None, help="overrides metricsPort (0: off)"
    )
    br.add_argument(
        "--console-port", dest="set_console_port", type=int, default=None, help="overrides consolePort (0: off)"
    )
    br.set_defaults(func=cmd_broker)

    from txmq.cli.admin import add_admin_parser

    add_admin_parser(sub)
    # Commands that live in their own modules (``add_parser(subparsers)``); a missing one is not offered.
    for name in COMMAND_EXTENSIONS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue
            raise
        module.add_parser(sub)
    return parser


COMMAND_EXTENSIONS = ("txmq.cli.demo", "txmq.cli.spark", "txmq.cli.console", "txmq.cli.chaos")
DEV_SEGMENT_SIZE = 128 * 1024 * 1024
# Long-running processes log their life at INFO; one-shot commands keep the terminal for their answer.
SERVER_COMMANDS = ("dev", "namesrv", "broker", "console")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = args.log_level or ("INFO" if args.command in SERVER_COMMANDS else "WARNING")
    _setup_logging(level, args.log_file)
    try:
        return int(args.func(args) or 0)
    except TxmqError as exc:
        print(f"txmq: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
