"""txmq on Spark (``pip install 'txmq[spark]'``): data sources over topics and store folders, audit and
reconciliation jobs. See docs/spark.md.

``get_spark()`` returns a session with the sources registered; ``register(spark)`` registers them on a session you
built yourself. Formats: ``txmq`` (batch and streaming, through the broker) and ``txmq-store`` (a store folder).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from txmq.spark.errors import TxmqSparkError, clear_errors

__all__ = ["TxmqSparkError", "clear_errors", "get_spark", "is_connect", "register"]


def is_connect(spark: Any) -> bool:
    """A Spark Connect session (``sc://``): the client holds no JVM and Python code runs on the server."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def register(spark: Any, *, ship: bool | None = None) -> Any:
    """Register the ``txmq`` and ``txmq-store`` formats on ``spark``.

    On a Spark Connect session the server's Python workers must import txmq too: unless ``ship=False`` (the server
    already has txmq installed), txmq's own package is added to the session as a zip of Python files
    (``addArtifacts(..., pyfile=True)``); the server's workers need only docs/spark.md's executor requirements."""
    from txmq.spark.broker_source import TxmqDataSource
    from txmq.spark.store_source import TxmqStoreDataSource

    if ship is None:
        ship = is_connect(spark)
    if ship:
        _ship_package(spark)
    spark.dataSource.register(TxmqDataSource)
    spark.dataSource.register(TxmqStoreDataSource)
    return spark


def _ship_package(spark: Any) -> None:
    import hashlib
    import tempfile

    from txmq.spark.package import zip_bytes

    data = zip_bytes()
    # Named after its content: registering again on the same session adds the same artifact, never a second txmq.
    name = f"txmq-{hashlib.sha256(data).hexdigest()[:16]}.zip"
    with tempfile.TemporaryDirectory(prefix="txmq-ship-") as tmp:
        path = os.path.join(tmp, name)
        with open(path, "wb") as f:
            f.write(data)
        spark.addArtifacts(path, pyfile=True)


JVM_OPTIONS = "-XX:TieredStopAtLevel=1"  # a local session's JVM (get_spark): C1 only; conf= may say otherwise


def started_here_conf(master: str, conf: dict[str, str] | None = None) -> dict[str, str]:
    """What :func:`get_spark` sets on a session whose JVM it starts itself (not under ``spark-submit``), before the
    caller's ``conf``."""
    out = {
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        # The JVM started here runs short jobs whose rows are mostly handled in Python: compiling its hot code with
        # C2 costs more CPU than the code then saves (bench/RESULTS.md, "The audit by commit-log range").
        "spark.driver.extraJavaOptions": JVM_OPTIONS,
    }
    python = (conf or {}).get("spark.pyspark.python") or os.environ.get("PYSPARK_PYTHON") or sys.executable
    if master.startswith("local") and python == sys.executable:
        # The workers run this Python, which has txmq: their daemon imports the installed pyspark, whose bytecode is
        # cached, rather than compile Spark's zip of it again (txmq.spark.worker_daemon).
        out["spark.python.daemon.module"] = "txmq.spark.worker_daemon"
    return out


def get_spark(
    master: str | None = None,
    app_name: str = "txmq",
    conf: dict[str, str] | None = None,
    *,
    remote: str | None = None,
) -> Any:
    """A SparkSession with txmq's sources registered.

    ``remote="sc://host:port"``: a Spark Connect session (``pip install 'txmq[spark-connect]'``), with txmq shipped
    to the server (see :func:`register`). Otherwise, under ``spark-submit`` the submitted master and settings are used
    as they are, and outside it ``master`` (default ``local[*]``). Workers run this same Python unless PYSPARK_PYTHON
    (``spark.pyspark.python``) says otherwise. A JVM started here gets JVM_OPTIONS unless ``conf`` sets
    ``spark.driver.extraJavaOptions``, and a local one whose workers run this Python starts them with
    :mod:`txmq.spark.worker_daemon` unless ``conf`` sets ``spark.python.daemon.module``.
    """
    from pyspark.sql import SparkSession

    if remote is not None:
        if master is not None:
            raise ValueError("give a master or a Spark Connect remote, not both")
        builder = SparkSession.builder.remote(remote)
        for key, value in (conf or {}).items():
            builder = builder.config(key, value)
        return register(builder.getOrCreate())
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit started the JVM and chose the master
    if master is not None or not submitted:
        builder = builder.master(master or "local[*]")
    if not submitted:
        for key, value in started_here_conf(master or "local[*]", conf).items():
            builder = builder.config(key, value)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    return register(spark)
