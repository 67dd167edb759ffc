"""txmq.spark.worker_daemon: the local sessions' Python workers import the installed pyspark, not Spark's zip of it
(whose sources Python compiles again in every daemon)."""

# ruff: noqa: E402  (txmq.spark imports pyspark: the skip must come first)
from __future__ import annotations

import os
import sys
import zipfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

for _module in ("pyspark", "pyarrow"):
    pytest.importorskip(_module, reason="pyspark/pyarrow are not installed: pip install -e '.[spark]' (.ci/run does)")

import pyarrow as pa

from txmq.spark import started_here_conf
from txmq.spark.worker_daemon import installed_first, zip_version

DAEMON = "txmq.spark.worker_daemon"


def pyspark_zip(folder: Path, version: str | None) -> str:
    path = folder / "pyspark.zip"
    with zipfile.ZipFile(path, "w") as z:
        if version is not None:
            z.writestr("pyspark/version.py", f'__version__: str = "{version}"\n')
        z.writestr("pyspark/__init__.py", "")
    return str(path)


def test_the_zips_of_the_installed_versions_go_behind_the_installed_packages(tmp_path: Path) -> None:
    pyspark, py4j = metadata.version("pyspark"), metadata.version("py4j")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    same = pyspark_zip(tmp_path / "a", pyspark)
    other = pyspark_zip(tmp_path / "b", "0.0.1")
    same_py4j = f"/spark/python/lib/py4j-{py4j}-src.zip"
    other_py4j = "/spark/python/lib/py4j-0.0.1-src.zip"
    path = [same, same_py4j, other, other_py4j, "/site-packages", "/work"]
    assert zip_version(same) == ("pyspark", pyspark)
    assert zip_version(same_py4j) == ("py4j", py4j)
    assert installed_first(path) == [other, other_py4j, "/site-packages", "/work", same, same_py4j]


def test_anything_else_stays_where_it_is(tmp_path: Path) -> None:
    (tmp_path / "pyspark.zip").write_bytes(b"not a zip")
    (tmp_path / "v").mkdir()
    no_version = pyspark_zip(tmp_path / "v", None)
    path = [str(tmp_path / "pyspark.zip"), no_version, str(tmp_path / "missing" / "pyspark.zip"), "/x/pyspark.egg"]
    assert [zip_version(p) for p in path] == [None, None, None, None]
    assert installed_first(path) == path


def test_get_spark_starts_local_workers_with_it_and_only_those() -> None:
    assert started_here_conf("local[2]")["spark.python.daemon.module"] == DAEMON
    assert "spark.python.daemon.module" not in started_here_conf("spark://127.0.0.1:7077")
    assert "spark.python.daemon.module" not in started_here_conf("local", {"spark.pyspark.python": "/other/python"})


def test_a_local_sessions_workers_import_the_installed_pyspark(spark: Any) -> None:
    """The test session runs its workers as get_spark's do: pyspark comes from site-packages, with its bytecode."""
    assert spark.conf.get("spark.python.daemon.module") == DAEMON

    def where(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyspark

        for _ in batches:
            pass
        lib = os.path.join("pyspark", "python", "lib")
        zips = [p for p in sys.path if p.endswith(".zip") and lib in p]
        last = bool(zips) and sys.path[-len(zips) :] == zips
        yield pa.RecordBatch.from_pydict({"file": [pyspark.__file__], "zips": [len(zips)], "zips_last": [last]})

    row = spark.range(0, 1, 1, 1).mapInArrow(where, "file string, zips bigint, zips_last boolean").collect()[0]
    assert ".zip" not in row["file"] and row["file"].endswith(os.path.join("pyspark", "__init__.py"))
    assert row["zips"] >= 1 and row["zips_last"]  # Spark's pyspark.zip is there, behind the installed packages
