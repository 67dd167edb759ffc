"""The asyncio :class:`PushConsumer`: rebalanced long-poll pulling that calls a listener for every message.

Per assigned queue there is one pull task (long polling, flow control, offset corrections) and, in orderly mode,
one consume task that holds the queue's broker lock and feeds the listener one batch at a time. Concurrent
listeners run as tasks bounded by ``consume_thread_max``; plain functions run in a thread pool of that size.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import datetime as dt
import logging
import weakref
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from txmq.client.callbacks import call_user
from txmq.client.instance import ClientInstance
from txmq.client.lifecycle import ClientLifecycle
from txmq.client.message import (
    ConsumeFromWhere,
    ConsumeOrderlyStatus,
    ConsumeStatus,
    ConsumeType,
    Message,
    MessageExt,
    MessageModel,
    MessageQueue,
    PullStatus,
    retry_topic,
)
from txmq.client.offset_store import OffsetStore, offset_store_for
from txmq.client.process_queue import ProcessQueue
from txmq.client.producer import check_group, check_topic
from txmq.client.selection import allocate_averagely
from txmq.client.subscription import Subscription
from txmq.errors import MQClientError, NoRouteError, RemotingError
from txmq.protocol.codes import RequestCode
from txmq.protocol.frame import RemotingCommand
from txmq.protocol.headers import PullMessageRequestHeader
from txmq.protocol.record import Prop
from txmq.protocol.topics import RETRY_GROUP_TOPIC_PREFIX

log = logging.getLogger("txmq.client")

# PullSysFlag bits (wire §2.5).
PULL_COMMIT_OFFSET = 0x1
PULL_SUSPEND = 0x2
PULL_SUBSCRIPTION = 0x4

BROKER_SUSPEND_MILLIS = 15_000
PULL_TIMEOUT_WHEN_SUSPENDED = 30.0
RECONSUME_LOCALLY_DELAY = 5.0

Listener = Callable[[list[MessageExt]], Any]
"""``listener(messages) -> ConsumeStatus`` (or ``ConsumeOrderlyStatus``); plain or ``async def``."""


def _timestamp_ms(value: int | float | dt.datetime | str | None, now_ms: int) -> int:
    """consume_timestamp as epoch ms: ms number, datetime, or Java's ``yyyyMMddHHmmss`` (local time)."""
    if value is None:
        return now_ms - 30 * 60 * 1000  # RocketMQ's default: half an hour ago
    if isinstance(value, dt.datetime):
        return int(value.timestamp() * 1000)
    if isinstance(value, str):
        return int(dt.datetime.strptime(value, "%Y%m%d%H%M%S").timestamp() * 1000)
    return int(value)


