"""Options shared by every client type (name servers, identity, credentials, timers), with RocketMQ's defaults."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from txmq.clock import SYSTEM_CLOCK, Clock
from txmq.errors import MQClientError
from txmq.protocol.frame import RemotingCommand

Signer = Callable[[RemotingCommand, str, str], None]
"""``signer(cmd, access_key, secret_key)`` adds ACL fields (AccessKey, Signature) to ``cmd.ext_fields`` in place."""

# One default instance name per process, so producers and consumers created with default options share one
# ClientInstance (connections, heartbeats), as RocketMQ clients in one JVM do.
_PROCESS_INSTANCE_NAME = f"{os.getpid()}#{time.monotonic_ns()}"


def parse_namesrv_addrs(value: str | Sequence[str]) -> tuple[str, ...]:
    """``"host:port;host:port"`` (RocketMQ's form; commas also work) or a list, checked for a port each."""
    items = value.replace(",", ";").split(";") if isinstance(value, str) else list(value)
    addrs = tuple(a.strip() for a in items if a and a.strip())
    if not addrs:
        raise MQClientError("no name server address given (namesrv_addr='host:port[;host:port]')")
    for addr in addrs:
        host, sep, port = addr.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise MQClientError(f"name server address {addr!r} is not host:port")
    return addrs


def split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


def local_ip(towards: str | None = None) -> str:
    """The local IP the OS would use to reach ``towards`` (host:port); falls back to the host name's address."""
    if towards:
        host, port = split_addr(towards)
        try:
            # A UDP connect sends nothing; it only asks the kernel for the route's source address.
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((host, port))
                return str(s.getsockname()[0])
        except OSError:
            pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


@dataclass(slots=True)
class ClientConfig:
    """What identifies a client process to the cluster and how often it talks to it.

    Clients with the same name servers, client id and access key share one ClientInstance; its timers, clock
    and signer come from the first of them.
    """

    namesrv_addrs: tuple[str, ...]
    instance_name: str = field(default_factory=lambda: _PROCESS_INSTANCE_NAME)
    client_ip: str | None = None
    access_key: str | None = None
    secret_key: str | None = None
    signer: Signer | None = None
    clock: Clock = SYSTEM_CLOCK
    poll_name_server_interval: float = 30.0
    heartbeat_interval: float = 30.0
    persist_consumer_offset_interval: float = 5.0
    rebalance_interval: float = 20.0
    request_timeout: float = 3.0
    instance_name_set: bool = False  # True when the caller chose instance_name (used for local offset files)

    @classmethod
    def build(
        cls,
        namesrv_addr: str | Sequence[str],
        *,
        instance_name: str | None = None,
        client_ip: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        signer: Signer | None = None,
        clock: Clock | None = None,
        poll_name_server_interval: float = 30.0,
        heartbeat_interval: float = 30.0,
        persist_consumer_offset_interval: float = 5.0,
        rebalance_interval: float = 20.0,
        request_timeout: float = 3.0,
    ) -> ClientConfig:
        if (access_key is None) != (secret_key is None):
            raise MQClientError("access_key and secret_key must be given together")
        return cls(
            namesrv_addrs=parse_namesrv_addrs(namesrv_addr),
            instance_name=instance_name or _PROCESS_INSTANCE_NAME,
            client_ip=client_ip,
            access_key=access_key,
            secret_key=secret_key,
            signer=signer,
            clock=clock or SYSTEM_CLOCK,
            poll_name_server_interval=poll_name_server_interval,
            heartbeat_interval=heartbeat_interval,
            persist_consumer_offset_interval=persist_consumer_offset_interval,
            rebalance_interval=rebalance_interval,
            request_timeout=request_timeout,
            instance_name_set=instance_name is not None,
        )

    def resolved_ip(self) -> str:
        if self.client_ip is None:
            self.client_ip = local_ip(self.namesrv_addrs[0])
        return self.client_ip

    @property
    def client_id(self) -> str:
        """``ip@instanceName``, Java's form (the default instance name is ``pid#nanos``)."""
        return f"{self.resolved_ip()}@{self.instance_name}"

    @property
    def has_credentials(self) -> bool:
        return bool(self.access_key) and bool(self.secret_key)
