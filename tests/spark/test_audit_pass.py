"""The audit's per-transaction pass (``txmq.spark.audit.per_transaction``, what ``mapInArrow`` runs on each partition
after the one shuffle by half message) against the audit's definition written out per transaction in plain Python:
the op events sorted by commit-log offset (then action, then born time) and replayed through the broker's fold
(``deciding_event``), the deciding event's born time, the copies counted with the first one's offsetMsgId and the
earliest store time, and the copies whose half message is absent reported as orphans. Hypothesis builds partitions
of any mix (several markers in one record, resume records, unknown decisions, double copies, orphans), cut into
Arrow batches of any size. No Spark session: the function runs as an executor runs it. The same for ``classify``,
which makes a half message's audit row of the pass's row, the journal's and the discard copies' check counts.
"""

# ruff: noqa: E402  (txmq.spark imports pyspark: the skip must come first)
from __future__ import annotations

from typing import Any

import pytest

for _module in ("pyspark", "pyarrow"):
    pytest.importorskip(_module, reason="pyspark/pyarrow are not installed: pip install -e '.[spark]' (.ci/run does)")

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given
from hypothesis import strategies as st

from txmq.spark.audit import (
    PASS_ARROW,
    PASS_INPUT,
    PER_HALF_ARROW,
    classify,
    deciding_event,
    per_transaction,
    single_rows,
)
from txmq.spark.store_source import TX_COLUMNS, arrow_schema
from txmq.txn.rebuild import RESUME as REPLAY_RESUME

SCHEMA = arrow_schema(TX_COLUMNS)
HALVES = [1_000, 2_000, 3_000, 4_000]
DECISIONS = ["COMMIT", "ROLLBACK", "DISCARD", None, "X", "COMMIT,ROLLBACK"]  # None: RocketMQ's; then unknown ones


def _row(**values: Any) -> dict[str, Any]:
    return {name: values.get(name) for name in SCHEMA.names}


@st.composite
def partitions(draw: st.DrawFn) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    offset = iter(range(10_000, 1_000_000, 7))
    for h in draw(st.lists(st.sampled_from(HALVES), unique=True, max_size=4)):
        rows.append(
            _row(
                kind="HALF",
                commit_log_offset=h,
                half_phys=h,
                producer_group=draw(st.sampled_from(["PG", None])),
                topic="T",
                transaction_id=f"tx{h}",
                uniq_key=f"u{h}",
                store_timestamp=h * 10,
                tx_seq=draw(st.sampled_from([None, 0, 1])),
            )
        )
    for h in draw(st.lists(st.sampled_from([*HALVES, 9_000]), max_size=8)):  # 9 000: never a half message
        kind = draw(st.sampled_from(["OP", "OP", "RESUME", "DELIVERY"]))
        if kind == "DELIVERY":
            at = next(offset)
            rows.append(
                _row(
                    kind=kind,
                    commit_log_offset=at,
                    half_phys=h,
                    producer_group="PG",
                    topic="T",
                    uniq_key=f"u{h}",
                    offset_msg_id=f"id{at}",
                    store_timestamp=draw(st.integers(0, 99)),
                )
            )
        else:
            at = draw(st.sampled_from([next(offset), 500_000]))  # 500 000: several markers in one op record
            decision = None if kind == "RESUME" else draw(st.sampled_from(DECISIONS))
            rows.append(
                _row(
                    kind=kind,
                    commit_log_offset=at,
                    half_phys=h,
                    decision=decision,
                    born_timestamp=draw(st.integers(0, 99)),
                )
            )
    return draw(st.permutations(rows))


def expected(rows: list[dict[str, Any]]) -> set[tuple[Any, ...]]:
    halves = {r["half_phys"]: r for r in rows if r["kind"] == "HALF"}
    out = set()
    for h in {r["half_phys"] for r in rows}:
        ops = sorted(
            (
                r["commit_log_offset"],
                REPLAY_RESUME if r["kind"] == "RESUME" else (r["decision"] or "UNKNOWN"),
                r["born_timestamp"],
            )
            for r in rows
            if r["half_phys"] == h and r["kind"] in ("OP", "RESUME")
        )
        found = deciding_event(tuple(a for _o, a, _t in ops)) if ops else None
        decision, decision_ms = (None, None) if found is None else (found[1], ops[found[0]][2])
        copies = sorted((r["commit_log_offset"], r) for r in rows if r["half_phys"] == h and r["kind"] == "DELIVERY")
        first = copies[0][1] if copies else {}
        delivered = (first.get("offset_msg_id"), min(r["store_timestamp"] for _o, r in copies) if copies else None)
        half = halves.get(h)
        if half is not None:
            out.add(
                (False, h, half["producer_group"], half["topic"], half["transaction_id"], half["uniq_key"],
                 half["store_timestamp"], half["tx_seq"], decision, decision_ms, len(copies), *delivered)
            )  # fmt: skip
        elif copies:
            out.add((True, h, "PG", "T", None, f"u{h}", None, None, None, None, len(copies), *delivered))
    return out


