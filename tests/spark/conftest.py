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
    import hashlib
    import shutil
    import subprocess

    from txmq.spark.package import EXECUTOR_REQUIREMENTS

    key = hashlib.sha256(repr((EXECUTOR_REQUIREMENTS, sys.version_info[:2])).encode()).hexdigest()[:12]
    venv = REPO / ".cache" / f"spark-executor-{key}"
    python = venv / "bin" / "python"
    if not (venv / "ready").exists():
        building = venv.with_name(venv.name + ".building")
        shutil.rmtree(building, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(building)], check=True)
        pip = [str(building / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        done = subprocess.run([*pip, "--only-binary", ":all:", *EXECUTOR_REQUIREMENTS], capture_output=True, text=True)
        assert done.returncode == 0, f"building the executors' virtualenv failed:\n{done.stdout}\n{done.stderr}"
        (building / "ready").write_text("\n".join(EXECUTOR_REQUIREMENTS) + "\n")
        shutil.rmtree(venv, ignore_errors=True)
        building.rename(venv)  # a venv's scripts name their folder, but only pip's do and nothing here runs them
    return str(python)


@pytest.fixture(scope="session")
def spark_package(tmp_path_factory: pytest.TempPathFactory) -> object:
    """What `txmq spark package` writes (txmq.zip, txmq_spark_job.py, executor-requirements.txt)."""
    from txmq.spark.package import write_package

    return write_package(tmp_path_factory.mktemp("spark-package"))
