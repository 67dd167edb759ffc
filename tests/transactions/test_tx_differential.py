"""Differential test of the broker's transaction behaviour, as a client and an operator observe it over the wire.

Random sequences of prepare, END_TRANSACTION (commit, rollback, unknown; oneway or not; from a check or not), time
passing (checks and discards), check answers, a producer going away and coming back, operator resolve and resume,
and broker restarts are driven through a real in-process broker on a fake clock. What can be observed is recorded:
every response code, every check a producer received (which transaction, its TRANSACTION_CHECK_TIMES), the
messages delivered to the real topic and to TRANS_CHECK_MAX_TIME_TOPIC, and each transaction's history as
``txmq admin tx show`` gives it (times relative to its prepare).

``golden/tx_differential.json`` holds the sequences and what the broker showed when they were recorded; this test
replays them and demands the same. It pins today's behaviour so that a rewrite of the transaction service
(issue 20: a sans-IO core and a thin driver) can be shown to behave the same. Record again, after a deliberate
behaviour change only, with ``TXMQ_RECORD_TX_GOLDEN=1``.
"""

from __future__ import annotations

import asyncio
import collections
import os
import random
import re
from pathlib import Path
from typing import Any

import orjson
import pytest

from txmq.net import Connection
from txmq.protocol.codes import RequestCode, ResponseCode, TxmqRequestCode
from txmq.protocol.frame import RemotingCommand
from txmq.protocol.headers import EndTransactionRequestHeader, PullMessageRequestHeader, SendMessageRequestHeader
from txmq.protocol.record import TransactionType, decode_offset_msg_id, decode_record, decode_records, encode_properties
from txmq.testing import InProcessBroker, aeventually

GOLDEN = Path(__file__).with_name("golden") / "tx_differential.json"
RECORD = os.environ.get("TXMQ_RECORD_TX_GOLDEN") == "1"
TOPIC = "DiffTopic"
GROUP = "DiffPG"
CONFIG = {"transaction_time_out": 3_000, "transaction_check_interval": 2_000, "transaction_check_max": 3}
SEQUENCES = 24
OPS_PER_SEQUENCE = 30
END_TYPE = {"COMMIT": TransactionType.COMMIT, "ROLLBACK": TransactionType.ROLLBACK, "UNKNOWN": TransactionType.NOT_TYPE}
_HEX_ID = re.compile(r"\b[0-9A-F]{32,}\b")


def generate(seed: int) -> list[list[Any]]:
    """One random sequence of operations (JSON lists, so that the golden file holds them as they ran)."""
    rnd = random.Random(seed)
    ops: list[list[Any]] = []
    prepared = 0
    for _ in range(OPS_PER_SEQUENCE):
        kind = rnd.choices(
            ["prepare", "end", "tick", "answer", "producer", "resolve", "resume", "restart", "end_bad"],
            weights=[14, 14, 16, 10, 3, 5, 4, 3, 2],
        )[0]
        if kind == "prepare" or prepared == 0:
            immunity = rnd.choice([None, None, None, 1, 6])
            ops.append(["prepare", prepared, immunity])
            prepared += 1
        elif kind == "end":
            i = rnd.randrange(prepared)
            decision = rnd.choice(["COMMIT", "ROLLBACK", "COMMIT", "ROLLBACK", "UNKNOWN"])
            ops.append(["end", i, decision, rnd.random() < 0.4, rnd.random() < 0.2])
        elif kind == "tick":
            ops.append(["tick", rnd.choice([1, 2, 3, 5, 8])])
        elif kind == "answer":
            ops.append(["answer", rnd.randrange(prepared), rnd.choice(["COMMIT", "ROLLBACK", "UNKNOWN"])])
        elif kind == "producer":
            ops.append(["producer", rnd.choice(["down", "up"])])
        elif kind == "resolve":
            ops.append(["resolve", rnd.randrange(prepared), rnd.choice(["COMMIT", "ROLLBACK"])])
        elif kind == "resume":
            ops.append(["resume", rnd.randrange(prepared)])
        elif kind == "restart":
            ops.append(["restart"])
        else:
            ops.append(["end_bad", rnd.randrange(prepared), rnd.choice(["group", "offset"])])
    return ops


