"""The audit's scan and pass by commit-log range (``txmq.spark.audit_ranges``, what ``run_audit`` runs).

Without Spark (Hypothesis): events of any mix spread over ranges cut anywhere, each range's part file written and its
side output routed as the shuffle would route it (to any partitions), give the rows the pass gives over all of them
at once. With the test's local Spark session: ``run_audit`` on the planted store, cut into ranges of 4 KiB (so that
op records and copies lie in other ranges than their half messages), writes the same ``audit.parquet``,
``anomalies.parquet`` and events as the audit over the whole ``transactions`` view.
"""

# ruff: noqa: E402  (txmq.spark imports pyspark: the skip must come first)
from __future__ import annotations

import itertools
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

for _module in ("pyspark", "pyarrow"):
    pytest.importorskip(_module, reason="pyspark/pyarrow are not installed: pip install -e '.[spark]' (.ci/run does)")

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.spark.test_audit_pass import SCHEMA, partitions

from txmq.spark.audit import (
    PASS_INPUT,
    PER_HALF_ARROW,
    RESOLUTIONS,
    anomalies,
    discard_table,
    latency_percentiles,
    latency_summary,
    oldest_in_doubt,
    per_transaction,
    resolution_counts,
    run_audit,
    transaction_audit,
    transaction_events,
)
from txmq.spark.audit_ranges import (
    ANOMALY_ARROW,
    NO_RANGE,
    Range,
    local_pass_rows,
    part_path,
    plan_ranges,
    side_rows,
    single_anomalies,
)
from txmq.spark.store_source import DEFAULT_SPLIT_BYTES

END = 1_000_000
CUTS = [1_500, 2_500, 3_500, 10_020, 10_050, 12_000, 500_000, 500_001]


def rows_of(batches: Any) -> set[tuple[Any, ...]]:
    return {tuple(r.values()) for b in batches for r in b.to_pylist()}


@settings(deadline=None)
@given(
    partitions(),
    st.lists(st.sampled_from(CUTS), unique=True).map(sorted),
    st.sampled_from([0, 2_500]),
    st.integers(1, 3),
    st.randoms(),
)
def test_the_pass_by_range_is_the_pass_over_everything(
    rows: list[dict[str, Any]], cuts: list[int], base: int, workers: int, rnd: Any
) -> None:
    bounds = [base, *(c for c in cuts if c > base), END]
    ranges = [Range("segment", 0, lo, hi, lo) for lo, hi in itertools.pairwise(bounds)]
    stored = [r for r in rows if r["commit_log_offset"] >= base]  # below base: not in the store (retention)
    table = pa.Table.from_pylist(stored, schema=SCHEMA)
    with tempfile.TemporaryDirectory() as events_path:
        sides = []
        for i, r in enumerate(ranges):
            lo, hi = r.span
            offsets = table["commit_log_offset"]
            own = table.filter(pc.and_(pc.greater_equal(offsets, lo), pc.less(offsets, hi)))
            pq.write_table(own, part_path(events_path, i))
            sides.append(side_rows(own, ranges, i))
        side = pa.concat_tables(sides)
        assert pc.sum(pc.equal(side["kind"], "RANGE")).as_py() == len(ranges)
        routed = side.filter(pc.is_valid(side["target"]))
        # The shuffle: every row of a target in the same partition, the targets spread over partitions at random.
        where = {t: rnd.randrange(workers) for t in pc.unique(routed["target"]).to_pylist()}
        got: set[tuple[Any, ...]] = set()
        for w in range(workers):
            mine = routed.filter(pa.array([where[t] == w for t in routed["target"].to_pylist()], pa.bool_()))
            got |= rows_of(t for _index, t in local_pass_rows(ranges, events_path, mine, PASS_INPUT))
    everything = per_transaction(iter(table.select(list(PASS_INPUT)).to_batches()))
    assert got == rows_of(everything)
    assert len(got) == len({r[1] for r in got})  # one row per half commit-log offset


def test_side_rows_route_each_event_to_its_half_messages_range() -> None:
    ranges = [Range("s", 0, 0, 100, 0), Range("s", 0, 100, 200, 100)]
    events = pa.Table.from_pylist(
        [
            {"kind": "HALF", "commit_log_offset": 150, "half_phys": 150},
            {"kind": "OP", "commit_log_offset": 160, "half_phys": 150, "decision": "COMMIT"},  # its own range's
            {"kind": "OP", "commit_log_offset": 170, "half_phys": 50, "decision": "COMMIT"},  # range 0's
            {"kind": "DELIVERY", "commit_log_offset": 180, "half_phys": 7_000},  # no range's
            {"kind": "OP", "commit_log_offset": 190, "half_queue_offset": 3},  # RocketMQ's: no half offset
            {"kind": "DISCARD_COPY", "commit_log_offset": 195, "half_phys": 150, "checks": 15},
        ],
        schema=SCHEMA,
    )
    side = side_rows(events, ranges, 1).to_pylist()
    assert [(r["kind"], r["commit_log_offset"], r["target"], r["several"]) for r in side] == [
        ("OP", 170, 0, None),
        ("DELIVERY", 180, NO_RANGE, None),
        ("OP", 190, None, None),
        ("DISCARD_COPY", 195, 1, None),
        ("RANGE", None, 1, False),
    ]


