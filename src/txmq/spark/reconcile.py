"""Reconciliation: a source-of-truth table against the messages that were delivered, joined on a key.

The source is any table Spark can read (parquet, CSV, JSON, a Spark table, JDBC through your own DataFrame) or a
SQLite file (read with Python's sqlite3 on the driver). Deliveries come from the broker (format ``txmq``) or from a
store folder (format ``txmq-store``, deliverable records only: not half, op or rolled-back records). The message side
of the key is ``keys`` (each of the KEYS), ``msg_id`` (UNIQ_KEY), ``tags``, ``property:NAME`` or ``json:FIELD`` (a
field of a JSON body).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from txmq.spark.errors import TxmqSparkError, clear_errors

SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3")


def load_source(
    spark: SparkSession, source: str, *, fmt: str | None = None, table: str | None = None, query: str | None = None
) -> DataFrame:
    """Read the source-of-truth table. ``fmt``: parquet, csv, json, sqlite or table (a Spark table name)."""
    if fmt is None:
        lowered = source.lower()
        if lowered.endswith(SQLITE_SUFFIXES):
            fmt = "sqlite"
        elif lowered.endswith(".csv"):
            fmt = "csv"
        elif lowered.endswith((".json", ".jsonl")):
            fmt = "json"
        else:
            fmt = "parquet"
    if fmt == "table":
        return spark.table(source)
    if not os.path.exists(source):
        raise TxmqSparkError(f"source {source} does not exist")
    if fmt == "sqlite":
        return _sqlite(spark, source, table, query)
    if fmt == "csv":
        return spark.read.option("header", "true").option("inferSchema", "true").csv(source)
    if fmt == "json":
        return spark.read.json(source)
    if fmt == "parquet":
        return spark.read.parquet(source)
    raise TxmqSparkError(f"source format must be parquet, csv, json, sqlite or table, got {fmt!r}")


def _sqlite(spark: SparkSession, path: str, table: str | None, query: str | None) -> DataFrame:
    import pandas as pd

    if not table and not query:
        raise TxmqSparkError(f"{path} is a SQLite database: name the table (--source-table) or a query")
    sql = query or f'SELECT * FROM "{table.replace(chr(34), "")}"'  # type: ignore[union-attr]
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
            frame = pd.read_sql_query(sql, conn)
    except (sqlite3.Error, pd.errors.DatabaseError) as exc:
        raise TxmqSparkError(f"reading SQLite {path}: {exc}") from None
    if frame.empty:
        cursor_cols = ", ".join(f"`{c}` string" for c in frame.columns) or "empty string"
        return spark.createDataFrame([], cursor_cols)
    return spark.createDataFrame(frame)


def delivered_messages(
    spark: SparkSession,
    topics: list[str],
    *,
    namesrv: str | None = None,
    store: str | None = None,
    options: dict[str, str] | None = None,
) -> DataFrame:
    """Messages of ``topics`` as consumers see them: through the broker, or from a store folder."""
    if not topics:
        raise TxmqSparkError("name the topics whose deliveries are reconciled")
    if (namesrv is None) == (store is None):
        raise TxmqSparkError("give either a name server (namesrv) or a store folder (store), not both or neither")
    if namesrv is not None:
        reader = spark.read.format("txmq").option("namesrv", namesrv).option("topics", ",".join(topics))
        return reader.options(**(options or {})).load()
    df = spark.read.format("txmq-store").option("topics", ",".join(topics)).load(store)
    # Deliverable records only: NOT_TYPE or COMMIT (half messages are in their own topic anyway).
    return df.filter(F.col("sys_flag").bitwiseAND(0xC).isin(0x0, 0x8)).drop("commit_log_offset", "store_size")


def message_key(spec: str) -> Column:
    """The key column of a message for ``spec`` (one row per key for ``keys``)."""
    if spec == "keys":
        return F.explode(F.split(F.coalesce(F.col("keys"), F.lit("")), " "))
    if spec in ("msg_id", "uniq", "uniq_key"):
        return F.col("msg_id")
    if spec == "tags":
        return F.col("tags")
    if spec.startswith("property:") and len(spec) > 9:
        return F.col("properties").getItem(spec[9:])
    if spec.startswith("json:") and len(spec) > 5:
        return F.get_json_object(F.col("body").cast("string"), "$." + spec[5:])
    raise TxmqSparkError(f"message key must be keys, msg_id, tags, property:NAME or json:FIELD, got {spec!r}")


@dataclass
class Reconciliation:
    missing: DataFrame  # source rows with no delivery
    unexpected: DataFrame  # deliveries with no committed source row
    duplicates: DataFrame  # keys delivered more than once


def reconcile(
    source: DataFrame, source_key: str, deliveries: DataFrame, key: str = "keys", where: str | None = None
) -> Reconciliation:
    if source_key not in source.columns:
        raise TxmqSparkError(f"source has no column {source_key!r}; its columns: {', '.join(source.columns)}")
    src = source.filter(where) if where else source
    src = src.withColumn("_key", F.col(source_key).cast("string")).filter(F.col("_key").isNotNull())
    dlv = deliveries.select(
        message_key(key).alias("_key"), "topic", "queue_id", "queue_offset", "msg_id", "store_timestamp"
    ).filter(F.col("_key").isNotNull() & (F.col("_key") != ""))
    delivered_keys = dlv.select("_key").distinct()
    source_keys = src.select("_key").distinct()
    missing = src.join(delivered_keys, "_key", "left_anti").withColumnRenamed("_key", "key")
    unexpected = dlv.join(source_keys, "_key", "left_anti").withColumnRenamed("_key", "key")
    duplicates = (
        dlv.groupBy("_key")
        .agg(
            F.count(F.lit(1)).alias("deliveries"),
            F.sort_array(F.collect_list("msg_id")).alias("msg_ids"),
        )
        .filter(F.col("deliveries") > 1)
        .withColumnRenamed("_key", "key")
    )
    return Reconciliation(missing, unexpected, duplicates)


def run_reconcile(
    spark: SparkSession,
    *,
    source: str,
    source_key: str,
    topics: list[str],
    key: str = "keys",
    source_format: str | None = None,
    source_table: str | None = None,
    where: str | None = None,
    namesrv: str | None = None,
    store: str | None = None,
    out_dir: str | None = None,
) -> dict[str, Any]:
    """Run a reconciliation; writes the three result sets as parquet and ``summary.json`` when ``out_dir`` is set."""
    started = time.perf_counter()
    with clear_errors():
        src = load_source(spark, source, fmt=source_format, table=source_table)
        dlv = delivered_messages(spark, topics, namesrv=namesrv, store=store).cache()
        result = reconcile(src, source_key, dlv, key, where)
        parts = {"missing": result.missing, "unexpected": result.unexpected, "duplicates": result.duplicates}
        counts: dict[str, int] = {}
        samples: dict[str, list[dict[str, Any]]] = {}
        for name, df in parts.items():
            if out_dir:
                path = os.path.join(out_dir, f"{name}.parquet")
                df.write.mode("overwrite").parquet(path)
                df = spark.read.parquet(path)
            counts[name] = df.count()
            samples[name] = [
                {k: v for k, v in r.asDict().items() if not isinstance(v, (bytes, bytearray, dict))}
                for r in df.limit(10).collect()
            ]
        summary = {
            "source_rows": src.filter(where).count() if where else src.count(),
            "deliveries": dlv.count(),
            **counts,
            "consistent": not any(counts.values()),
            "samples": samples,
            "seconds": round(time.perf_counter() - started, 2),
        }
        dlv.unpersist()
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2, default=str)
    return summary