class Driver:
    """Carries out one sequence against an in-process broker and records what a client and an operator see."""

    def __init__(self, root: Path, seed: int) -> None:
        self.h = InProcessBroker(root, CONFIG)
        self.seed = seed
        self.producer: Connection | None = None
        self.checks: list[list[Any]] = []  # [i, TRANSACTION_CHECK_TIMES] received since the last observation
        self.checked: set[int] = set()
        self.prepared: dict[int, tuple[int, int]] = {}  # i -> (half queue offset, half commit-log offset)

    def uniq(self, i: int) -> str:
        return f"D1FF{self.seed:08X}{i:020X}"

    def on_request(self, _conn: Connection, cmd: RemotingCommand) -> None:
        if cmd.code == RequestCode.CHECK_TRANSACTION_STATE:
            record = decode_record(cmd.body)
            i = int(record.body.decode().split("-")[1])
            self.checks.append([i, record.properties.get("TRANSACTION_CHECK_TIMES")])
            self.checked.add(i)

    async def producer_up(self) -> None:
        self.producer = await self.h.connect(self.on_request)
        body = orjson.dumps({"clientID": "diff-producer", "producerDataSet": [{"groupName": GROUP}]})
        resp = await self.producer.request(RemotingCommand.request(RequestCode.HEART_BEAT, {}, body), timeout=5)
        assert resp.code == ResponseCode.SUCCESS

    def producer_down(self) -> None:
        if self.producer is not None:
            self.producer.close()
            self.producer = None

    async def request(self, cmd: RemotingCommand) -> RemotingCommand:
        conn = self.producer or await self.h.connect()
        return await conn.request(cmd, timeout=5)

    async def admin(self, code: TxmqRequestCode, body: dict[str, Any]) -> tuple[int, Any]:
        resp = await self.request(RemotingCommand.request(code, {}, orjson.dumps(body)))
        if resp.code != ResponseCode.SUCCESS:
            return resp.code, _HEX_ID.sub("<id>", resp.remark or "")
        return resp.code, orjson.loads(resp.body) if resp.body else None

    def end_cmd(self, i: int, decision: str, *, oneway: bool, from_check: bool, group: str = GROUP, shift: int = 0):
        queue_offset, phys = self.prepared[i]
        header = EndTransactionRequestHeader(
            producerGroup=group,
            tranStateTableOffset=queue_offset,
            commitLogOffset=phys + shift,
            commitOrRollback=int(END_TYPE[decision]),
            fromTransactionCheck=from_check,
            msgId=self.uniq(i),
            transactionId=self.uniq(i),
        )
        return RemotingCommand.request(RequestCode.END_TRANSACTION, header.to_ext(), oneway=oneway)

    async def settle_oneway(self, i: int, before: Any) -> None:
        """A oneway END has no answer: wait until the transaction shows its effect (or plainly has none) and no
        decision is still being stored (a check's answer shows in the history before its decision is stored)."""
        assert self.h.broker is not None
        transactions = self.h.broker.transactions
        for _ in range(40):
            await asyncio.sleep(0.005)
            if (await self.show(i)) != before:
                break
        await aeventually(lambda: not transactions.busy, "the oneway decision stored", interval=0.002)
        await self.h.wait_idle()

    async def show(self, i: int) -> Any:
        code, data = await self.admin(TxmqRequestCode.TXMQ_GET_TRANSACTION, {"id": self.uniq(i)})
        if code != ResponseCode.SUCCESS:
            return [code, data]
        tx = data["transaction"]
        start = tx["preparedAt"]

        def rel(t: Any) -> Any:
            return None if t is None else t - start

        return {
            "state": tx["state"],
            "resolvedBy": tx["resolvedBy"],
            "resolvedAt": rel(tx["resolvedAt"]),
            "delivered": tx["deliveredMsgId"] is not None,
            "discardedAt": rel(tx["discardedAt"]),
            "resumedAt": [rel(t) for t in tx["resumedAt"]],
            "checksTowardMax": tx["checksTowardMax"],
            "checkLog": [[rel(a["sentAt"]), a["answer"], rel(a["answeredAt"])] for a in tx["checkLog"]],
            "nextCheckAt": rel(tx["nextCheckAt"]),
            "waitingForProducer": tx["waitingForProducer"],
        }

    async def step(self, op: list[Any]) -> Any:
        kind = op[0]
        if kind == "prepare":
            _, i, immunity = op
            props = {"TRAN_MSG": "true", "PGROUP": GROUP, "UNIQ_KEY": self.uniq(i), "KEYS": f"k{i}", "TAGS": "T"}
            if immunity is not None:
                props["CHECK_IMMUNITY_TIME_IN_SECONDS"] = str(immunity)
            header = SendMessageRequestHeader(
                producerGroup=GROUP,
                topic=TOPIC,
                queueId=i % 2,
                sysFlag=int(TransactionType.PREPARED),
                bornTimestamp=self.h.clock.now_ms(),
                properties=encode_properties(props),
            )
            resp = await self.request(
                RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, header.to_v2_ext(), f"tx-{i}".encode())
            )
            if resp.code == ResponseCode.SUCCESS:
                phys = decode_offset_msg_id(resp.ext_fields["msgId"])[1]
                self.prepared[i] = (int(resp.ext_fields["queueOffset"]), phys)
            return resp.code
        if kind == "end":
            _, i, decision, oneway, from_check = op
            if i not in self.prepared:
                return "not prepared"
            cmd = self.end_cmd(i, decision, oneway=oneway, from_check=from_check)
            if oneway:
                before = await self.show(i)
                conn = self.producer or await self.h.connect()
                conn.send_oneway(cmd)
                await self.settle_oneway(i, before)
                return ["oneway", await self.show(i)]
            resp = await self.request(cmd)
            return [resp.code, _HEX_ID.sub("<id>", resp.remark or "")]
        if kind == "end_bad":
            _, i, what = op
            if i not in self.prepared:
                return "not prepared"
            cmd = self.end_cmd(
                i, "COMMIT", oneway=False, from_check=False, group="OtherPG" if what == "group" else GROUP,
                shift=1 if what == "offset" else 0,
            )  # fmt: skip
            resp = await self.request(cmd)
            return [resp.code, re.sub(r"\d+", "<n>", _HEX_ID.sub("<id>", resp.remark or ""))]
        if kind == "tick":
            await self.h.advance(op[1], step=1)
            seen, self.checks = sorted(self.checks), []
            return seen
        if kind == "answer":
            _, i, decision = op
            if i not in self.checked or self.producer is None:
                return "no check to answer"
            before = await self.show(i)
            self.producer.send_oneway(self.end_cmd(i, decision, oneway=True, from_check=True))
            await self.settle_oneway(i, before)
            return await self.show(i)
        if kind == "producer":
            if op[1] == "down":
                self.producer_down()
                await asyncio.sleep(0.05)  # the broker notices the closed connection
            elif self.producer is None:
                await self.producer_up()
            return "ok"
        if kind == "resolve":
            _, i, decision = op
            code, data = await self.admin(
                TxmqRequestCode.TXMQ_RESOLVE_TRANSACTION, {"id": self.uniq(i), "decision": decision}
            )
            return [code, data if code != ResponseCode.SUCCESS else await self.show(i)]
        if kind == "resume":
            code, data = await self.admin(TxmqRequestCode.TXMQ_RESUME_TRANSACTION, {"id": self.uniq(op[1])})
            return [code, data if code != ResponseCode.SUCCESS else await self.show(op[1])]
        if kind == "restart":
            had_producer = self.producer is not None
            self.producer = None
            await self.h.restart()
            if had_producer:
                await self.producer_up()
            return "ok"
        raise AssertionError(f"unknown op {op}")

    async def pull_bodies(self, topic: str) -> dict[str, int]:
        found: collections.Counter[str] = collections.Counter()
        for queue_id in range(4):
            offset = 0
            while True:
                header = PullMessageRequestHeader(
                    consumerGroup="DiffCG", topic=topic, queueId=queue_id, queueOffset=offset, maxMsgNums=32,
                    sysFlag=0x4, commitOffset=0, suspendTimeoutMillis=0, subscription="*",
                )  # fmt: skip
                resp = await self.request(RemotingCommand.request(RequestCode.PULL_MESSAGE, header.to_ext()))
                if resp.code != ResponseCode.SUCCESS:
                    break
                found.update(r.body.decode() for r in decode_records(resp.body))
                offset = int(resp.ext_fields["nextBeginOffset"])
        return dict(sorted(found.items()))

    async def run(self, ops: list[list[Any]]) -> list[Any]:
        await self.h.start()
        try:
            await self.producer_up()
            observations = [await self.step(op) for op in ops]
            await self.h.wait_idle()
            final = {
                "delivered": await self.pull_bodies(TOPIC),
                "discarded": await self.pull_bodies("TRANS_CHECK_MAX_TIME_TOPIC"),
                "transactions": [await self.show(i) for i in sorted(self.prepared)],
            }
            return [*observations, final]
        finally:
            self.producer_down()
            await self.h.stop()


