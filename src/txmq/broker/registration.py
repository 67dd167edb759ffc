"""Registering the broker and its topics with the name servers: every ``registerNameServerPeriod``, soon after a
topic change, on demand, and unregistering at shutdown."""

from __future__ import annotations

import asyncio
import logging
import zlib

import orjson

from txmq.broker.config import BrokerConfig
from txmq.broker.topics import TopicConfigManager
from txmq.clock import Clock
from txmq.errors import RemotingError
from txmq.net import Connection, connect
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.frame import RemotingCommand
from txmq.protocol.headers import RegisterBrokerRequestHeader, UnregisterBrokerRequestHeader

log = logging.getLogger("txmq.broker")

SLAVE_WITHOUT_MASTER_PERIOD = 2.0  # s between registrations of a slave that knows no master yet


class NameServerRegistration:
    def __init__(self, *, config: BrokerConfig, clock: Clock, topics: TopicConfigManager) -> None:
        self.config = config
        self.clock = clock
        self.topics = topics
        # (namespace, key, value) written to the name servers' KV config with every registration: how the other
        # brokers learn what the 4.x registration cannot carry (a broker's gRPC endpoint).
        self.kv: list[tuple[str, str, str]] = []
        self._conns: dict[str, Connection] = {}
        self._task: asyncio.Task[None] | None = None
        self._soon: asyncio.TimerHandle | None = None
        self._lock = asyncio.Lock()
        # What the name server told a slave about its master (RocketMQ's RegisterBrokerResult): the master's
        # address and its HA address; "" until known, and again when the master is gone.
        self.master_addr = ""
        self.master_ha_addr = ""
        self.ha_port = config.listen_port + 1  # the HA port actually listened on, set by the broker once bound

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="broker-register")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def topic_changed(self) -> None:
        """Re-register soon (debounced), so that new topics get routes quickly."""
        if self._soon is None and self._task is not None:
            loop = asyncio.get_running_loop()
            self._soon = loop.call_soon(lambda: asyncio.ensure_future(self._register_once()))

    async def register_now(self, timeout: float = 3.0) -> None:
        """Register with the name servers and wait until they answered (at most ``timeout`` s; past it the
        registration goes on in the background)."""
        if self._task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._register_once()), timeout)
        except TimeoutError:
            log.warning("registering with the name servers took over %.1fs; answering without waiting", timeout)

    async def _loop(self) -> None:
        while True:
            await self._register_once()
            period = self.config.register_name_server_period / 1000
            if self.config.is_slave and not self.master_addr:
                period = min(period, SLAVE_WITHOUT_MASTER_PERIOD)  # learn a (new) master soon
            await self.clock.sleep(period)

    def _register_request(self) -> RemotingCommand:
        config = self.config
        body = orjson.dumps({"topicConfigSerializeWrapper": self.topics.wrapper(), "filterServerList": []})
        header = RegisterBrokerRequestHeader(
            brokerName=config.broker_name,
            brokerAddr=config.broker_addr,
            clusterName=config.broker_cluster_name,
            haServerAddr=f"{config.advertised_ip}:{self.ha_port}",
            brokerId=config.broker_id,
            compressed=False,
            bodyCrc32=zlib.crc32(body) & 0x7FFFFFFF,
        )
        return RemotingCommand.request(RequestCode.REGISTER_BROKER, header.to_ext(), body)

    async def _namesrv(self, addr: str) -> Connection:
        conn = self._conns.get(addr)
        if conn is None or conn.closed:
            host, _, port = addr.rpartition(":")
            conn = await connect(host, int(port), clock=self.clock)
            self._conns[addr] = conn
        return conn

    async def _register_once(self) -> None:
        self._soon = None
        async with self._lock:
            for addr in self.config.namesrv_addrs:
                try:
                    conn = await self._namesrv(addr)
                    resp = await conn.request(self._register_request(), timeout=6.0)
                    if resp.code != ResponseCode.SUCCESS:
                        log.warning("name server %s refused the registration: %s", addr, resp.remark)
                    elif self.config.is_slave:
                        self._learn_master(
                            resp.ext_fields.get("masterAddr") or "", resp.ext_fields.get("haServerAddr") or ""
                        )
                    for namespace, key, value in self.kv:
                        ext = {"namespace": namespace, "key": key, "value": value}
                        await conn.request(RemotingCommand.request(RequestCode.PUT_KV_CONFIG, ext), timeout=6.0)
                except (RemotingError, OSError) as exc:
                    log.warning("registering with name server %s failed: %s", addr, exc)

    def _learn_master(self, master_addr: str, ha_addr: str) -> None:
        if (master_addr, ha_addr) != (self.master_addr, self.master_ha_addr):
            if master_addr:
                log.info("master of %s is %s (HA %s)", self.config.broker_name, master_addr, ha_addr)
            else:
                log.warning("the name server knows no master of %s", self.config.broker_name)
            self.master_addr, self.master_ha_addr = master_addr, ha_addr

    async def ask(self, cmd: RemotingCommand, timeout: float = 3.0) -> RemotingCommand | None:
        """Send ``cmd`` to the first name server that answers; None when none does."""
        for addr in self.config.namesrv_addrs:
            try:
                conn = await self._namesrv(addr)
                return await conn.request(cmd, timeout=timeout)
            except (RemotingError, OSError) as exc:
                log.info("asking name server %s failed: %s", addr, exc)
        return None

    async def unregister(self) -> None:
        """Unregister from every name server (at shutdown)."""
        config = self.config
        header = UnregisterBrokerRequestHeader(
            brokerName=config.broker_name,
            brokerAddr=config.broker_addr,
            clusterName=config.broker_cluster_name,
            brokerId=config.broker_id,
        )
        for addr in config.namesrv_addrs:
            try:
                conn = await self._namesrv(addr)
                await conn.request(RemotingCommand.request(RequestCode.UNREGISTER_BROKER, header.to_ext()), timeout=3.0)
            except (RemotingError, OSError) as exc:
                log.info("unregistering from name server %s failed: %s", addr, exc)

    def close_connections(self) -> None:
        for conn in self._conns.values():
            conn.close("broker shutting down")
