"""The per-process client core (RocketMQ's MQClientInstance), shared by producers and consumers.

One :class:`ClientInstance` exists per (event loop, name servers, client id, access key). It owns the route cache,
the broker connections (and the requests brokers send back on them), heartbeats, and the timers that drive
rebalancing and offset persistence for the consumers registered with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import orjson

from txmq.acl.signer import sign_request
from txmq.client.api import MQClientAPI
from txmq.client.config import ClientConfig, split_addr
from txmq.client.message import DEFAULT_TOPIC
from txmq.client.route import MASTER_ID, TopicRoute
from txmq.errors import (
    ConnectError,
    ConnectionClosedError,
    MQClientError,
    NoRouteError,
    RemotingError,
)
from txmq.net import Connection, connect
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.frame import RemotingCommand

log = logging.getLogger("txmq.client")

INNER_PRODUCER_GROUP = "CLIENT_INNER_PRODUCER"

BrokerRequestHandler = Callable[
    [Connection, RemotingCommand], "RemotingCommand | Awaitable[RemotingCommand | None] | None"
]
"""Serves a request a broker sent to this client (e.g. CHECK_TRANSACTION_STATE). Same contract as txmq.net."""


class ProducerMember(Protocol):
    group: str

    def published_topics(self) -> set[str]: ...


class ConsumerMember(Protocol):
    group: str

    def consumer_data(self) -> dict[str, Any]: ...

    def subscribed_topics(self) -> set[str]: ...

    async def rebalance(self) -> None: ...

    async def persist_offsets(self) -> None: ...


class ClientInstance:
    """Connections, routes, heartbeats and timers for every client in one process that shares a client id.

    Get one with :func:`acquire_instance` (which starts it) and give it back with :meth:`release`.
    """

    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self.clock = config.clock
        self.client_id = config.client_id
        self.api = MQClientAPI(self)
        self._routes: dict[str, TopicRoute] = {}
        self._broker_addrs: dict[str, dict[int, str]] = {}
        self._conns: dict[str, Connection] = {}
        self._conn_locks: dict[str, asyncio.Lock] = {}
        self._namesrv_index = 0
        self._route_lock = asyncio.Lock()
        self._heartbeat_lock = asyncio.Lock()
        self.producers: dict[str, ProducerMember] = {}
        self.consumers: dict[str, ConsumerMember] = {}
        self._request_handlers: dict[int, BrokerRequestHandler] = {
            RequestCode.NOTIFY_CONSUMER_IDS_CHANGED: self._on_consumer_ids_changed,
        }
        self._tasks: list[asyncio.Task[None]] = []
        self._rebalance_wakeup = asyncio.Event()
        self._refs = 0
        self._key: tuple[Any, ...] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = False
        self._closed = False
        self._closing = False
        self._inner_producer: Any = None
        self.reply_waiters: Any = None  # txmq.client.request_reply.ReplyWaiters, made by the first request()
        self._side_tasks: set[asyncio.Future[Any]] = set()
        self._refreshing: set[str] = set()

    # -- lifecycle ----------------------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        self._tasks = [
            asyncio.create_task(
                self._every(self.config.poll_name_server_interval, self.refresh_routes), name="txmq-routes"
            ),
            asyncio.create_task(
                self._every(self.config.heartbeat_interval, self.send_heartbeat_to_all), name="txmq-heartbeat"
            ),
            asyncio.create_task(
                self._every(self.config.persist_consumer_offset_interval, self._persist_all_offsets),
                name="txmq-offsets",
            ),
            asyncio.create_task(self._rebalance_loop(), name="txmq-rebalance"),
        ]
        log.info("client instance %s started (name servers %s)", self.client_id, ";".join(self.config.namesrv_addrs))

    async def release(self) -> None:
        """Drop one reference; the last one shuts the instance down."""
        self._refs -= 1
        if self._refs <= 0:
            await self.shutdown()

    async def shutdown(self) -> None:
        if self._closed or self._closing:
            return
        self._closing = True
        if self._key is not None and _INSTANCES.get(self._key) is self:
            del _INSTANCES[self._key]  # new clients get a fresh instance from here on
        if self._inner_producer is not None:
            producer, self._inner_producer = self._inner_producer, None
            await producer.shutdown()  # while connections still work, so its UNREGISTER_CLIENT goes out
        self._closed = True
        tasks = [*self._tasks, *self._side_tasks]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for conn in list(self._conns.values()):
            conn.close("client shutting down")
        self._conns.clear()
        log.info("client instance %s shut down", self.client_id)

    @property
    def closed(self) -> bool:
        return self._closed or self._closing

    async def _every(self, interval: float, job: Callable[[], Awaitable[Any]]) -> None:
        while True:
            await self.clock.sleep(interval)
            try:
                await job()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("periodic job %s failed", getattr(job, "__name__", job))

    # -- members ------------------------------------------------------------------------------------------------

    def register_producer(self, producer: ProducerMember) -> None:
        if producer.group in self.producers and self.producers[producer.group] is not producer:
            raise MQClientError(
                f"the producer group {producer.group!r} is already registered by another producer of client "
                f"{self.client_id}; give one of them a different instance_name"
            )
        self.producers[producer.group] = producer

    def register_consumer(self, consumer: ConsumerMember) -> None:
        if consumer.group in self.consumers and self.consumers[consumer.group] is not consumer:
            raise MQClientError(
                f"the consumer group {consumer.group!r} is already registered by another consumer of client "
                f"{self.client_id}; give one of them a different instance_name"
            )
        self.consumers[consumer.group] = consumer

    async def unregister_producer(self, group: str) -> None:
        if self.producers.pop(group, None) is not None:
            await self._unregister_client(producer_group=group)

    async def unregister_consumer(self, group: str) -> None:
        if self.consumers.pop(group, None) is not None:
            await self._unregister_client(consumer_group=group)

    async def _unregister_client(self, *, producer_group: str | None = None, consumer_group: str | None = None) -> None:
        async def one(addr: str) -> None:
            try:
                await self.api.unregister_client(
                    addr, self.client_id, producer_group=producer_group, consumer_group=consumer_group
                )
            except (RemotingError, MQClientError) as exc:
                log.info("unregistering %s from %s failed: %s", producer_group or consumer_group, addr, exc)

        await asyncio.gather(*(one(a) for a in self._all_broker_addrs(masters_only=False)))

    def register_request_handler(self, code: int, handler: BrokerRequestHandler) -> None:
        """Serve requests that brokers send to this client with ``code`` (the hook for CHECK_TRANSACTION_STATE)."""
        self._request_handlers[int(code)] = handler

    async def inner_producer(self) -> Any:
        """The instance's own producer (group CLIENT_INNER_PRODUCER), used to re-send failed messages."""
        if self._inner_producer is None:
            from txmq.client.producer import Producer

            producer = Producer._for_instance(INNER_PRODUCER_GROUP, self)
            await producer.start()
            self._inner_producer = producer
        return self._inner_producer

    # -- remoting -----------------------------------------------------------------------------------------------

    def _sign(self, cmd: RemotingCommand) -> None:
        """The one place outgoing requests get their ACL fields: everything else in extFields is final by now."""
        if not self.config.has_credentials:
            return
        signer = self.config.signer or sign_request
        signer(cmd, self.config.access_key or "", self.config.secret_key or "")

    def sign(self, cmd: RemotingCommand) -> RemotingCommand:
        """``cmd`` ready to go out: language PYTHON and, with credentials, its ACL fields (the last change to it)."""
        cmd.language = "PYTHON"
        self._sign(cmd)
        return cmd

    async def connection(self, addr: str) -> Connection:
        """The pooled connection to ``addr`` (created on first use, re-created after it closed)."""
        if self._closed:
            raise MQClientError(f"client instance {self.client_id} is shut down")
        conn = self._conns.get(addr)
        if conn is not None and not conn.closed:
            return conn
        lock = self._conn_locks.setdefault(addr, asyncio.Lock())
        async with lock:
            conn = self._conns.get(addr)
            if conn is not None and not conn.closed:
                return conn
            host, port = split_addr(addr)
            conn = await connect(
                host, port, self._serve_broker_request, clock=self.clock, timeout=self.config.request_timeout
            )
            conn.add_close_callback(lambda c, a=addr: self._forget(a, c))
            self._conns[addr] = conn
            log.debug("connected to %s", addr)
            return conn

    def open_connection(self, addr: str) -> Connection | None:
        """The pooled connection to ``addr`` when it is open (None: ``await connection(addr)`` makes one). The send
        path asks this first, which spares it a coroutine per message."""
        conn = self._conns.get(addr)
        if conn is None or conn.closed or self._closed:
            return None
        return conn

    def _forget(self, addr: str, conn: Connection) -> None:
        if self._conns.get(addr) is conn:
            del self._conns[addr]

    async def invoke(self, addr: str, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        conn = await self.connection(addr)
        try:
            return await conn.request(self.sign(cmd), timeout)
        except ConnectionClosedError:
            self._forget(addr, conn)
            raise

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand) -> None:
        conn = await self.connection(addr)
        try:
            conn.send_oneway(self.sign(cmd))
        except ConnectionClosedError:
            self._forget(addr, conn)
            raise

    def send_oneway_on(self, conn: Connection, cmd: RemotingCommand) -> None:
        """Send a signed oneway request on ``conn``: the answer to a request a broker sent on that connection."""
        conn.send_oneway(self.sign(cmd))

    async def invoke_namesrv(self, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        """Ask the name servers in turn, starting with the last one that answered."""
        addrs = self.config.namesrv_addrs
        last: RemotingError | None = None
        for i in range(len(addrs)):
            index = (self._namesrv_index + i) % len(addrs)
            try:
                resp = await self.invoke(addrs[index], cmd, timeout)
            except (ConnectError, ConnectionClosedError) as exc:
                last = exc
                continue
            self._namesrv_index = index
            return resp
        assert last is not None
        raise last

    def _serve_broker_request(self, conn: Connection, cmd: RemotingCommand) -> Any:
        handler = self._request_handlers.get(cmd.code)
        if handler is None:
            return cmd.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f" request type {cmd.code} not supported")
        return handler(conn, cmd)

    def _on_consumer_ids_changed(self, conn: Connection, cmd: RemotingCommand) -> None:
        log.info(
            "broker %s:%d says the consumers of group %s changed; rebalancing",
            *conn.peer,
            cmd.ext_fields.get("consumerGroup"),
        )
        self.rebalance_now()

    # -- routes -------------------------------------------------------------------------------------------------

    def route(self, topic: str) -> TopicRoute | None:
        return self._routes.get(topic)

    async def update_route(self, topic: str) -> TopicRoute:
        """Fetch ``topic``'s route from the name server and cache it. Raises NoRouteError if there is none."""
        route = await self.api.get_topic_route(topic, self.config.request_timeout)
        self._store_route(topic, route)
        return route

    def _store_route(self, topic: str, route: TopicRoute) -> None:
        old = self._routes.get(topic)
        self._routes[topic] = route
        known = {a for addrs in self._broker_addrs.values() for a in addrs.values()}
        for b in route.broker_datas:
            self._broker_addrs[b.broker_name] = dict(b.broker_addrs)
        if old is None or old.to_json() != route.to_json():
            log.debug("route of %s is now %s", topic, route.to_json())
        if any(a not in known for b in route.broker_datas for a in b.broker_addrs.values()):
            # A broker we never heartbeated: announce ourselves now rather than at the next 30 s tick, so it knows
            # our producer groups (transaction checks) and consumer subscriptions straight away.
            self._background(self.send_heartbeat_to_all(), "heartbeat")

    def _background(self, coro: Awaitable[Any], name: str) -> None:
        if self._closed or not self._started:
            if asyncio.iscoroutine(coro):
                coro.close()
            return
        task = asyncio.ensure_future(coro)
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)
        task.add_done_callback(functools.partial(_log_failure, name))

    def refresh_route_soon(self, topic: str) -> None:
        """Re-read ``topic``'s route in the background (after a send or pull failed); one refresh at a time."""
        if topic in self._refreshing:
            return
        self._refreshing.add(topic)

        async def refresh() -> None:
            try:
                await self.update_route(topic)
            except (RemotingError, MQClientError) as exc:
                log.debug("refreshing the route of %s after an error failed: %s", topic, exc)
            finally:
                self._refreshing.discard(topic)

        self._background(refresh(), f"route refresh of {topic}")

    async def get_publish_route(self, topic: str, default_queue_nums: int, auto_create: bool = True) -> TopicRoute:
        """The route to send ``topic`` to; an unknown topic borrows TBW102's brokers so the broker creates it."""
        route = self._routes.get(topic)
        if route is not None:
            return route
        async with self._route_lock:
            route = self._routes.get(topic)
            if route is not None:
                return route
            try:
                return await self.update_route(topic)
            except NoRouteError:
                if not auto_create:
                    raise
            try:
                template = await self.api.get_topic_route(DEFAULT_TOPIC, self.config.request_timeout)
            except NoRouteError:
                raise NoRouteError(topic, "and no auto-create template route (TBW102) either") from None
            route = template.as_topic(topic, default_queue_nums)
            if not route.publish_queues():
                raise NoRouteError(topic, "the TBW102 template has no writable queues")
            # Cached like a real route; the periodic refresh replaces it once the broker has created the topic.
            self._store_route(topic, route)
            log.info("no route for %s yet; sending through the auto-create template's brokers", topic)
            return route

    def topics_in_use(self) -> set[str]:
        topics: set[str] = set()
        for p in self.producers.values():
            topics |= p.published_topics()
        for c in self.consumers.values():
            topics |= c.subscribed_topics()
        return topics

    async def refresh_routes(self) -> None:
        """Re-read the route of every topic in use (every 30 s); a failure keeps the old route."""
        for topic in sorted(self.topics_in_use()):
            try:
                await self.update_route(topic)
            except NoRouteError as exc:
                log.debug("%s", exc)
            except (RemotingError, MQClientError) as exc:
                log.warning("refreshing the route of %s failed: %s", topic, exc)
        self._clean_offline_brokers()

    def _clean_offline_brokers(self) -> None:
        live = {b.broker_name for route in self._routes.values() for b in route.broker_datas}
        for name in list(self._broker_addrs):
            if name not in live:
                del self._broker_addrs[name]

    def find_broker_addr(self, broker_name: str, *, master_only: bool = True) -> str | None:
        addrs = self._broker_addrs.get(broker_name)
        if not addrs:
            return None
        if MASTER_ID in addrs:
            return addrs[MASTER_ID]
        if master_only:
            return None
        return addrs[min(addrs)]

    async def find_broker_addr_refreshing(
        self, broker_name: str, topic: str, *, master_only: bool = True
    ) -> str | None:
        """Like :meth:`find_broker_addr`, refreshing ``topic``'s route once when the broker is unknown. Reads
        (pulls, consumer offsets) pass ``master_only=False``: RocketMQ's clients use a slave while the master is
        missing from the route (``findBrokerAddressInSubscribe``)."""
        addr = self.find_broker_addr(broker_name)
        if addr is None:
            with contextlib.suppress(RemotingError, MQClientError):
                await self.update_route(topic)
            addr = self.find_broker_addr(broker_name, master_only=master_only)
        return addr

    def _all_broker_addrs(self, *, masters_only: bool) -> list[str]:
        out = []
        for addrs in self._broker_addrs.values():
            for broker_id, addr in addrs.items():
                if masters_only and broker_id != MASTER_ID:
                    continue
                out.append(addr)
        return sorted(set(out))

    # -- heartbeat ----------------------------------------------------------------------------------------------

    def heartbeat_body(self) -> dict[str, Any]:
        """HEART_BEAT's JSON body as Java clients send it (enum names, not ordinals)."""
        producers = [{"groupName": g} for g in sorted(self.producers)]
        if self.consumers and INNER_PRODUCER_GROUP not in self.producers:
            producers.append({"groupName": INNER_PRODUCER_GROUP})
        return {
            "clientID": self.client_id,
            "producerDataSet": producers,
            "consumerDataSet": [self.consumers[g].consumer_data() for g in sorted(self.consumers)],
        }

    async def send_heartbeat_to_all(self) -> None:
        """Heartbeat every known broker; slaves only matter to consumers."""
        if not self.producers and not self.consumers:
            return
        async with self._heartbeat_lock:
            body = orjson.dumps(self.heartbeat_body())

            async def one(addr: str) -> None:
                try:
                    await self.api.heartbeat(addr, body, self.config.request_timeout)
                except (RemotingError, MQClientError) as exc:
                    log.warning("heartbeat to %s failed: %s", addr, exc)

            # In parallel: one unreachable broker must not delay everyone else's heartbeat by a connect timeout.
            await asyncio.gather(*(one(a) for a in self._all_broker_addrs(masters_only=not self.consumers)))

    # -- consumers' timers --------------------------------------------------------------------------------------

    def rebalance_now(self) -> None:
        self._rebalance_wakeup.set()

    async def _rebalance_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await _wait_event(self._rebalance_wakeup, self.config.rebalance_interval, self.clock)
            self._rebalance_wakeup.clear()
            await self.rebalance_all()

    async def rebalance_all(self) -> None:
        for consumer in list(self.consumers.values()):
            try:
                await consumer.rebalance()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("rebalancing consumer group %s failed", consumer.group)

    async def _persist_all_offsets(self) -> None:
        for consumer in list(self.consumers.values()):
            try:
                await consumer.persist_offsets()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("persisting the offsets of consumer group %s failed", consumer.group)


