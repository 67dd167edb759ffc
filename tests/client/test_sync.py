"""The blocking wrappers: the portal thread, and the sync classes driving the asyncio ones against fake brokers."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
import typing
from collections.abc import Iterator
from typing import Any

import pytest
from client_fakes import FakeBroker, stored

import txmq.client as aio
from txmq.client import ConsumeStatus, Message, MessageExt, MessageQueue, SendResult, several, sync
from txmq.client._portal import Portal, get_portal
from txmq.errors import MQBrokerError, MQClientError
from txmq.namesrv.server import NameServer
from txmq.protocol.codes import RequestCode, ResponseCode

# -- the portal -----------------------------------------------------------------------------------------------------


def test_portal_runs_coroutines_and_reraises() -> None:
    portal = Portal("test-portal")
    try:

        async def answer() -> tuple[int, str]:
            await asyncio.sleep(0)
            return 42, threading.current_thread().name

        assert portal.run(answer()) == (42, "test-portal")

        async def fail() -> None:
            raise MQClientError("nope")

        with pytest.raises(MQClientError, match="nope"):
            portal.run(fail())
        assert portal.call(lambda: threading.current_thread().name) == "test-portal"
        with pytest.raises(TimeoutError):
            portal.run(asyncio.sleep(10), timeout=0.05)
    finally:
        portal.stop()
    assert not portal.thread.is_alive()


def test_blocking_on_the_loop_thread_is_refused_not_deadlocked() -> None:
    portal = Portal("test-portal-2")
    try:

        async def reenter() -> None:
            portal.run(asyncio.sleep(0))

        with pytest.raises(RuntimeError, match="event-loop thread"):
            portal.run(reenter())
    finally:
        portal.stop()


def test_the_process_portal_is_shared_and_restarts() -> None:
    first = get_portal()
    assert get_portal() is first
    assert first.thread.daemon


# -- sync clients against fakes running on their own thread -----------------------------------------------------------


class Backend:
    """A name server and a fake broker served from a separate loop thread (the 'remote' side)."""

    def __init__(self) -> None:
        self.portal = Portal("fake-cluster")
        self.ns = NameServer()
        port = self.portal.run(self.ns.start("127.0.0.1", 0))
        self.namesrv = f"127.0.0.1:{port}"
        self.broker = self.portal.run(FakeBroker("broker-a").start())
        self.portal.run(self.broker.register(self.namesrv, {"T": (1, 1, 6), "%RETRY%SG": (1, 1, 6)}))

    def close(self) -> None:
        self.portal.run(self.broker.close())
        self.portal.run(self.ns.close())
        self.portal.stop()


@pytest.fixture
def backend() -> Iterator[Backend]:
    b = Backend()
    yield b
    b.close()


def test_sync_producer(backend: Backend) -> None:
    with sync.Producer("PG", backend.namesrv) as producer:
        result = producer.send(Message("T", b"one"))
        assert isinstance(result, SendResult) and result.message_queue == MessageQueue("T", "broker-a", 0)
        done = threading.Event()
        seen: list[tuple[SendResult | None, BaseException | None]] = []

        def callback(r: SendResult | None, e: BaseException | None) -> None:
            seen.append((r, e))
            done.set()

        future = producer.send_async(Message("T", b"two"), callback)
        assert isinstance(future, concurrent.futures.Future)
        assert future.result(10).msg_id != result.msg_id
        assert done.wait(10) and seen[0][1] is None
        producer.send_oneway(Message("T", b"three"))
        batch = producer.send_batch([Message("T", b"4"), Message("T", b"5")])
        assert batch.msg_id.count(",") == 1
        assert producer.send_orderly(Message("T", b"6"), "key").message_queue.queue_id == 0
        assert producer.fetch_publish_queues("T") == [MessageQueue("T", "broker-a", 0)]
        backend.broker.handlers[RequestCode.SEND_MESSAGE_V2] = lambda _c, cmd: cmd.response(
            ResponseCode.MESSAGE_ILLEGAL, "too weird"
        )
        with pytest.raises(MQBrokerError, match="too weird"):
            producer.send(Message("T", b"bad"))
        with pytest.raises(MQClientError):
            producer.send_async(Message("T", b""))  # checked before anything is scheduled


def test_sync_push_consumer_with_a_listener_that_blocks(backend: Backend) -> None:
    backend.broker.stored_offsets = {("T", 0): 0, ("%RETRY%SG", 0): 0}
    backend.broker.pull_script[("T", 0)] = [(0, [stored("T", 0, i, f"m{i}".encode()) for i in range(3)], 3)]
    got: list[bytes] = []
    all_in = threading.Event()
    producer = sync.Producer("FWD", backend.namesrv)
    producer.start()

    def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        # Runs in the consumer's thread pool, so it may use other blocking clients.
        for m in msgs:
            producer.send(Message("T", b"forwarded-" + m.body))
            got.append(m.body)
        if len(got) == 3:
            all_in.set()
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = sync.PushConsumer("SG", backend.namesrv, instance_name="sync-consumer")
    consumer.subscribe("T")
    consumer.register_listener(listener)
    backend.broker.consumer_ids = [consumer.aio.config.client_id]
    with consumer:
        assert all_in.wait(10)
        assert MessageQueue("T", "broker-a", 0) in consumer.assigned_queues()
    producer.shutdown()
    assert sorted(got) == [b"m0", b"m1", b"m2"]
    forwarded = [c.body for c in backend.broker.of_code(RequestCode.SEND_MESSAGE_V2)]
    assert sorted(forwarded) == [b"forwarded-m0", b"forwarded-m1", b"forwarded-m2"]


def test_sync_admin_and_pull_consumer(backend: Backend) -> None:
    with sync.Admin(backend.namesrv) as admin:
        info = admin.cluster_info()
        assert info.master_addrs("C") == [backend.broker.addr]
        assert admin.topic_list() == ["%RETRY%SG", "T"]
        assert admin.topic_route("T").publish_queues() == [MessageQueue("T", "broker-a", 0)]
    backend.broker.pull_script[("T", 0)] = [(0, [stored("T", 0, 4, b"x", "A"), stored("T", 0, 5, b"y", "B")], 6)]
    with sync.PullConsumer("PCG", backend.namesrv) as consumer:
        (mq,) = consumer.fetch_queues("T")
        result = consumer.pull(mq, "A", 4)
        assert [m.body for m in result.messages] == [b"x"] and result.next_begin_offset == 6
        assert consumer.max_offset(mq) == 7
        consumer.update_offset(mq, 6)
        assert consumer.fetch_offset(mq, from_store=False) == 6
        consumer.persist_offset(mq)
    commit = backend.broker.of_code(RequestCode.UPDATE_CONSUMER_OFFSET)[-1].ext_fields
    assert (commit["consumerGroup"], commit["topic"], commit["commitOffset"]) == ("PCG", "T", "6")


# -- the blocking classes mirror the asyncio ones ------------------------------------------------------------------

TWINS = [
    (aio.Producer, sync.Producer),
    (aio.TransactionProducer, sync.TransactionProducer),
    (aio.PushConsumer, sync.PushConsumer),
    (aio.PullConsumer, sync.PullConsumer),
    (aio.Admin, sync.Admin),
    (several.Transaction, sync.Transaction),
]
# The ClientInstance lives on the client loop: blocking code reaches it through ``.aio`` and the loop, not directly.
LOOP_ONLY = {"instance"}


def blocking_return(hint: Any) -> Any:
    """What the blocking twin of a method returning ``hint`` returns: the same value, or a thread-safe future of a
    task's result."""
    if typing.get_origin(hint) is asyncio.Task:
        return concurrent.futures.Future[typing.get_args(hint)]  # type: ignore[misc]
    if hint is several.Transaction:  # a transaction of several messages has its blocking twin too
        return sync.Transaction
    return hint


