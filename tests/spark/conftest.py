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