def _load() -> dict[str, Any]:
    return orjson.loads(GOLDEN.read_bytes()) if GOLDEN.exists() else {"sequences": []}


@pytest.mark.skipif(RECORD, reason="recording the golden file (TXMQ_RECORD_TX_GOLDEN=1)")
@pytest.mark.parametrize("seed", range(SEQUENCES))
async def test_replay_matches_the_recorded_behaviour(tmp_path: Path, seed: int) -> None:
    golden = {s["seed"]: s for s in _load()["sequences"]}
    assert seed in golden, f"{GOLDEN} has no sequence {seed}: record it with TXMQ_RECORD_TX_GOLDEN=1"
    recorded = golden[seed]
    observed = await Driver(tmp_path, seed).run(recorded["ops"])
    steps = zip(recorded["ops"] + [["final"]], recorded["observations"], observed, strict=True)
    for n, (op, want, got) in enumerate(steps):
        assert orjson.loads(orjson.dumps(got)) == want, f"sequence {seed}, step {n} {op}"


def test_the_sequences_cover_every_kind_of_step() -> None:
    """The golden sequences exercise every operation, and every outcome a transaction can end in."""
    sequences = _load()["sequences"]
    kinds = {op[0] for s in sequences for op in s["ops"]}
    assert kinds == {"prepare", "end", "end_bad", "tick", "answer", "producer", "resolve", "resume", "restart"}
    states = {t["state"] for s in sequences for t in s["observations"][-1]["transactions"] if isinstance(t, dict)}
    assert {"PREPARED", "COMMITTED", "ROLLED_BACK", "DISCARDED"} <= states
    assert any(t.get("resumedAt") for s in sequences for t in s["observations"][-1]["transactions"])


@pytest.mark.skipif(not RECORD, reason="set TXMQ_RECORD_TX_GOLDEN=1 to record the golden file")
async def test_record_the_golden_file(tmp_path: Path) -> None:
    sequences = []
    for seed in range(SEQUENCES):
        ops = generate(seed)
        observations = await Driver(tmp_path / str(seed), seed).run(ops)
        sequences.append({"seed": seed, "ops": ops, "observations": orjson.loads(orjson.dumps(observations))})
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_bytes(orjson.dumps({"config": CONFIG, "sequences": sequences}, option=orjson.OPT_INDENT_2) + b"\n")