class PushConsumer(ClientLifecycle):
    """Consume subscribed topics through a listener, with clustering or broadcasting semantics.

    ``subscribe`` topics and ``register_listener`` before ``start``. In clustering mode the group's retry topic
    ``%RETRY%<group>`` is subscribed too, so messages the listener rejected come back after the broker's delay.
    """

    _what = "push consumer"

    def __init__(
        self,
        group: str,
        namesrv_addr: str | Sequence[str],
        *,
        message_model: MessageModel = MessageModel.CLUSTERING,
        consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
        consume_timestamp: int | dt.datetime | str | None = None,
        consume_thread_max: int = 20,
        consume_message_batch_max_size: int = 1,
        pull_batch_size: int = 32,
        pull_threshold_for_queue: int = 1000,
        pull_threshold_size_for_queue: int = 100 * 1024 * 1024,
        max_reconsume_times: int | None = None,
        suspend_current_queue_time: float = 1.0,
        pull_time_delay_when_exception: float = 3.0,
        await_termination_on_shutdown: float = 5.0,
        offset_store_dir: str | Path | None = None,
        lock_max_live_seconds: float = 60.0,
        **options: Any,
    ) -> None:
        check_group(group)
        super().__init__(namesrv_addr, **options)
        self.group = group
        self.message_model = message_model
        self.consume_from_where = ConsumeFromWhere(consume_from_where.value)
        self.consume_timestamp = consume_timestamp
        self.consume_thread_max = max(1, consume_thread_max)
        self.consume_message_batch_max_size = max(1, consume_message_batch_max_size)
        self.pull_batch_size = pull_batch_size
        self.pull_threshold_for_queue = pull_threshold_for_queue
        self.pull_threshold_size_for_queue = pull_threshold_size_for_queue
        self._max_reconsume_times = max_reconsume_times
        self.suspend_current_queue_time = suspend_current_queue_time
        self.pull_time_delay_when_exception = pull_time_delay_when_exception
        self.await_termination_on_shutdown = await_termination_on_shutdown
        self.offset_store_dir = Path(offset_store_dir) if offset_store_dir is not None else None
        # Orderly: the brokers' queue-lock lifetime (60 s; txmqLockMaxLiveTimeMills). Locks are renewed every third
        # of it and trusted locally for half of it, counted from when the lock request was sent (RocketMQ: 20/30/60).
        if lock_max_live_seconds <= 0:
            raise MQClientError("lock_max_live_seconds must be positive")
        self.lock_renew_interval = lock_max_live_seconds / 3
        self.lock_local_expiry = lock_max_live_seconds / 2
        self._subscriptions: dict[str, Subscription] = {}
        self._listener: Listener | None = None
        self._orderly = False
        self._offset_store: OffsetStore | None = None
        self._pqs: dict[MessageQueue, ProcessQueue] = {}
        self._pull_tasks: dict[MessageQueue, asyncio.Task[None]] = {}
        self._orderly_tasks: dict[MessageQueue, asyncio.Task[None]] = {}
        self._consume_tasks: set[asyncio.Task[Any]] = set()
        self._background: set[asyncio.Task[Any]] = set()
        self._relock_task: asyncio.Task[None] | None = None
        # Process queues whose results must not be committed: their lock went to another member, or their offset
        # was reset. (A queue handed over in a rebalance still commits the batch it was finishing.)
        self._no_commit: weakref.WeakSet[ProcessQueue] = weakref.WeakSet()
        self._rebalance_lock: asyncio.Lock | None = None
        self._consume_slots: asyncio.Semaphore | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._timestamp_ms = 0
        self._running = False

    # -- configuration ------------------------------------------------------------------------------------------

    @property
    def clustering(self) -> bool:
        return self.message_model is MessageModel.CLUSTERING

    @property
    def max_reconsume_times(self) -> int:
        """16 for concurrent listeners; -1 (never give up) for orderly ones, like RocketMQ."""
        if self._max_reconsume_times is not None:
            return self._max_reconsume_times
        return -1 if self._orderly else 16

    def subscribe(self, topic: str, expression: str = "*") -> None:
        """Consume ``topic`` messages whose tag matches ``expression`` (``"*"`` or ``"TagA || TagB"``)."""
        check_topic(topic)
        self._subscriptions[topic] = Subscription.parse(topic, expression, self.config.clock.now_ms())
        if self._started:
            self._resubscribed()

    def unsubscribe(self, topic: str) -> None:
        self._subscriptions.pop(topic, None)
        if self._started:
            self._resubscribed()

    def _resubscribed(self) -> None:
        instance = self._instance
        if instance is not None:
            self._spawn(instance.send_heartbeat_to_all())
            instance.rebalance_now()

    def register_listener(self, listener: Listener, *, orderly: bool = False) -> None:
        """Set the listener. Concurrent ones return :class:`ConsumeStatus`; ``orderly=True`` ones return
        :class:`ConsumeOrderlyStatus` and see each queue's messages strictly in order, one batch at a time.

        Raising counts as RECONSUME_LATER (SUSPEND_CURRENT_QUEUE_A_MOMENT when orderly). So does returning None,
        as in RocketMQ: return the status explicitly.
        """
        if self._started:
            raise MQClientError("register the listener before start()")
        if not callable(listener):
            raise MQClientError("the listener must be callable")
        self._listener = listener
        self._orderly = orderly

    # -- lifecycle ----------------------------------------------------------------------------------------------

    # -- lifecycle (ClientLifecycle) ------------------------------------------------------------------------------

    def _check_startable(self) -> None:
        if self._listener is None:
            raise MQClientError("register a listener before start()")
        if not self._subscriptions:
            raise MQClientError("subscribe to at least one topic before start()")

    def _attach(self, instance: ClientInstance) -> None:
        instance.register_consumer(self)
        if self.clustering:
            rt = retry_topic(self.group)
            self._subscriptions.setdefault(rt, Subscription.parse(rt, "*", self.config.clock.now_ms()))
        self._rebalance_lock = asyncio.Lock()
        self._consume_slots = asyncio.Semaphore(self.consume_thread_max)
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.consume_thread_max, thread_name_prefix=f"txmq-consume-{self.group}"
        )
        instance.register_request_handler(RequestCode.RESET_CONSUMER_CLIENT_OFFSET, _reset_offset_handler(instance))
        self._timestamp_ms = _timestamp_ms(self.consume_timestamp, instance.clock.now_ms())
        self._offset_store = offset_store_for(instance, self.group, self.config, self.clustering, self.offset_store_dir)
        self._running = True

    async def _on_started(self) -> None:
        instance = self.instance
        for topic in list(self._subscriptions):
            try:
                await instance.update_route(topic)
            except NoRouteError as exc:
                # The retry topic appears after the broker sees our first heartbeat; rebalancing will fetch it.
                (log.debug if topic.startswith(RETRY_GROUP_TOPIC_PREFIX) else log.warning)("%s", exc)
            except (RemotingError, MQClientError) as exc:
                log.warning("fetching the route of %s failed: %s", topic, exc)
        await instance.send_heartbeat_to_all()
        if self._orderly and self.clustering:
            self._relock_task = asyncio.create_task(self._relock_loop(), name=f"txmq-relock-{self.group}")
        await self.rebalance()
        log.info(
            "push consumer %s started (%s, %s, %s)",
            self.group,
            self.message_model.value,
            "orderly" if self._orderly else "concurrently",
            self.client_id,
        )

    async def _detach(self, instance: ClientInstance) -> None:
        self._running = False
        assert self._offset_store is not None and self._rebalance_lock is not None
        async with self._rebalance_lock:  # let a running rebalance finish before tearing down
            pass
        if self._relock_task is not None:
            self._relock_task.cancel()
        for task in self._pull_tasks.values():
            task.cancel()
        for pq in self._pqs.values():
            pq.wake()
        busy = [*self._consume_tasks, *self._orderly_tasks.values()]
        if busy:
            _done, pending = await asyncio.wait(busy, timeout=self.await_termination_on_shutdown)
            for task in pending:
                task.cancel()
        for task in [*self._pull_tasks.values(), *self._background]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._offset_store.persist_all(list(self._pqs), wait=True)
        if self._orderly and self.clustering:
            await self._unlock(list(self._pqs))
        for pq in self._pqs.values():
            pq.dropped = True
        self._pqs.clear()
        self._pull_tasks.clear()
        self._orderly_tasks.clear()
        await instance.unregister_consumer(self.group)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        log.info("push consumer %s shut down", self.group)

    def assigned_queues(self) -> list[MessageQueue]:
        """The queues this consumer currently pulls, sorted."""
        return sorted(mq for mq, pq in self._pqs.items() if not pq.dropped)

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- what the instance asks of a consumer ---------------------------------------------------------------------

    def consumer_data(self) -> dict[str, Any]:
        return {
            "groupName": self.group,
            "consumeType": ConsumeType.CONSUME_PASSIVELY.value,
            "messageModel": self.message_model.value,
            "consumeFromWhere": self.consume_from_where.value,
            "unitMode": False,
            "subscriptionDataSet": [self._subscriptions[t].to_json() for t in sorted(self._subscriptions)],
        }

    def subscribed_topics(self) -> set[str]:
        return set(self._subscriptions)

    async def persist_offsets(self) -> None:
        if self._running and self._offset_store is not None:
            await self._offset_store.persist_all([mq for mq, pq in self._pqs.items() if not pq.dropped])

    # -- rebalance ------------------------------------------------------------------------------------------------

    async def rebalance(self) -> None:
        """Recompute this consumer's queues for every subscribed topic and start or stop pulling accordingly."""
        if not self._running or self._rebalance_lock is None:
            return
        async with self._rebalance_lock:
            if not self._running:
                return
            for topic in sorted(self._subscriptions):
                try:
                    await self._rebalance_topic(topic)
                except asyncio.CancelledError:
                    raise
                except (RemotingError, MQClientError) as exc:
                    log.warning("rebalancing %s of group %s failed: %s", topic, self.group, exc)
            for mq in [mq for mq in self._pqs if mq.topic not in self._subscriptions]:
                await self._remove_queue(mq)

    async def _rebalance_topic(self, topic: str) -> None:
        instance = self.instance
        try:
            route = instance.route(topic) or await instance.update_route(topic)
        except NoRouteError as exc:
            (log.debug if topic.startswith(RETRY_GROUP_TOPIC_PREFIX) else log.warning)("%s", exc)
            return
        all_queues = route.subscribe_queues()
        if self.clustering:
            addr = route.random_broker_addr()
            if addr is None:
                log.warning("no broker to ask for the consumers of group %s", self.group)
                return
            cids = await instance.api.get_consumer_id_list(addr, self.group)
            if not cids:
                log.warning("the broker lists no consumer of group %s yet; keeping the current queues", self.group)
                return
            if instance.client_id not in cids:
                log.warning("client %s is not in group %s's consumer list %s yet", instance.client_id, self.group, cids)
            mine = allocate_averagely(self.group, instance.client_id, all_queues, cids)
        else:
            mine = list(all_queues)
        await self._apply_allocation(topic, set(mine))

    async def _apply_allocation(self, topic: str, mine: set[MessageQueue]) -> None:
        changed = False
        # Also finish removing queues a previous rebalance dropped but could not release (a batch was running).
        for mq in [mq for mq, pq in self._pqs.items() if mq.topic == topic and (mq not in mine or pq.dropped)]:
            changed |= await self._remove_queue(mq)
        new = sorted(mq for mq in mine if mq not in self._pqs)
        locked: set[MessageQueue] = set(new)
        lock_sent = self.instance.clock.monotonic()
        if new and self._orderly and self.clustering:
            locked = await self._lock(new)
        for mq in new:
            if mq not in locked:
                log.info("queue %s is still locked by another consumer of %s; will retry", mq, self.group)
                continue
            try:
                offset = await self._compute_pull_from(mq)
            except (RemotingError, MQClientError) as exc:
                log.warning("cannot find where to start consuming %s: %s", mq, exc)
                if self._orderly and self.clustering:
                    await self._unlock([mq])
                continue
            pq = ProcessQueue()
            if self._orderly and self.clustering:
                pq.locked = True
                pq.last_lock_time = lock_sent
            self._start_queue(mq, pq, offset)
            log.info("group %s now consumes %s from offset %d", self.group, mq, offset)
            changed = True
        if changed:
            # Java re-heartbeats after a change so the broker's subscription view stays current.
            self._spawn(self.instance.send_heartbeat_to_all())

    def _start_queue(self, mq: MessageQueue, pq: ProcessQueue, offset: int) -> None:
        self._pqs[mq] = pq
        self._pull_tasks[mq] = asyncio.create_task(self._pull_loop(mq, pq, offset), name=f"txmq-pull-{mq}")
        if self._orderly:
            self._orderly_tasks[mq] = asyncio.create_task(self._orderly_loop(mq, pq), name=f"txmq-orderly-{mq}")

    def _lock_expired(self, pq: ProcessQueue) -> bool:
        return self.instance.clock.monotonic() - pq.last_lock_time > self.lock_local_expiry

    def _drop_lost(self, mq: MessageQueue) -> None:
        """Another member holds ``mq``'s lock now: stop at once and commit nothing more for it."""
        pq = self._pqs.pop(mq, None)
        if pq is None:
            return
        pq.dropped = True
        pq.locked = False
        self._no_commit.add(pq)
        pq.wake()
        task = self._pull_tasks.pop(mq, None)
        if task is not None:
            task.cancel()
        orderly = self._orderly_tasks.pop(mq, None)
        if orderly is not None:
            self._background.add(orderly)  # it ends after the batch in hand; shutdown still waits for it
            orderly.add_done_callback(self._background.discard)
        if self.clustering and self._offset_store is not None:
            self._offset_store.remove(mq)
        log.warning("group %s lost the lock of %s to another consumer; dropped it", self.group, mq)
        self.instance.rebalance_now()

    async def _compute_pull_from(self, mq: MessageQueue) -> int:
        """The committed offset, or where consume_from_where says a new group starts (wire §2.5)."""
        assert self._offset_store is not None
        last = await self._offset_store.read(mq, from_store=True)
        if last >= 0:
            return last
        is_retry = mq.topic.startswith(RETRY_GROUP_TOPIC_PREFIX)
        where = self.consume_from_where
        if where is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET or (
            is_retry and where is ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
        ):
            return 0
        instance = self.instance
        addr = await instance.find_broker_addr_refreshing(mq.broker_name, mq.topic, master_only=False)
        if addr is None:
            raise MQClientError(f"the broker {mq.broker_name} is not known")
        if where is ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET or is_retry:
            return await instance.api.get_max_offset(addr, mq)
        return await instance.api.search_offset(addr, mq, self._timestamp_ms)

    async def _remove_queue(self, mq: MessageQueue) -> bool:
        """Stop consuming ``mq``; commit its offset (and unlock it when orderly) for the next owner."""
        pq = self._pqs.get(mq)
        if pq is None:
            return False
        pq.dropped = True
        pq.wake()
        task = self._pull_tasks.pop(mq, None)
        if task is not None:
            task.cancel()
        assert self._offset_store is not None
        if self._orderly and self.clustering:
            try:
                # The listener may be half-way through a batch; the next owner must not start before it ends.
                await asyncio.wait_for(pq.consume_lock.acquire(), 1.0)
            except TimeoutError:
                log.info("queue %s is busy consuming; it will be released at the next rebalance", mq)
                return False
            try:
                await self._offset_store.persist_all([mq], wait=True)
                await self._unlock([mq])
            finally:
                pq.consume_lock.release()
        else:
            await self._offset_store.persist_all([mq], wait=True)
        if self.clustering:
            self._offset_store.remove(mq)
        self._pqs.pop(mq, None)
        orderly = self._orderly_tasks.pop(mq, None)
        if orderly is not None:
            orderly.cancel()
        log.info("group %s no longer consumes %s", self.group, mq)
        return True

    # -- offset reset (RESET_CONSUMER_CLIENT_OFFSET from a broker) --------------------------------------------------

    async def reset_offset(self, topic: str, offsets: dict[MessageQueue, int]) -> None:
        """Restart the given queues of ``topic`` at these offsets: what was pulled for them is dropped, and a batch
        the listener is running finishes without committing."""
        if not self._running or self._rebalance_lock is None or self._offset_store is None:
            return
        store = self._offset_store
        async with self._rebalance_lock:
            for mq, offset in sorted(offsets.items()):
                if mq.topic != topic or offset < 0:
                    continue
                old = self._pqs.get(mq)
                if old is None or old.dropped:
                    store.update(mq, offset)
                    continue
                old.dropped = True
                self._no_commit.add(old)
                old.wake()
                task = self._pull_tasks.pop(mq, None)
                if task is not None:
                    task.cancel()
                if self._orderly:
                    try:
                        # Keep one batch at a time per queue: wait for the one in progress.
                        await asyncio.wait_for(old.consume_lock.acquire(), 30.0)
                    except TimeoutError:
                        log.warning("queue %s is still busy; it restarts from %d at the next rebalance", mq, offset)
                        store.update(mq, offset)
                        continue
                    old.consume_lock.release()
                    orderly = self._orderly_tasks.pop(mq, None)
                    if orderly is not None:
                        orderly.cancel()
                store.update(mq, offset)
                try:
                    # Also orders this commit after any periodic one still in flight with the old offset.
                    await store.persist(mq, wait=True)
                except (RemotingError, MQClientError) as exc:
                    log.warning("committing the reset offset of %s failed: %s", mq, exc)
                pq = ProcessQueue()
                pq.locked, pq.last_lock_time = old.locked, old.last_lock_time
                self._start_queue(mq, pq, offset)
                log.info("group %s restarts %s at offset %d (reset by an operator)", self.group, mq, offset)
            if not self.clustering:
                await store.persist_all([mq for mq in offsets if mq.topic == topic])

    # -- locks (orderly clustering) -------------------------------------------------------------------------------

    def _by_broker(self, mqs: Iterable[MessageQueue]) -> dict[str, list[MessageQueue]]:
        out: dict[str, list[MessageQueue]] = {}
        for mq in mqs:
            out.setdefault(mq.broker_name, []).append(mq)
        return out

    async def _lock(self, mqs: Iterable[MessageQueue]) -> set[MessageQueue]:
        return (await self._lock_detailed(mqs))[0]

    async def _lock_detailed(self, mqs: Iterable[MessageQueue]) -> tuple[set[MessageQueue], set[MessageQueue]]:
        """(queues now locked by us, queues whose broker answered): answered but not locked = held by another."""
        instance = self.instance
        locked: set[MessageQueue] = set()
        answered: set[MessageQueue] = set()
        for broker_name, group in self._by_broker(mqs).items():
            addr = await instance.find_broker_addr_refreshing(broker_name, group[0].topic)
            if addr is None:
                continue
            try:
                locked |= await instance.api.lock_batch_mq(addr, self.group, instance.client_id, group)
                answered.update(group)
            except (RemotingError, MQClientError) as exc:
                log.warning("locking %d queues on %s failed: %s", len(group), broker_name, exc)
        return locked, answered

    async def _unlock(self, mqs: Iterable[MessageQueue]) -> None:
        instance = self.instance
        for broker_name, group in self._by_broker(mqs).items():
            addr = instance.find_broker_addr(broker_name)
            if addr is None:
                continue
            try:
                await instance.api.unlock_batch_mq(addr, self.group, instance.client_id, group)
            except (RemotingError, MQClientError) as exc:
                log.info("unlocking %d queues on %s failed: %s", len(group), broker_name, exc)

    async def _relock_loop(self) -> None:
        clock = self.instance.clock
        while self._running:
            await clock.sleep(self.lock_renew_interval)
            try:
                await self.lock_all()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("re-locking the queues of %s failed", self.group)

    async def lock_all(self) -> None:
        """Renew the broker locks of every orderly queue (RocketMQ does this every 20 s)."""
        mqs = [mq for mq, pq in self._pqs.items() if not pq.dropped]
        if not mqs:
            return
        sent = self.instance.clock.monotonic()
        locked, answered = await self._lock_detailed(mqs)
        for mq in mqs:
            pq = self._pqs.get(mq)
            if pq is None or pq.dropped:
                continue
            if mq in locked:
                pq.locked = True
                pq.last_lock_time = sent
            elif mq in answered:
                self._drop_lost(mq)
            # A broker that did not answer: keep going until the local lock expires.

    # -- pulling --------------------------------------------------------------------------------------------------

    async def _pull_loop(self, mq: MessageQueue, pq: ProcessQueue, offset: int) -> None:
        instance = self.instance
        clock = instance.clock
        store = self._offset_store
        assert store is not None
        next_offset = offset
        while self._running and not pq.dropped:
            try:
                if pq.over_threshold(self.pull_threshold_for_queue, self.pull_threshold_size_for_queue):
                    # Flow control: wait until the listener frees room rather than pulling more into memory.
                    await pq.wait_for_space()
                    continue
                if self._orderly and self.clustering and (not pq.locked or self._lock_expired(pq)):
                    await clock.sleep(min(1.0, self.lock_renew_interval))
                    continue
                sub = self._subscriptions.get(mq.topic)
                if sub is None:
                    await clock.sleep(self.pull_time_delay_when_exception)
                    continue
                addr = await instance.find_broker_addr_refreshing(mq.broker_name, mq.topic, master_only=False)
                if addr is None:
                    raise MQClientError(f"the broker {mq.broker_name} of {mq} is not known")
                commit = store.get(mq) if self.clustering else None
                sys_flag = PULL_SUSPEND | PULL_SUBSCRIPTION
                if commit is not None and commit > 0:
                    sys_flag |= PULL_COMMIT_OFFSET
                header = PullMessageRequestHeader(
                    consumerGroup=self.group,
                    topic=mq.topic,
                    queueId=mq.queue_id,
                    queueOffset=next_offset,
                    maxMsgNums=self.pull_batch_size,
                    sysFlag=sys_flag,
                    commitOffset=commit or 0,
                    suspendTimeoutMillis=BROKER_SUSPEND_MILLIS,
                    subscription=sub.expression,
                    subVersion=sub.sub_version,
                    expressionType=sub.expression_type,
                )
                result = await instance.api.pull_message(
                    addr, mq.broker_name, header, PULL_TIMEOUT_WHEN_SUSPENDED, tags=sub.tags
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not self._running or pq.dropped:
                    break
                log.warning("pulling %s failed: %s; retrying in %gs", mq, exc, self.pull_time_delay_when_exception)
                instance.refresh_route_soon(mq.topic)
                await clock.sleep(self.pull_time_delay_when_exception)
                continue
            if pq.dropped:
                break
            if result.status is PullStatus.OFFSET_ILLEGAL:
                log.warning(
                    "offset %d of %s is illegal (queue holds %d..%d); continuing at %d",
                    next_offset,
                    mq,
                    result.min_offset,
                    result.max_offset,
                    result.next_begin_offset,
                )
                next_offset = result.next_begin_offset
                pq.clear()
                store.update(mq, next_offset)
                with contextlib.suppress(RemotingError, MQClientError):
                    await store.persist(mq, wait=False)
                continue
            next_offset = result.next_begin_offset
            fresh = pq.put(result.messages) if result.messages else []
            if fresh:
                self._dispatch(mq, pq, fresh)
            elif pq.is_empty():
                # Everything up to here was filtered out or nothing came: commit past it (Java's correctTagsOffset).
                store.update(mq, next_offset, increase_only=True)

    # -- consuming ------------------------------------------------------------------------------------------------

    def _dispatch(self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        if self._orderly:
            return  # pq.put woke the queue's orderly task
        size = self.consume_message_batch_max_size
        for i in range(0, len(msgs), size):
            self._submit(mq, pq, msgs[i : i + size])

    def _submit(self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt], delay: float = 0.0) -> None:
        task = asyncio.ensure_future(self._consume_concurrently(mq, pq, msgs, delay))
        self._consume_tasks.add(task)
        task.add_done_callback(self._consume_tasks.discard)

    def _restore_retry_topic(self, msgs: list[MessageExt]) -> None:
        rt = retry_topic(self.group)
        for m in msgs:
            if m.topic == rt:
                original = m.properties.get(Prop.RETRY_TOPIC)
                if original:
                    m.topic = original

    async def _call_listener(self, msgs: list[MessageExt]) -> Any:
        listener = self._listener
        assert listener is not None
        now = str(self.instance.clock.now_ms())
        for m in msgs:
            m.properties[Prop.CONSUME_START_TIME] = now
        return await call_user(listener, msgs, executor=self._executor)

    async def _consume_concurrently(
        self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt], delay: float
    ) -> None:
        if delay:
            await self.instance.clock.sleep(delay)
        assert self._consume_slots is not None
        async with self._consume_slots:
            if pq.dropped:
                return
            self._restore_retry_topic(msgs)
            reason = "the listener returned RECONSUME_LATER"
            try:
                status = await self._call_listener(msgs)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.exception("the listener of %s raised on %d message(s) of %s", self.group, len(msgs), mq)
                status = ConsumeStatus.RECONSUME_LATER
                reason = f"the listener raised {type(exc).__name__}: {exc}"
        if status is None:
            log.warning("the listener of %s returned None; treating it as RECONSUME_LATER", self.group)
            status = ConsumeStatus.RECONSUME_LATER
        elif not isinstance(status, ConsumeStatus):
            log.warning(
                "the listener of %s returned %r, not a ConsumeStatus; treating it as RECONSUME_LATER",
                self.group,
                status,
            )
            status = ConsumeStatus.RECONSUME_LATER
        if pq.dropped:
            return  # the queue moved to another consumer, which resumes from the committed offset
        failed: list[MessageExt] = []
        if status is ConsumeStatus.RECONSUME_LATER:
            if self.clustering:
                for m in msgs:
                    if not await self._send_message_back(m, mq, reason=reason):
                        failed.append(m)
            else:
                log.warning("broadcast consumer %s dropped %d message(s) its listener rejected", self.group, len(msgs))
        done = [m for m in msgs if all(m is not f for f in failed)]
        offset = pq.remove(done)
        if offset >= 0 and not pq.dropped:
            assert self._offset_store is not None
            self._offset_store.update(mq, offset, increase_only=True)
        if failed:
            # Neither the broker nor the retry topic took them: keep them (so the offset cannot pass them) and
            # try the listener again locally.
            for m in failed:
                m.reconsume_times += 1
            self._submit(mq, pq, failed, RECONSUME_LOCALLY_DELAY)

    async def _send_message_back(
        self, msg: MessageExt, mq: MessageQueue, delay_level: int = 0, reason: str | None = None
    ) -> bool:
        """Hand a rejected message to the broker for redelivery; fall back to re-sending it to the retry topic."""
        instance = self.instance
        try:
            addr = await instance.find_broker_addr_refreshing(mq.broker_name, mq.topic)
            if addr is None:
                raise MQClientError(f"the broker {mq.broker_name} is not known")
            await instance.api.consumer_send_msg_back(
                addr, msg, self.group, delay_level, self.max_reconsume_times_for_broker, reason=reason
            )
            return True
        except (RemotingError, MQClientError) as exc:
            log.info("CONSUMER_SEND_MSG_BACK of %s failed (%s); re-sending it to the retry topic", msg.msg_id, exc)
        try:
            await self._resend_to_retry_topic(msg)
            return True
        except (RemotingError, MQClientError) as exc:
            log.warning("re-sending %s to %s failed: %s", msg.msg_id, retry_topic(self.group), exc)
            return False

    @property
    def max_reconsume_times_for_broker(self) -> int:
        limit = self.max_reconsume_times
        return 0x7FFFFFFF if limit < 0 else limit

    def _retry_copy(self, msg: MessageExt) -> Message:
        """A copy of ``msg`` for ``%RETRY%<group>`` that remembers its original topic and first id."""
        props = {k: v for k, v in msg.properties.items() if k not in _CONSUMER_SIDE_PROPS}
        props.setdefault(Prop.RETRY_TOPIC, msg.topic)
        props.setdefault(Prop.ORIGIN_MESSAGE_ID, msg.msg_id)
        return Message(retry_topic(self.group), msg.body or b" ", properties=props, flag=msg.flag)

    async def _resend_to_retry_topic(self, msg: MessageExt) -> None:
        copy = self._retry_copy(msg)
        # The broker's delay for the n-th retry is level 3 + n (10 s, 30 s, 1 m, ...), as it would pick itself.
        copy.delay_level = 3 + msg.reconsume_times
        producer = await self.instance.inner_producer()
        await producer._send_retry_copy(copy, msg.reconsume_times + 1, self.max_reconsume_times_for_broker)

    async def _orderly_loop(self, mq: MessageQueue, pq: ProcessQueue) -> None:
        clock = self.instance.clock
        store = self._offset_store
        assert store is not None
        while self._running and not pq.dropped:
            await pq.wait_for_messages()
            if not self._running or pq.dropped:
                break
            if self.clustering and (not pq.locked or self._lock_expired(pq)):
                sent = clock.monotonic()
                locked, answered = await self._lock_detailed([mq])
                if pq.dropped:
                    break
                if mq in locked:
                    pq.locked = True
                    pq.last_lock_time = sent
                elif mq in answered:
                    self._drop_lost(mq)  # another member has it: never consume it without the lock
                    break
                else:
                    pq.locked = False
                    await clock.sleep(min(1.0, self.lock_renew_interval))
                    continue
            suspend = False
            async with pq.consume_lock:
                if pq.dropped or not self._running:
                    break
                if self.clustering and (not pq.locked or self._lock_expired(pq)):
                    continue  # the lock lapsed while waiting for the consume lock: renew it first
                msgs = pq.take(self.consume_message_batch_max_size)
                if not msgs:
                    continue
                self._restore_retry_topic(msgs)
                try:
                    status = await self._call_listener(msgs)
                except asyncio.CancelledError:
                    pq.put_back()
                    raise
                except Exception:
                    log.exception("the orderly listener of %s raised on %s", self.group, mq)
                    status = ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
                if not isinstance(status, ConsumeOrderlyStatus):
                    log.warning("the orderly listener of %s returned %r; suspending the queue", self.group, status)
                    status = ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
                if pq in self._no_commit:
                    break  # the lock went to another member or the offset was reset: they decide from here
                # A queue being handed over in a rebalance still commits this batch: _remove_queue waits for it.
                if status is ConsumeOrderlyStatus.SUCCESS or await self._give_up_on(msgs, mq):
                    store.update(mq, pq.commit())
                else:
                    for m in pq.put_back():
                        m.reconsume_times += 1
                    suspend = True
                if pq.dropped:
                    break
            if suspend:
                # Retry the same messages after a pause; nothing behind them is delivered meanwhile.
                await clock.sleep(self.suspend_current_queue_time)

    async def _give_up_on(self, msgs: list[MessageExt], mq: MessageQueue) -> bool:
        """Orderly: with a retry limit set, messages over it go to the DLQ (via the retry topic) and are skipped."""
        limit = self.max_reconsume_times
        if limit < 0 or not self.clustering or all(m.reconsume_times < limit for m in msgs):
            return False
        for m in msgs:
            try:
                producer = await self.instance.inner_producer()
                # reconsume_times at the limit makes the broker route it to %DLQ%<group> (wire §2.3 step 5).
                await producer._send_retry_copy(self._retry_copy(m), limit, limit)
            except (RemotingError, MQClientError) as exc:
                log.warning("moving %s of %s to the DLQ failed: %s; suspending instead", m.msg_id, mq, exc)
                return False
        return True


