"""The lifecycle every client class shares (txmq.client.lifecycle), against an in-process name server and a fake
broker: before start and after shutdown nothing runs, start and shutdown are idempotent, a start that fails gives
the shared instance back."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from client_fakes import FakeBroker

from txmq.client import (
    Admin,
    ConsumeStatus,
    LocalTransactionState,
    MessageExt,
    Producer,
    PullConsumer,
    PushConsumer,
    TransactionProducer,
)
from txmq.errors import MQClientError
from txmq.protocol.codes import RequestCode


class Undecided:
    def execute_local_transaction(self, message: Any, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN

    def check_local_transaction(self, message: Any) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN


def listener(msgs: list[MessageExt]) -> ConsumeStatus:
    return ConsumeStatus.CONSUME_SUCCESS


def make(kind: str, namesrv: str, name: str) -> tuple[Any, str]:
    """A client of ``kind`` and how its errors name it."""
    if kind == "producer":
        return Producer("LPG", namesrv, instance_name=name), "producer LPG"
    if kind == "transaction producer":
        return TransactionProducer("LTPG", namesrv, Undecided(), instance_name=name), "transaction producer LTPG"
    if kind == "push consumer":
        consumer = PushConsumer("LCG", namesrv, instance_name=name)
        consumer.subscribe("T")
        consumer.register_listener(listener)
        return consumer, "push consumer LCG"
    if kind == "pull consumer":
        return PullConsumer("LPCG", namesrv, instance_name=name), "pull consumer LPCG"
    return Admin(namesrv, instance_name=name), "admin client"


async def use(client: Any) -> None:
    """One call that makes the client learn of the broker (a member unregisters from the brokers it knows)."""
    if isinstance(client, Producer):
        assert len(await client.fetch_publish_queues("T")) == 1
    elif isinstance(client, PullConsumer):
        assert len(await client.fetch_queues("T")) == 1
    elif isinstance(client, Admin):
        assert await client.topic_list() == ["%RETRY%LCG", "T"]


KINDS = ["producer", "transaction producer", "push consumer", "pull consumer", "admin"]


@pytest.mark.parametrize("kind", KINDS)
async def test_start_and_shutdown_bracket_the_instance(
    kind: str, namesrv: str, make_broker: Callable[..., Awaitable[FakeBroker]]
) -> None:
    broker = await make_broker("broker-a", {"T": (1, 1, 6), "%RETRY%LCG": (1, 1, 6)})
    client, label = make(kind, namesrv, f"life-{kind}")
    with pytest.raises(MQClientError, match=f"^{label} is not started; call start\\(\\) first$"):
        _ = client.instance
    await client.shutdown()  # nothing to do before start

    async with client as entered:
        assert entered is client
        instance = client.instance
        assert client.client_id == client.config.client_id == instance.client_id
        await client.start()  # already started: the same instance, nothing registered twice
        assert client.instance is instance
        await use(client)
    assert instance.closed  # the last client on it gave it back
    with pytest.raises(MQClientError, match="is not started"):
        _ = client.instance
    await client.shutdown()

    unregistered = broker.of_code(RequestCode.UNREGISTER_CLIENT)
    if kind == "admin":
        assert unregistered == []  # an admin client is no member of any group
    else:
        assert len(unregistered) == 1


async def test_a_start_that_fails_gives_the_instance_back(
    namesrv: str, make_broker: Callable[..., Awaitable[FakeBroker]]
) -> None:
    await make_broker("broker-a", {"T": (1, 1, 6)})
    first = Producer("SAME", namesrv, instance_name="shared")
    await first.start()
    instance = first.instance
    second = Producer("SAME", namesrv, instance_name="shared")  # same group on the same instance: refused
    with pytest.raises(MQClientError, match="already registered"):
        await second.start()
    with pytest.raises(MQClientError, match="producer SAME is not started"):
        _ = second.instance
    await second.shutdown()
    await first.shutdown()
    assert instance.closed  # the failed start took no lasting reference

    consumer = PushConsumer("NOLISTENER", namesrv, instance_name="shared")
    consumer.subscribe("T")
    with pytest.raises(MQClientError, match="register a listener before start"):
        await consumer.start()


async def test_a_producer_without_a_name_server_says_so_at_start() -> None:
    producer = Producer("PG")
    with pytest.raises(MQClientError, match="no name server address given"):
        await producer.start()