@given(partitions(), st.integers(1, 5))
def test_the_pass_is_the_audits_definition(rows: list[dict[str, Any]], batch_rows: int) -> None:
    table = pa.Table.from_pylist(rows, schema=SCHEMA).select(list(PASS_INPUT))
    got: set[tuple[Any, ...]] = set()
    for batch in per_transaction(iter(table.to_batches(max_chunksize=batch_rows))):
        assert batch.schema == PASS_ARROW
        for r in batch.to_pylist():
            got.add(tuple(r.values()))
    assert got == expected(rows)
    assert len(got) == len({r[1] for r in got})  # one row per half commit-log offset


# ---------------------------------------------------------------------------------------------------------------
# classify: a half message's audit row from the pass's row, the journal's check counts and the discard copies'.

PASS_DECISIONS = ["COMMIT", "ROLLBACK", "UNKNOWN", "DISCARD", "RESUME", "X", None]


@st.composite
def half_rows(draw: st.DrawFn) -> list[dict[str, Any]]:
    out = []
    for h in draw(st.lists(st.integers(0, 30), unique=True, max_size=12)):
        decision = draw(st.sampled_from(PASS_DECISIONS))
        deliveries = draw(st.integers(0, 2))
        out.append(
            {
                "orphan": False,
                "half_phys": h,
                "producer_group": draw(st.sampled_from(["PG", "PG2", None])),
                "real_topic": "T",
                "transaction_id": f"tx{h}",
                "uniq_key": draw(st.sampled_from(["u1", "u2", f"u{h}", None])),
                "prepared_ms": 1_000 + h,
                "tx_seq": draw(st.sampled_from([None, 0])),
                "decision": decision,
                "decision_ms": None if decision is None else 2_000 + h,
                "deliveries": deliveries,
                "delivered_msg_id": f"id{h}" if deliveries else None,
                "delivered_ms": 3_000 + h if deliveries else None,
            }
        )
    return out


def audit_row(r: dict[str, Any], journal: dict[int, int], discards: dict[tuple[str, str], int]) -> tuple[Any, ...]:
    d, n = r["decision"], r["deliveries"]
    if d in ("COMMIT", "ROLLBACK"):
        resolution = d
    elif d == "UNKNOWN":
        resolution = "COMMIT" if n else "ROLLBACK"
    elif d == "DISCARD":
        resolution = "DISCARDED"
    else:
        resolution = "COMMIT" if n else "PENDING"
    resolved = r["decision_ms"] if d is not None else (r["delivered_ms"] if n else None)
    checks = journal.get(r["half_phys"])
    if checks is None and resolution == "DISCARDED":
        checks = discards.get((r["uniq_key"], r["producer_group"]))
    if checks is None and resolution in ("PENDING", "DISCARDED"):
        checks = 0
    took = None if resolved is None else resolved - r["prepared_ms"]
    return (r["producer_group"], "T", r["transaction_id"], r["uniq_key"], r["half_phys"], r["prepared_ms"], resolved,
            resolution, checks, took, r["delivered_msg_id"], n, r["tx_seq"])  # fmt: skip


@given(
    half_rows(),
    st.dictionaries(st.integers(0, 30), st.integers(1, 5), max_size=8),
    st.dictionaries(st.tuples(st.sampled_from(["u1", "u2", "u3"]), st.sampled_from(["PG", "PG2"])), st.integers(0, 20)),
)
def test_classify_is_the_audits_rules(
    rows: list[dict[str, Any]], journal: dict[int, int], discards: dict[tuple[str, str], int]
) -> None:
    table = pa.Table.from_pylist(rows, schema=PASS_ARROW)
    checks = pa.table(
        {
            "half_phys": pa.array(list(journal), pa.int64()),
            "journal_checks": pa.array(list(journal.values()), pa.int32()),
        }
    )
    copies = pa.table(
        {
            "uniq_key": pa.array([k[0] for k in discards], pa.string()),
            "producer_group": pa.array([k[1] for k in discards], pa.string()),
            "discard_checks": pa.array(list(discards.values()), pa.int32()),
        }
    )
    got = classify(table, checks, copies)
    assert got.schema == PER_HALF_ARROW
    assert sorted(map(tuple, (r.values() for r in got.to_pylist())), key=repr) == sorted(
        (audit_row(r, journal, discards) for r in rows), key=repr
    )
    singles = single_rows(got.filter(pc.is_null(got["tx_seq"])))
    for r in singles.to_pylist():
        assert (r["messages"], r["messages_delivered"], r["max_deliveries"]) == (
            1,
            int(r["deliveries"] > 0),
            r["deliveries"],
        )
        assert round(r["prepared_at"].timestamp() * 1000) == r["half_commit_log_offset"] + 1_000