def anomaly_of(resolution: str, deliveries: int) -> str | None:
    """txmq.spark.audit.anomalies' rules for a transaction of one message, in their order."""
    if resolution == "COMMIT" and deliveries == 0:
        return "COMMIT_WITHOUT_DELIVERY"
    if deliveries > 1:
        return "DOUBLE_DELIVERY"
    if resolution != "COMMIT" and deliveries > 0:
        return "DELIVERY_WITHOUT_COMMIT"
    return None


@given(st.lists(st.tuples(st.sampled_from(RESOLUTIONS), st.integers(0, 3), st.sampled_from(["PG", None]))))
def test_the_pass_flags_transactions_of_one_message_by_the_anomaly_rules(rows: list[tuple[str, int, Any]]) -> None:
    halves = pa.Table.from_pylist(
        [
            {"producer_group": g, "real_topic": "T", "uniq_key": f"u{i}", "half_commit_log_offset": i,
             "resolution": r, "deliveries": d, "delivered_msg_id": f"m{i}" if d else None}
            for i, (r, d, g) in enumerate(rows)
        ],
        schema=PER_HALF_ARROW,
    )  # fmt: skip
    found = single_anomalies(halves)
    assert found.schema == ANOMALY_ARROW
    expected = [
        (anomaly_of(r, d), g, "T", f"u{i}", i, r, d, f"m{i}" if d else None)
        for i, (r, d, g) in enumerate(rows)
        if anomaly_of(r, d) is not None
    ]
    assert [tuple(row.values()) for row in found.to_pylist()] == expected


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["u1", "u2", None]), st.sampled_from(["PG", "PH", None]), st.none() | st.integers(0, 20)
        )
    )
)
def test_the_discard_copies_check_counts_are_the_largest_per_key(copies: list[tuple[Any, Any, Any]]) -> None:
    table = pa.Table.from_pylist(
        [{"kind": "DISCARD_COPY", "uniq_key": u, "producer_group": g, "checks": c} for u, g, c in copies], schema=SCHEMA
    )
    expected: dict[tuple[str, str], int | None] = {}
    for u, g, c in copies:
        if u is not None and g is not None:
            best = expected.get((u, g))
            expected[(u, g)] = c if best is None else best if c is None else max(best, c)
    got = discard_table(table)
    assert got.schema.field("discard_checks").type == pa.int32()
    assert {(r["uniq_key"], r["producer_group"]): r["discard_checks"] for r in got.to_pylist()} == expected
    assert got.num_rows == len(expected)


def sorted_rows(df: Any) -> list[tuple[Any, ...]]:
    return sorted((tuple(r) for r in df.collect()), key=repr)


@pytest.mark.parametrize("split_bytes", [4096, DEFAULT_SPLIT_BYTES])
def test_run_audit_by_range_writes_what_the_audit_over_all_events_gives(
    spark: Any, planted_store: str, tmp_path: Path, split_bytes: int
) -> None:
    ranges = plan_ranges(planted_store, {str(tmp_path / "planned"): SCHEMA}, split_bytes)
    assert len(ranges) > 2 if split_bytes == 4096 else len(ranges) == 1
    out = tmp_path / "out"
    result = run_audit(spark, planted_store, str(out), report=False, split_bytes=split_bytes)
    parts = [f"part-{i:05d}.parquet" for i in range(len(ranges))]
    assert sorted(os.listdir(out / "events.parquet")) == parts
    assert set(parts) <= set(os.listdir(out / "audit.parquet"))  # and Spark's, of the transaction of several

    events = transaction_events(spark, planted_store)
    assert sorted_rows(spark.read.parquet(str(out / "events.parquet"))) == sorted_rows(events)
    audit = transaction_audit(spark, planted_store)
    written = spark.read.parquet(str(out / "audit.parquet"))
    assert [(f.name, f.dataType) for f in written.schema] == [(f.name, f.dataType) for f in audit.schema]
    assert sorted_rows(written) == sorted_rows(audit)
    assert sorted_rows(spark.read.parquet(str(out / "anomalies.parquet"))) == sorted_rows(anomalies(audit, events))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["anomalies"] == {"COMMIT_WITHOUT_DELIVERY": 1, "DOUBLE_DELIVERY": 1, "DELIVERY_WITHOUT_COMMIT": 2,
                                    "PARTIAL_DELIVERY": 1}  # fmt: skip
    assert result.transactions == audit.count() == 11
    assert summary["by_group_topic"] == json.loads(json.dumps(resolution_counts(audit)))
    oldest = [{**r.asDict(), "prepared_at": str(r["prepared_at"])} for r in oldest_in_doubt(audit).collect()]
    for rows in (oldest, summary["oldest_in_doubt"]):
        for r in rows:
            r.pop("age_ms"), r.pop("resolved_at", None)
    assert summary["oldest_in_doubt"] == json.loads(json.dumps(oldest)) != []
    assert summary["latency_ms"] == [r.asDict() for r in latency_percentiles(audit).collect()] != []


