"""Synthetic transaction stores, written straight through :class:`txmq.store.MessageStore` (ASYNC flush), laid out
exactly as the broker lays transactions out (see :mod:`txmq.spark.audit`). For the audit benchmark and tests."""

from __future__ import annotations

import random
from dataclasses import dataclass

from txmq.protocol.op_marker import OP_TAG, PROP_DECISION, PROP_HALF_PHYS, RESUME_TAG
from txmq.protocol.record import MessageRecord, Prop, TransactionType, UniqKeyGenerator
from txmq.spark.store_source import DISCARD_TOPIC, HALF_TOPIC, OP_TOPIC
from txmq.store.config import FlushDiskType, StoreConfig
from txmq.store.message_store import MessageStore

BROKER = ("127.0.0.1", 10911)
PRODUCER = ("127.0.0.1", 50000)


def half_record(
    group: str, topic: str, uniq: str, born_ms: int, body: bytes = b"{}", queue_id: int = 0
) -> MessageRecord:
    return MessageRecord(
        topic=HALF_TOPIC,
        body=body,
        born_timestamp=born_ms,
        born_host=PRODUCER,
        store_host=BROKER,
        properties={
            Prop.UNIQ_KEY: uniq,
            Prop.TRAN_MSG: "true",
            Prop.PGROUP: group,
            Prop.REAL_TOPIC: topic,
            Prop.REAL_QID: str(queue_id),
            Prop.TRANSACTION_ID: uniq,
        },
    )


def op_record(
    half_phys: int | None, half_queue_offset: int, decision: str | None, now_ms: int, uniq: str
) -> MessageRecord:
    props = {Prop.TAGS: OP_TAG, Prop.UNIQ_KEY: uniq}
    if decision is not None:  # None: a marker as RocketMQ writes it, without txmq's extras
        props[PROP_DECISION] = decision
    if half_phys is not None:
        props[PROP_HALF_PHYS] = str(half_phys)
    return MessageRecord(
        topic=OP_TOPIC,
        body=str(half_queue_offset).encode("ascii"),
        born_timestamp=now_ms,
        born_host=BROKER,
        store_host=BROKER,
        properties=props,
    )


def resume_record(half_phys: int, half_queue_offset: int, now_ms: int) -> MessageRecord:
    return MessageRecord(
        topic=OP_TOPIC,
        body=str(half_queue_offset).encode("ascii"),
        born_timestamp=now_ms,
        born_host=BROKER,
        store_host=BROKER,
        properties={Prop.TAGS: RESUME_TAG, PROP_HALF_PHYS: str(half_phys), "TXMQ_BY": "operator"},
    )


def delivery_record(half: MessageRecord, half_phys: int) -> MessageRecord:
    props = dict(half.properties)
    topic = props.pop(Prop.REAL_TOPIC)
    queue_id = int(props.pop(Prop.REAL_QID))
    props.pop(Prop.TRAN_MSG, None)
    return MessageRecord(
        topic=topic,
        body=half.body,
        queue_id=queue_id,
        sys_flag=int(TransactionType.COMMIT),
        born_timestamp=half.born_timestamp,
        born_host=half.born_host,
        store_host=BROKER,
        prepared_transaction_offset=half_phys,
        properties=props,
    )


def discard_copy(half: MessageRecord, checks: int) -> MessageRecord:
    return MessageRecord(
        topic=DISCARD_TOPIC,
        body=half.body,
        born_timestamp=half.born_timestamp,
        born_host=half.born_host,
        store_host=BROKER,
        properties={**half.properties, Prop.TRANSACTION_CHECK_TIMES: str(checks)},
    )


def open_store(root: str, segment_size: int = 1 << 30) -> MessageStore:
    config = StoreConfig(
        store_path_root_dir=root, mapped_file_size_commit_log=segment_size, flush_disk_type=FlushDiskType.ASYNC_FLUSH
    )
    return MessageStore(config).open()


@dataclass
class Plan:
    """How many transactions end each way; counts are exact."""

    commit: int = 0
    rollback: int = 0
    discard: int = 0
    pending: int = 0
    groups: tuple[str, ...] = ("PG_orders", "PG_payments")
    topics: tuple[str, ...] = ("Orders", "Payments")
    body: bytes = b'{"amount": 100}'
    seed: int = 7

    @property
    def total(self) -> int:
        return self.commit + self.rollback + self.discard + self.pending


def write_transactions(root: str, plan: Plan, *, batch: int = 2000, segment_size: int = 1 << 30) -> dict[str, int]:
    """Write ``plan.total`` transactions (halves, then their decisions and deliveries, batch by batch)."""
    kinds = ["COMMIT"] * plan.commit + ["ROLLBACK"] * plan.rollback + ["DISCARD"] * plan.discard
    kinds += ["PENDING"] * plan.pending
    rng = random.Random(plan.seed)
    rng.shuffle(kinds)
    uniq = UniqKeyGenerator("127.0.0.1", pid=1, token=plan.seed)
    now = 1_700_000_000_000
    store = open_store(root, segment_size)
    try:
        for start in range(0, len(kinds), batch):
            chunk = kinds[start : start + batch]
            halves = []
            for i, _kind in enumerate(chunk):
                n = start + i
                halves.append(
                    half_record(
                        plan.groups[n % len(plan.groups)],
                        plan.topics[n % len(plan.topics)],
                        uniq.next(now + n),
                        now + n,
                        plan.body,
                        n % 4,
                    )
                )
            results = store.put_many_sync(halves)
            after: list[MessageRecord] = []
            for kind, half, res in zip(chunk, halves, results, strict=True):
                if not res.ok:
                    raise RuntimeError(f"store refused a record: {res}")
                # The audit times a transaction from its half message's store timestamp to its decision.
                decided_at = res.store_timestamp + rng.randint(5, 5000)
                if kind == "COMMIT":
                    after.append(delivery_record(half, res.physical_offset))
                    after.append(op_record(res.physical_offset, res.queue_offset, "COMMIT", decided_at, uniq.next()))
                elif kind == "ROLLBACK":
                    after.append(op_record(res.physical_offset, res.queue_offset, "ROLLBACK", decided_at, uniq.next()))
                elif kind == "DISCARD":
                    after.append(discard_copy(half, 15))
                    after.append(op_record(res.physical_offset, res.queue_offset, "DISCARD", decided_at, uniq.next()))
            if after:
                for res in store.put_many_sync(after):
                    if not res.ok:
                        raise RuntimeError(f"store refused a record: {res}")
    finally:
        store.shutdown()
    return {k: kinds.count(k) for k in ("COMMIT", "ROLLBACK", "DISCARD", "PENDING")}
