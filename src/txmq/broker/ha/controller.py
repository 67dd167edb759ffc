"""Controller mode on etcd: the driver of :class:`txmq.ha.election.ReplicaController`.

It reads the brokerName's keys from etcd every ``haControllerPollMillis``, keeps this replica's lease alive while it
is the master, runs the election and in-sync-set transactions, and carries out the controller's effects on the
broker (:class:`ReplicaHost`). The client is ``aetcd`` (asyncio, maintained; etcd's v3 gRPC API).

Keys, under ``/txmq/ha/<brokerClusterName>/<brokerName>/``:

* ``leader``: the master (``{"addr", "haAddr", "epoch"}``), attached to its lease: it disappears when the master
  stops renewing;
* ``epoch``: the last epoch handed out; ``epochs/<epoch>``: ``{"epoch", "startOffset", "addr"}`` for each;
* ``syncStateSet``: ``{"members": [...], "epoch"}``, the replicas that may be elected; written by the master only
  (the transaction compares the leader record), reset to the new master alone at each election.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

import orjson

from txmq.broker.config import BrokerConfig
from txmq.clock import Clock
from txmq.ha.election import (
    BecomeMaster,
    Campaign,
    ClusterView,
    Effect,
    EpochEntry,
    Fence,
    Follow,
    LeaderRecord,
    PublishSyncSet,
    Rejoin,
    ReplicaController,
    Role,
)

log = logging.getLogger("txmq.broker.ha")


class ReplicaHost(Protocol):
    """What the controller drives: the broker process (:class:`txmq.broker.broker.Broker`)."""

    def log_end(self) -> int: ...
    def ha_addr(self) -> str: ...
    async def stop_replicating(self) -> None: ...
    async def follow(self, leader: LeaderRecord) -> None: ...
    async def become_master(self, epoch: int, start_offset: int) -> None: ...
    async def rejoin(self, leader: LeaderRecord | None, truncate_at: int | None, reason: str) -> None: ...
    def fence(self, reason: str) -> None: ...
    def unfence(self) -> None: ...
    def in_sync_replicas(self) -> frozenset[str]: ...
    def set_required(self, replicas: frozenset[str] | None) -> None: ...
    def set_lease_deadline(self, deadline: float | None) -> None: ...
    def save_epochs(self, entries: list[EpochEntry]) -> None: ...


def etcd_endpoints(config: BrokerConfig) -> list[tuple[str, int]]:
    out = []
    for part in config.controller_addr.replace(",", ";").split(";"):
        part = part.strip().removeprefix("http://")
        if part:
            host, _, port = part.rpartition(":")
            out.append((host or "127.0.0.1", int(port or 2379)))
    return out


def prefix_of(config: BrokerConfig) -> str:
    return f"/txmq/ha/{config.broker_cluster_name}/{config.broker_name}/"


def parse_view(prefix: str, kvs: list[Any]) -> tuple[ClusterView, dict[str, int]]:
    """A ClusterView from the prefix's key-values, and each key's mod revision (for the transactions' compares)."""
    leader: LeaderRecord | None = None
    epoch = 0
    history: list[EpochEntry] = []
    sync_set: frozenset[str] | None = None
    revs: dict[str, int] = {}
    for kv in kvs:
        key = kv.key.decode()[len(prefix) :]
        revs[key] = kv.mod_revision
        try:
            value = orjson.loads(kv.value)
        except orjson.JSONDecodeError:
            log.error("controller: etcd key %s%s holds no JSON (%r); ignored", prefix, key, kv.value[:80])
            continue
        if key == "leader":
            leader = LeaderRecord(str(value["addr"]), str(value["haAddr"]), int(value["epoch"]))
        elif key == "epoch":
            epoch = int(value)
        elif key.startswith("epochs/"):
            history.append(EpochEntry(int(value["epoch"]), int(value["startOffset"])))
        elif key == "syncStateSet":
            sync_set = frozenset(str(m) for m in value["members"])
    history.sort(key=lambda e: e.epoch)
    return ClusterView(leader, epoch, tuple(history), sync_set), revs


class EtcdController:
    """Runs the controller loop for one replica; ``await prepare()`` before the broker opens its store."""

    def __init__(self, *, config: BrokerConfig, clock: Clock, local_epochs: list[EpochEntry]) -> None:
        self.config = config
        self.clock = clock
        self.prefix = prefix_of(config)
        ttl = max(2, round(config.ha_controller_lease_millis / 1000))
        self.lease_ttl = ttl
        self.machine = ReplicaController(
            me=config.broker_addr, local_epochs=local_epochs, lease_ttl=ttl, fence_after=ttl * 2 / 3
        )
        self.poll = config.ha_controller_poll_millis / 1000
        self.host: ReplicaHost | None = None
        self.view: ClusterView | None = None
        self._revs: dict[str, int] = {}
        self._client: Any = None
        self._lease_id = 0
        self._tasks: list[asyncio.Task[Any]] = []
        self.last_error = ""
        self.failovers = 0

    # -- etcd

    async def _etcd(self) -> Any:
        if self._client is None:
            import aetcd

            endpoints = etcd_endpoints(self.config)
            if not endpoints:
                raise ValueError("enableControllerMode=true needs controllerAddr (etcd endpoints host:port;...)")
            host, port = endpoints[0]  # aetcd talks to one endpoint; etcd forwards to its leader
            self._client = aetcd.Client(host=host, port=port, timeout=2)
            await self._client.connect()
        return self._client

    async def read(self) -> ClusterView:
        client = await self._etcd()
        result = await client.get_prefix(self.prefix.encode())
        self.view, self._revs = parse_view(self.prefix, list(result))
        return self.view

    async def prepare(self, patience: float = 30.0) -> ClusterView:
        """Read etcd before the store opens (the broker truncates its log with what this says); etcd may still be
        starting, so keep trying for ``patience`` seconds."""
        deadline = self.clock.monotonic() + patience
        while True:
            try:
                return await self.read()
            except Exception as exc:
                if self.clock.monotonic() > deadline:
                    raise
                self._note(f"etcd {self.config.controller_addr} not reachable yet: {type(exc).__name__}: {exc}")
                await self._drop_client()
                await self.clock.sleep(0.5)

    async def _drop_client(self) -> None:
        if self._client is not None:
            try:
                await self._client.close()
            except Exception:
                pass
            self._client = None

    # -- the loop

    def start(self, host: ReplicaHost) -> None:
        self.host = host
        self._tasks = [asyncio.create_task(self._loop(), name="ha-controller")]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        self._tasks = []
        if self.machine.role is not Role.CLOSED:
            self.machine.close()
        if self._client is not None:
            try:
                if self._lease_id and self.machine.serving_as_master:
                    # A clean stop hands the role over at once instead of after the TTL.
                    await asyncio.wait_for(self._client.revoke_lease(self._lease_id), 2)
            except Exception:
                pass
            try:
                await self._client.close()
            except Exception:
                pass
            self._client = None

    def _note(self, message: str) -> None:
        if message != self.last_error:
            log.warning("controller: %s", message)
        self.last_error = message

    async def _loop(self) -> None:
        renew_every = self.lease_ttl / 4
        last_renew = -1e9
        while True:
            now = self.clock.monotonic()
            try:
                # A fenced master stops renewing: its record expires, and a new election (perhaps of itself) follows.
                if self.machine.role is Role.LEADING and now - last_renew >= renew_every:
                    last_renew = now
                    await self._renew()
                await self._apply(self.machine.tick(self.clock.monotonic()))
                view = await self.read()
                host = self.host
                assert host is not None
                me = self.config.broker_addr
                if (
                    self.machine.role is Role.LEADING
                    and view.leader is not None
                    and view.leader.addr == me
                    and view.sync_set is not None
                ):
                    host.set_required(view.sync_set - {me})
                in_sync = host.in_sync_replicas() if self.machine.serving_as_master else frozenset()
                effects = self.machine.observed(view, self.clock.monotonic(), log_end=host.log_end(), in_sync=in_sync)
                await self._apply(effects)
                self.last_error = ""
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # etcd unreachable: keep trying; a master fences itself on the TTL
                self._note(f"etcd {self.config.controller_addr}: {type(exc).__name__}: {exc}")
                await self._apply(self.machine.tick(self.clock.monotonic()))
                await self._drop_client()
            await self.clock.sleep(self.poll)

    async def _renew(self) -> None:
        sent = self.clock.monotonic()
        client = await self._etcd()
        reply = await client.refresh_lease(self._lease_id)
        if reply is None or reply.TTL <= 0:
            await self._apply(self.machine.lease_gone())
        else:
            await self._apply(self.machine.renewed(sent))
            if self.machine.role is Role.LEADING and self.host is not None:
                self.host.set_lease_deadline(self.machine.lease_valid_until)

    async def _apply(self, effects: list[Effect]) -> None:
        host = self.host
        assert host is not None
        for effect in effects:
            if isinstance(effect, Fence):
                log.error("controller: fenced: %s; acknowledging nothing", effect.reason)
                host.fence(effect.reason)
            elif isinstance(effect, Campaign):
                await self._campaign(effect.epoch)
            elif isinstance(effect, BecomeMaster):
                self.failovers += 1
                host.save_epochs(list(self.machine.local_epochs))
                await host.become_master(effect.epoch, effect.start_offset)
                host.set_required(frozenset())
                host.set_lease_deadline(self.machine.lease_valid_until)
                host.unfence()
            elif isinstance(effect, Follow):
                host.save_epochs(list(effect.history))
                await host.follow(effect.leader)
            elif isinstance(effect, Rejoin):
                log.warning("controller: rejoining as a slave (%s)", effect.reason)
                host.fence(effect.reason)
                while True:  # the broker is down until this works: keep trying
                    try:
                        await host.rejoin(effect.leader, effect.truncate_at, effect.reason)
                        break
                    except Exception:
                        log.exception("controller: restarting as a slave failed; retrying")
                        await self.clock.sleep(1.0)
            elif isinstance(effect, PublishSyncSet):
                await self._publish_sync_set(effect.members)

    async def _campaign(self, epoch: int) -> None:
        try:
            await self._run_campaign(epoch)
        except Exception as exc:
            # Unknown outcome (etcd unreachable, a timeout after the commit): count it lost. If it was in fact won,
            # the record names this replica under a lease nobody renews; it expires and a new election follows.
            self._note(f"the election for epoch {epoch} failed: {type(exc).__name__}: {exc}")
            if self.machine.role is Role.CAMPAIGNING:
                await self._apply(self.machine.lost())
            await self._drop_client()

    async def _run_campaign(self, epoch: int) -> None:
        host = self.host
        assert host is not None and self.view is not None
        import aetcd  # noqa: F401  # the client is connected by now

        client = await self._etcd()
        if not self.machine.serving_as_master:
            await host.stop_replicating()  # the epoch starts at this log's end: nothing may be appended after it
        start = host.log_end()
        sent = self.clock.monotonic()
        lease = await client.lease(self.lease_ttl)
        p, t, revs = self.prefix, client.transactions, self._revs
        me = self.config.broker_addr
        leader = orjson.dumps({"addr": me, "haAddr": host.ha_addr(), "epoch": epoch})
        ok, _ = await client.transaction(
            compare=[
                t.create((p + "leader").encode()) == 0,
                t.mod((p + "epoch").encode()) == revs.get("epoch", 0),
                t.mod((p + "syncStateSet").encode()) == revs.get("syncStateSet", 0),
            ],
            success=[
                t.put((p + "leader").encode(), leader, lease.id),
                t.put((p + "epoch").encode(), str(epoch).encode()),
                t.put(
                    (p + f"epochs/{epoch:012d}").encode(),
                    orjson.dumps({"epoch": epoch, "startOffset": start, "addr": me}),
                ),
                t.put((p + "syncStateSet").encode(), orjson.dumps({"members": [me], "epoch": epoch})),
            ],
            failure=[],
        )
        if not ok:
            try:
                await client.revoke_lease(lease.id)
            except Exception:
                pass
            log.info("controller: lost the election for epoch %d", epoch)
            await self._apply(self.machine.lost())
            return
        self._lease_id = lease.id
        log.warning(
            "controller: %s elected master of %s at epoch %d, commit-log offset %d",
            me,
            self.config.broker_name,
            epoch,
            start,
        )
        await self._apply(self.machine.won(epoch, start, self.clock.monotonic(), sent))

    async def _publish_sync_set(self, members: frozenset[str]) -> None:
        # A member joins the required set (every send waits for it) before etcd lists it as electable; a member
        # leaves it only after etcd stopped listing it (below, on success).
        client = await self._etcd()
        p, t = self.prefix, client.transactions
        ok, _ = await client.transaction(
            compare=[
                t.mod((p + "leader").encode()) == self._revs.get("leader", -1),
                t.mod((p + "syncStateSet").encode()) == self._revs.get("syncStateSet", 0),
            ],
            success=[
                t.put(
                    (p + "syncStateSet").encode(),
                    orjson.dumps({"members": sorted(members), "epoch": self.machine.epoch}),
                )
            ],
            failure=[],
        )
        if ok:
            log.info("controller: in-sync set of %s is now %s", self.config.broker_name, sorted(members))
            assert self.host is not None
            self.host.set_required(members - {self.config.broker_addr})

    def status(self) -> dict[str, Any]:
        view = self.view
        return {
            "controllerRole": self.machine.role.value,
            "epoch": self.machine.epoch,
            "masterEpoch": view.leader.epoch if view and view.leader else None,
            "master": view.leader.addr if view and view.leader else None,
            "syncStateSet": sorted(view.sync_set) if view and view.sync_set is not None else None,
            "fenced": self.machine.fence_reason if self.machine.role is Role.FENCED else "",
            "lastError": self.last_error,
        }