def _log_failure(name: str, task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("%s failed: %s", name, task.exception())


async def _wait_event(event: asyncio.Event, timeout: float, clock: Any) -> None:
    """``event.wait()`` bounded by ``timeout`` seconds of ``clock`` (so a FakeClock drives it in tests)."""
    if event.is_set():
        return
    waiter = asyncio.ensure_future(event.wait())
    sleeper = asyncio.ensure_future(clock.sleep(timeout))
    try:
        await asyncio.wait({waiter, sleeper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        sleeper.cancel()
    if not event.is_set():
        raise TimeoutError


# ---------------------------------------------------------------------------------------------------------------
# Sharing


_INSTANCES: dict[tuple[Any, ...], ClientInstance] = {}


async def acquire_instance(config: ClientConfig) -> ClientInstance:
    """The started instance for ``config``'s identity on the running loop, created on first use."""
    loop = asyncio.get_running_loop()
    key = (id(loop), config.namesrv_addrs, config.client_id, config.access_key)
    instance = _INSTANCES.get(key)
    # id() of a closed loop can be reused by the next one (pytest makes a loop per test): check the object too.
    if instance is None or instance.closed or instance._loop is not loop:
        instance = ClientInstance(config)
        instance._key = key
        instance._loop = loop
        _INSTANCES[key] = instance
    instance._refs += 1
    await instance.start()
    return instance