def shape(fn: Any, *, blocking_twin: bool = False) -> tuple[list[tuple[str, Any, Any, Any]], Any]:
    """Parameters (name, kind, default, resolved annotation) and the resolved return annotation of ``fn``."""
    hints = typing.get_type_hints(fn)
    params = [(p.name, p.kind, p.default, hints.get(p.name)) for p in inspect.signature(fn).parameters.values()]
    returns = hints.get("return")
    return params, (blocking_return(returns) if blocking_twin else returns)


@pytest.mark.parametrize(("async_cls", "sync_cls"), TWINS, ids=lambda c: c.__name__)
def test_every_public_method_has_a_blocking_twin_with_its_signature(async_cls: type, sync_cls: type) -> None:
    methods = 0
    for name, member in inspect.getmembers(async_cls):
        if name.startswith("_") or name in LOOP_ONLY:
            continue
        twin = inspect.getattr_static(sync_cls, name, None)  # a real attribute: no __getattr__ fallback
        assert twin is not None, f"sync.{sync_cls.__name__} has no {name}"
        if isinstance(inspect.getattr_static(async_cls, name), property):
            assert isinstance(twin, property), f"sync.{sync_cls.__name__}.{name} should be a property"
            continue
        twin_fn = getattr(sync_cls, name)
        assert not inspect.iscoroutinefunction(twin_fn), f"sync.{sync_cls.__name__}.{name} is async"
        assert shape(twin_fn) == shape(member, blocking_twin=True), f"{sync_cls.__name__}.{name}"
        methods += 1
    assert not hasattr(sync_cls, "__getattr__")
    assert methods >= (2 if async_cls is several.Transaction else 5)


def test_the_blocking_admin_covers_the_transaction_calls() -> None:
    """The 13 calls the blocking Admin once served through __getattr__ are real, documented-by-signature methods."""
    for name in (
        "list_transactions",
        "transaction",
        "resolve_transaction",
        "resume_transaction",
        "transaction_counters",
        "dead_letters",
        "resend_dead_letters",
        "reset_offset",
        "master_broker_addrs",
        "acl_info",
        "update_acl_account",
        "delete_acl_account",
        "update_global_white_addrs",
    ):
        assert name in vars(sync.Admin), name
    assert inspect.signature(sync.Admin.list_transactions).parameters["limit"].default == 100
