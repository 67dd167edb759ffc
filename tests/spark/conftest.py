"""One local SparkSession for every Spark test (tuned as in shared/docs/spark-notes.md).

Each test module skips itself (with the reason) when pyspark or pyarrow is missing."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

SKIP_REASON = "pyspark/pyarrow are not installed: pip install -e '.[spark]' (.ci/run does)"


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from txmq.spark import register

    tmp: Path = tmp_path_factory.mktemp("spark")
    session = (
        SparkSession.builder.master("local[2]")
        .appName("txmq-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.python.daemon.module", "txmq.spark.worker_daemon")  # as get_spark's local sessions
        .config("spark.sql.warehouse.dir", str(tmp / "warehouse"))
        .config("spark.driver.extraJavaOptions", f"-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Dderby.system.home={tmp}")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


@pytest.fixture
def quiet(spark: object) -> Iterator[object]:
    """Tests that provoke errors on purpose: no Java stack traces in the output."""
    spark.sparkContext.setLogLevel("OFF")  # type: ignore[attr-defined]
    yield spark
    spark.sparkContext.setLogLevel("ERROR")  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------------------------------------
# Clusters and Spark Connect (tests/spark/test_cluster.py, test_connect.py): executors run another Python than the
# test's, holding only what `txmq spark package` says they need; txmq reaches them as the package's zip.

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def executor_python() -> str:
    """A virtualenv with only txmq.spark.package.EXECUTOR_REQUIREMENTS (no txmq, no pandas, no pyspark: pyspark
    comes from the Spark installation). Built once per requirements and Python version under .cache/ (git-ignored);
    building it needs PyPI, like .ci/run."""
    import fcntl
    import hashlib

    from txmq.spark.package import EXECUTOR_REQUIREMENTS

    key = hashlib.sha256(repr((EXECUTOR_REQUIREMENTS, sys.version_info[:2])).encode()).hexdigest()[:12]
    venv = REPO / ".cache" / f"spark-executor-{key}"
    python = venv / "bin" / "python"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.with_name(venv.name + ".lock"), "w") as lock:  # one builder at a time (pytest-xdist's workers)
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (venv / "ready").exists():
            _build_executor_venv(venv, EXECUTOR_REQUIREMENTS)
    return str(python)


def _build_executor_venv(venv: Path, requirements: tuple[str, ...]) -> None:
    import shutil
    import subprocess

    building = venv.with_name(venv.name + ".building")
    shutil.rmtree(building, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(building)], check=True)
    pip = [str(building / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    done = subprocess.run([*pip, "--only-binary", ":all:", *requirements], capture_output=True, text=True)
    assert done.returncode == 0, f"building the executors' virtualenv failed:\n{done.stdout}\n{done.stderr}"
    (building / "ready").write_text("\n".join(requirements) + "\n")
    shutil.rmtree(venv, ignore_errors=True)
    building.rename(venv)  # a venv's scripts name their folder, but only pip's do and nothing here runs them


@pytest.fixture(scope="session")
def spark_package(tmp_path_factory: pytest.TempPathFactory) -> object:
    """What `txmq spark package` writes (txmq.zip, txmq_spark_job.py, executor-requirements.txt)."""
    from txmq.spark.package import write_package

    return write_package(tmp_path_factory.mktemp("spark-package"))


@pytest.fixture
def planted_store(tmp_path: Path) -> str:
    """A store of one 1 MiB segment with a transaction of every kind the audit tells apart, anomalies planted (a
    commit without its copy, a double copy, a copy of a rolled-back one, a copy without its half message, a
    transaction of several messages delivered in part), RocketMQ's marker with no half offset, resumes, discards."""
    from txmq.spark.synthetic import (
        delivery_record,
        discard_copy,
        half_record,
        op_record,
        open_store,
        resume_record,
    )

    root = str(tmp_path / "store")
    store = open_store(root, 1 << 20)
    now = 1_700_000_000_000
    try:
        names = ["no_delivery", "double", "rolled_back_but_delivered", "rocketmq_marker", "fine"]
        names += ["resumed", "discarded_then_committed", "crash_before_marker", "discarded"]
        # Two transactions of three messages each: one delivered whole, one only in part.
        names += ["whole_0", "whole_1", "whole_2", "partial_0", "partial_1", "partial_2"]
        halves = [half_record("PG", "T", name.upper(), now) for name in names]
        for h in halves:
            name = h.properties["UNIQ_KEY"].lower()
            if name[:-1] in ("whole_", "partial_"):
                h.properties.update({"TXMQ_TX_ID": name[:-2].upper(), "TXMQ_TX_SEQ": name[-1]})
        results = store.put_many_sync(halves)
        phys = {n: (r.physical_offset, r.queue_offset) for n, r in zip(names, results, strict=True)}
        half = dict(zip(names, halves, strict=True))
        records = [
            op_record(*phys["no_delivery"], "COMMIT", now + 10, "OP1"),
            delivery_record(half["double"], phys["double"][0]),
            delivery_record(half["double"], phys["double"][0]),
            op_record(*phys["double"], "COMMIT", now + 10, "OP2"),
            op_record(*phys["rolled_back_but_delivered"], "ROLLBACK", now + 10, "OP3"),
            delivery_record(half["rolled_back_but_delivered"], phys["rolled_back_but_delivered"][0]),
            delivery_record(half["rocketmq_marker"], phys["rocketmq_marker"][0]),
            op_record(None, phys["rocketmq_marker"][1], None, now + 10, "OP4"),
            delivery_record(half["fine"], phys["fine"][0]),
            op_record(*phys["fine"], "COMMIT", now + 10, "OP5"),
            delivery_record(half_record("PG", "T", "ORPHAN", now), 987_654_321),
            op_record(*phys["resumed"], "DISCARD", now + 10, "OP6"),
            resume_record(phys["resumed"][0], phys["resumed"][1], now + 20),
            op_record(*phys["discarded_then_committed"], "DISCARD", now + 10, "OP7"),
            delivery_record(half["discarded_then_committed"], phys["discarded_then_committed"][0]),
            op_record(*phys["discarded_then_committed"], "COMMIT", now + 30, "OP8"),
            delivery_record(half["crash_before_marker"], phys["crash_before_marker"][0]),
            discard_copy(half["discarded"], 15),
            op_record(*phys["discarded"], "DISCARD", now + 40, "OP9"),
            *(delivery_record(half[f"whole_{i}"], phys[f"whole_{i}"][0]) for i in range(3)),
            *(op_record(*phys[f"whole_{i}"], "COMMIT", now + 50, f"OPW{i}") for i in range(3)),
            *(delivery_record(half[f"partial_{i}"], phys[f"partial_{i}"][0]) for i in range(2)),
            *(op_record(*phys[f"partial_{i}"], "COMMIT", now + 50, f"OPP{i}") for i in range(3)),
        ]
        assert all(r.ok for r in store.put_many_sync(records))
    finally:
        store.shutdown()
    return root
