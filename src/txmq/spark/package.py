"""What a Spark cluster's executors need to run txmq's jobs, packaged the way Spark users ship code.

Executors (and, for Python data sources, the driver's planner process) import txmq's sources by module, so they need:

- txmq itself: pure Python, shipped as a zip on ``--py-files`` (``spark.submit.pyFiles``), or over Spark Connect as a
  ``pyfile`` artifact (:func:`txmq.spark.register` adds it for a Connect session);
- :data:`EXECUTOR_REQUIREMENTS` installed in the Python the executors run (``spark.pyspark.python``): pyarrow, which
  every Python data source and ``mapInArrow`` needs, and orjson, which txmq's client (the ``txmq`` format) decodes
  broker replies with. Not pandas: the audit folds op records with ``mapInArrow``. pyspark itself comes from the
  Spark installation on each node (``$SPARK_HOME/python/lib/pyspark.zip``).

That Python must be the driver's minor version (pyspark refuses a worker of another one). Nothing here imports
pyspark. Tested on a standalone cluster whose executors run a virtualenv holding only these requirements
(tests/spark/test_cluster.py).
"""

from __future__ import annotations

import io
import os
import shlex
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import txmq

# Ranges as in pyproject.toml (tests/spark/test_package.py checks they stay the same).
EXECUTOR_REQUIREMENTS = ("pyarrow>=18", "orjson>=3.9")
ZIP_NAME = "txmq.zip"
JOB_NAME = "txmq_spark_job.py"
REQUIREMENTS_NAME = "executor-requirements.txt"
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # fixed, so the same sources always give the same bytes

JOB_TEXT = '''"""spark-submit application for txmq's Spark jobs: takes the arguments of `txmq spark` (audit, reconcile).

Written by `txmq spark package`; ship txmq.zip beside it with --py-files."""

import sys

from txmq.cli.spark import main

sys.exit(main())
'''


def package_dir() -> Path:
    """The folder of the txmq package this process imports."""
    here = Path(txmq.__file__).resolve().parent
    if not here.is_dir():  # imported from a zip itself
        raise RuntimeError(f"txmq is imported from {here}, not a folder: package it from an installed txmq")
    return here


def zip_bytes(source: Path | None = None) -> bytes:
    """A zip of the txmq package's Python files (``txmq/...``), byte-for-byte the same for the same sources."""
    root = source or package_dir()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for name in sorted(filenames):
                if not (name.endswith(".py") or name == "py.typed"):
                    continue
                path = Path(dirpath, name)
                info = zipfile.ZipInfo(f"txmq/{path.relative_to(root).as_posix()}", _ZIP_TIME)
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = 0o644 << 16
                zf.writestr(info, path.read_bytes())
    return buf.getvalue()


@dataclass(frozen=True)
class Package:
    zip_path: Path
    job_path: Path
    requirements_path: Path

    def submit_command(
        self,
        master: str = "spark://HOST:7077",
        executor_python: str = "/opt/txmq-executor/bin/python",
        job_args: tuple[str, ...] = ("audit", "--store", "/shared/txmq-data/store", "--out", "/shared/audit-out"),
    ) -> list[str]:
        return [
            "spark-submit",
            "--master",
            master,
            "--py-files",
            str(self.zip_path),
            "--conf",
            f"spark.pyspark.python={executor_python}",
            str(self.job_path),
            *job_args,
        ]


def write_package(out_dir: str | os.PathLike[str]) -> Package:
    """Write ``txmq.zip``, ``txmq_spark_job.py`` and ``executor-requirements.txt`` into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pkg = Package(out / ZIP_NAME, out / JOB_NAME, out / REQUIREMENTS_NAME)
    pkg.zip_path.write_bytes(zip_bytes())
    pkg.job_path.write_text(JOB_TEXT)
    pkg.requirements_path.write_text(
        f"# the Python that Spark executors run (spark.pyspark.python), Python {sys.version_info[0]}."
        f"{sys.version_info[1]} like the driver\n" + "".join(f"{r}\n" for r in EXECUTOR_REQUIREMENTS)
    )
    return pkg


def describe(pkg: Package) -> str:
    """What ``txmq spark package`` prints: the files and the commands that use them."""
    py = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    cmd = " ".join(shlex.quote(a) for a in pkg.submit_command())
    return (
        f"wrote {pkg.zip_path}, {pkg.job_path}, {pkg.requirements_path}\n"
        f"executors' Python, on every node (once):\n"
        f"  {py} -m venv /opt/txmq-executor && /opt/txmq-executor/bin/pip install -r {pkg.requirements_path}\n"
        f"submit:\n  {cmd}\n"
    )