def test_run_audit_of_an_empty_store(spark: Any, tmp_path: Path) -> None:
    (tmp_path / "store" / "commitlog").mkdir(parents=True)
    result = run_audit(spark, str(tmp_path / "store"), str(tmp_path / "out"), report=False)
    assert (result.transactions, result.anomalies) == (0, 0)
    assert spark.read.parquet(str(tmp_path / "out" / "events.parquet")).count() == 0


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_latency_summary_is_the_nearest_rank_percentile_approx_approximates(spark: Any, seed: int) -> None:
    """latency_summary over counts of times gives what Spark's percentile_approx gives over the rows themselves when
    its sketch is exact (an accuracy beyond the row count): counts with null times, max, every resolution."""
    import random

    from pyspark.sql import functions as F

    rng = random.Random(seed)
    rows = []
    for resolution, n in (("COMMIT", rng.randint(1, 3000)), ("ROLLBACK", rng.randint(1, 40)), ("DISCARDED", 1)):
        spread = rng.choice([3, 100, 10**6])
        rows += [(resolution, rng.choice([None, *range(-5, spread)]) if rng.random() < 0.05 else rng.randint(0, spread))
                 for _ in range(n)]  # fmt: skip
    rows.append(("UNKNOWN", None))  # a resolution whose times are all null
    frame = spark.createDataFrame(rows, "resolution string, ms bigint")
    expected = (
        frame.groupBy("resolution")
        .agg(
            F.count(F.lit(1)).alias("count"),
            F.percentile_approx("ms", [0.5, 0.9, 0.99], 10**7).alias("q"),
            F.max("ms").alias("max_ms"),
        )
        .select("resolution", "count", *(F.col("q")[i].alias(n) for i, n in enumerate(("p50_ms", "p90_ms", "p99_ms"))),
                "max_ms")
        .orderBy("resolution")
    )  # fmt: skip
    counted: dict[tuple[str, int | None], int] = {}
    for key in rows:
        counted[key] = counted.get(key, 0) + 1
    times = [(r, ms, n) for (r, ms), n in counted.items()]
    rng.shuffle(times)
    split = len(times) // 2  # as the pass's tasks hand them back: the same time may come from several ranges
    times = times[:split] + [(r, ms, 1) for r, ms, n in times[split:] for _ in range(n)]
    assert latency_summary(times) == [r.asDict() for r in expected.collect()]
    assert latency_summary([]) == []


@pytest.mark.parametrize("seed", [1, 2])
def test_the_latency_charts_buckets_are_sparks_without_a_job(spark: Any, seed: int) -> None:
    """The report's latency chart counts (report.latency_buckets, from the pass's counts of times) equal what a
    Spark query over the audit rows counts (spark_latency_buckets): bucket edges, times under 1 ms, null times."""
    import random

    from txmq.spark.report import latency_buckets, spark_latency_buckets

    rng = random.Random(seed)
    edges = [round(10 ** (k / 4)) + d for k in range(0, 28) for d in (-1, 0, 1)]  # around every bucket's edge
    rows = [
        (
            rng.choice(["COMMIT", "ROLLBACK", "DISCARDED"]),
            rng.choice([None, -3, 0, 1, 2, *edges, rng.randint(0, 10**7)]),
        )
        for _ in range(2000)
    ]
    frame = spark.createDataFrame(rows, "resolution string, time_to_resolution_ms bigint")
    counted: dict[tuple[str, int | None], int] = {}
    for key in rows:
        counted[key] = counted.get(key, 0) + 1
    times = [(r, ms, n) for (r, ms), n in counted.items()]
    assert latency_buckets(times) == spark_latency_buckets(frame)
    assert latency_buckets([("COMMIT", None, 5)]) == []
