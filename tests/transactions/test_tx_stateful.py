"""Random sequences of prepare, commit, rollback, check answers, checks coming due and discards, resumes, operator
resolutions and restarts against a real in-process broker (fake clock), with the invariants held after every step:

* the fold of the op log so far (``txmq.txn.rebuild``, what a restart and the Spark audit read) equals the live
  state of every transaction (``tx show``);
* a committed transaction's message is in its topic exactly once; any other one is not there at all.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from txmq.protocol.op_marker import OP_TAG, RESUME_TAG, parse_marker
from txmq.protocol.topics import TRANS_OP_HALF_TOPIC
from txmq.testing import aeventually
from txmq.txn.rebuild import RESUME, OpEvent, fold_all

from .test_tx_differential import TOPIC, Driver

decisions = st.sampled_from(["COMMIT", "ROLLBACK", "UNKNOWN"])


class Transactions(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="txmq-stateful-"))
        self.loop = asyncio.new_event_loop()
        self.driver = Driver(self.root, seed=0)
        self.run(self.driver.h.start())
        self.run(self.driver.producer_up())
        self.count = 0

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        try:
            self.driver.producer_down()
            self.run(self.driver.h.stop())
        finally:
            self.loop.close()
            shutil.rmtree(self.root, ignore_errors=True)

    def step(self, *op: Any) -> Any:
        return self.run(self.driver.step(list(op)))

    @rule()
    def prepare(self) -> None:
        assert self.step("prepare", self.count, None) == 0
        self.count += 1

    @precondition(lambda self: self.count > 0)
    @rule(data=st.data(), decision=decisions, oneway=st.booleans(), from_check=st.booleans())
    def end(self, data: st.DataObject, decision: str, oneway: bool, from_check: bool) -> None:
        self.step("end", data.draw(st.integers(0, self.count - 1)), decision, oneway, from_check)

    @rule(seconds=st.sampled_from([1, 2, 3, 5, 8]))
    def time_passes(self, seconds: int) -> None:
        self.step("tick", seconds)

    @precondition(lambda self: self.count > 0)
    @rule(data=st.data(), decision=decisions)
    def answer_a_check(self, data: st.DataObject, decision: str) -> None:
        self.step("answer", data.draw(st.integers(0, self.count - 1)), decision)

    @rule(state=st.sampled_from(["down", "up"]))
    def producer(self, state: str) -> None:
        self.step("producer", state)

    @precondition(lambda self: self.count > 0)
    @rule(data=st.data(), decision=st.sampled_from(["COMMIT", "ROLLBACK"]))
    def operator_resolves(self, data: st.DataObject, decision: str) -> None:
        self.step("resolve", data.draw(st.integers(0, self.count - 1)), decision)

    @precondition(lambda self: self.count > 0)
    @rule(data=st.data())
    def operator_resumes(self, data: st.DataObject) -> None:
        self.step("resume", data.draw(st.integers(0, self.count - 1)))

    @rule()
    def restart(self) -> None:
        self.step("restart")

    # -- invariants ------------------------------------------------------------------------------------------------

    def _op_log(self) -> dict[int, list[OpEvent]]:
        """Every half message's op-topic records, read from the store as a restart would."""
        broker = self.driver.h.broker
        assert broker is not None
        events: dict[int, list[OpEvent]] = defaultdict(list)
        by_offset = {q: phys for q, phys in self.driver.prepared.values()}
        offset = 0
        while entries := broker.store.read_consume_queue(TRANS_OP_HALF_TOPIC, 0, offset, 256):
            for phys, size, _code in entries:
                seq, offset = offset, offset + 1
                op = broker.store.read_message(phys, size)
                if op is None or op.tags not in (OP_TAG, RESUME_TAG):
                    continue
                for m in parse_marker(op.body, op.properties):
                    action = RESUME if op.tags == RESUME_TAG else m.decision
                    half = m.half_phys if m.half_phys is not None else by_offset.get(m.half_queue_offset)
                    events[half].append(OpEvent(seq, action, op.born_timestamp, m.by, m.copy_msg_id))
        return events

    async def _consistent(self) -> list[str]:
        delivered = await self.driver.pull_bodies(TOPIC)
        log = self._op_log()
        problems = []
        for i, (_queue_offset, phys) in sorted(self.driver.prepared.items()):
            live = (await self.driver.show(i))["state"]
            copies = delivered.get(f"tx-{i}", 0)
            folded = fold_all(log.get(phys, [])).state(delivered=copies > 0).value
            if folded != live:
                problems.append(f"tx-{i}: the op log folds to {folded}, the broker says {live}")
            if copies != (1 if live == "COMMITTED" else 0):
                problems.append(f"tx-{i} is {live} and delivered {copies} time(s)")
        return problems

    @invariant()
    def the_op_log_and_the_topic_agree_with_the_live_table(self) -> None:
        last: list[str] = []

        async def settled() -> bool:
            # A ROLLBACK counts as decided when accepted; its marker follows in the same loop turn's append.
            last[:] = await self._consistent()
            return not last

        try:
            self.run(aeventually(settled, "the op log and the topic to agree with the live table", timeout=5))
        except AssertionError:
            raise AssertionError("\n".join(last)) from None


Transactions.TestCase.settings = settings(
    max_examples=25,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestTransactions = Transactions.TestCase
