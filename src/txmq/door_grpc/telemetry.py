"""A client's Telemetry stream as the broker sees it: a producer connection that carries transaction checks
(:class:`~txmq.broker.txn.producers.CheckChannel`), written as ``recover_orphaned_transaction_command``."""

from __future__ import annotations

import asyncio
from typing import Any

from txmq.door_grpc.convert import message_of
from txmq.door_grpc.pb import service_pb2 as s
from txmq.protocol.record import decode_offset_msg_id, encode_offset_msg_id
from txmq.txn.records import CheckRequest

TRANSACTION_ID_SEPARATOR = "-"


def transaction_id(store_host: tuple[str, int], half_phys: int, half_queue_offset: int) -> str:
    """The 5.x transaction id of a half message: its offsetMsgId and its half-queue offset, which EndTransaction
    needs to name it (RocketMQ's commitLogOffset and tranStateTableOffset)."""
    return f"{encode_offset_msg_id(store_host, half_phys)}{TRANSACTION_ID_SEPARATOR}{half_queue_offset}"


def parse_transaction_id(text: str) -> tuple[int, int]:
    """(half commit-log offset, half queue offset); ValueError when ``text`` is not one txmq gave out."""
    offset_msg_id, sep, queue_offset = text.partition(TRANSACTION_ID_SEPARATOR)
    if not sep:
        raise ValueError(f"transaction id {text[:80]!r} is not one txmq gave out")
    try:
        _host, phys = decode_offset_msg_id(offset_msg_id)
    except Exception as exc:
        raise ValueError(f"transaction id {text[:80]!r} is not one txmq gave out: {exc}") from None
    return phys, int(queue_offset)


class TelemetryStream:
    """One open Telemetry stream: what the door writes to it goes through ``outbox``; None ends it."""

    def __init__(self, client_id: str, peer: tuple[str, int], language: str, store_host: tuple[str, int]) -> None:
        self.client_id = client_id
        self.peer = peer
        self.language = language
        self.store_host = store_host
        self.outbox: asyncio.Queue[s.TelemetryCommand | None] = asyncio.Queue()
        self.topics: list[str] = []  # what a producer publishes: its producer groups
        self.closed = False
        self.checks_sent = 0

    def send_transaction_check(self, check: CheckRequest) -> None:
        if self.closed:
            raise ConnectionError(f"the Telemetry stream of {self.client_id} is closed")
        command = s.TelemetryCommand(
            recover_orphaned_transaction_command=s.RecoverOrphanedTransactionCommand(
                message=message_of(check.message, topic=check.message.topic),
                transaction_id=transaction_id(self.store_host, check.half_phys, check.half_queue_offset),
            )
        )
        self.outbox.put_nowait(command)
        self.checks_sent += 1

    def close(self, reason: str = "") -> None:
        """End the stream (the broker's client scan calls it for a client that stopped sending heartbeats)."""
        if not self.closed:
            self.closed = True
            self.outbox.put_nowait(None)

    def __repr__(self) -> str:
        return f"<gRPC Telemetry {self.client_id} from {self.peer[0]}:{self.peer[1]}>"


def peer_of(peer_text: str) -> tuple[str, int]:
    _kind, _, rest = peer_text.partition(":")
    host, _, port = rest.rpartition(":")
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        return "", 0


def producer_heartbeat(client_id: str, topics: list[str]) -> dict[str, Any]:
    """A 4.x heartbeat body for the client registry: a 5.x producer belongs to one producer group per topic it
    publishes (the proxy uses the topic as the producer group of transactional messages)."""
    return {"clientID": client_id, "producerDataSet": [{"groupName": t} for t in topics]}
