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

__all__ = ["TxmqSparkError", "clear_errors", "get_spark", "register"]


def register(spark: Any) -> Any:
    from txmq.spark.broker_source import TxmqDataSource
    from txmq.spark.store_source import TxmqStoreDataSource

    spark.dataSource.register(TxmqDataSource)
    spark.dataSource.register(TxmqStoreDataSource)
    return spark


def get_spark(master: str | None = None, app_name: str = "txmq", conf: dict[str, str] | None = None) -> Any:
    """A SparkSession with txmq's sources registered.

    Under ``spark-submit`` the submitted master and settings are used as they are; otherwise ``master`` (default
    ``local[*]``). Workers run this same Python unless PYSPARK_PYTHON says otherwise.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit started the JVM and chose the master
    if master is not None or not submitted:
        builder = builder.master(master or "local[*]")
    if not submitted:
        builder = builder.config("spark.ui.showConsoleProgress", "false").config("spark.sql.session.timeZone", "UTC")
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    return register(spark)
