"""`txmq spark package`: what is shipped to a cluster's executors (no Spark started here)."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from txmq.cli import main as txmq_main
from txmq.spark.package import EXECUTOR_REQUIREMENTS, write_package, zip_bytes

REPO = Path(__file__).resolve().parents[2]


def test_executor_requirements_are_pyprojects_ranges() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + project["optional-dependencies"]["spark"]
    for requirement in EXECUTOR_REQUIREMENTS:
        assert requirement in declared, (requirement, declared)


def test_zip_holds_the_package_and_is_reproducible(tmp_path: Path) -> None:
    data = zip_bytes()
    assert data == zip_bytes()
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    for module in (
        "txmq/__init__.py",
        "txmq/spark/store_source.py",
        "txmq/spark/broker_source.py",
        "txmq/cli/spark.py",
    ):
        assert module in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    # The zip alone is importable (what --py-files puts on an executor's path).
    (tmp_path / "t.zip").write_bytes(data)
    code = "import txmq.spark.common as m, sys; print(m.__file__)"
    done = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(tmp_path / 't.zip')!r}); {code}"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(str(tmp_path / "t.zip")), done.stdout


def test_package_command(tmp_path: Path, capsys: object) -> None:
    assert txmq_main(["spark", "package", "--out", str(tmp_path / "dist")]) == 0
    printed = capsys.readouterr().out  # type: ignore[attr-defined]
    pkg = write_package(tmp_path / "again")
    assert (tmp_path / "dist" / "txmq.zip").read_bytes() == pkg.zip_path.read_bytes()
    lines = [line for line in (tmp_path / "dist" / "executor-requirements.txt").read_text().splitlines()]
    assert [line for line in lines if not line.startswith("#")] == list(EXECUTOR_REQUIREMENTS)
    assert re.search(r"spark-submit --master \S+ --py-files \S+/txmq\.zip --conf spark\.pyspark\.python=", printed)
    assert "from txmq.cli.spark import main" in (tmp_path / "dist" / "txmq_spark_job.py").read_text()