def _reset_offset_handler(instance: ClientInstance) -> Callable[[Any, RemotingCommand], Any]:
    """RESET_CONSUMER_CLIENT_OFFSET (220): ext topic, group, timestamp; body ResetOffsetBody (fastjson keys)."""

    def handle(_conn: Any, cmd: RemotingCommand) -> Any:
        from txmq.client.admin import parse_mq_table
        from txmq.client.fastjson import FastjsonError, loads

        group = cmd.ext_fields.get("group", "")
        topic = cmd.ext_fields.get("topic", "")
        consumer = instance.consumers.get(group)
        if not isinstance(consumer, PushConsumer):
            return None
        try:
            table = parse_mq_table((loads(cmd.body) or {}).get("offsetTable") or {})
            offsets = {mq: int(v) for mq, v in table.items()}
        except (FastjsonError, AttributeError, TypeError, ValueError) as exc:
            log.warning("ignoring an unreadable offset reset for %s/%s: %s", group, topic, exc)
            return None
        log.info("broker resets the offsets of group %s on %s: %s", group, topic, offsets)
        return consumer.reset_offset(topic, offsets)

    return handle


_CONSUMER_SIDE_PROPS = frozenset({Prop.MIN_OFFSET, Prop.MAX_OFFSET, Prop.CONSUME_START_TIME, Prop.DELAY})
