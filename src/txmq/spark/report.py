"""The audit's HTML report: summary tables and PNG charts (aggregated in Spark, drawn with matplotlib's Agg)."""

from __future__ import annotations

import html
import math
import os
from collections.abc import Iterable
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

RESOLUTION_COLOURS = {"COMMIT": "#2e7d32", "ROLLBACK": "#c62828", "DISCARDED": "#6d4c41", "PENDING": "#f9a825"}


def _table(rows: list[dict[str, Any]], empty: str = "none") -> str:
    if not rows:
        return f"<p><em>{html.escape(empty)}</em></p>"
    head = "".join(f"<th>{html.escape(str(k))}</th>" for k in rows[0])
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape('' if v is None else str(v))}</td>" for v in r.values()) + "</tr>"
        for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _resolution_chart(summary: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary["by_group_topic"]
    labels = [f"{r['producer_group']}\n{r['real_topic']}" for r in rows] or ["(none)"]
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(labels)), 4))
    bottom = [0] * len(labels)
    for res, colour in RESOLUTION_COLOURS.items():
        values = [int(r.get(res, 0) or 0) for r in rows] or [0]
        ax.bar(labels, values, bottom=bottom, label=res, color=colour)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_ylabel("transactions")
    ax.set_title("Resolutions per producer group and topic")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def latency_buckets(times: Iterable[tuple[str, int | None, int]]) -> list[tuple[str, int, int]]:
    """The latency chart's counts, (resolution, bucket, transactions), from (resolution, time_to_resolution_ms, how
    many transactions took it) as the audit's pass hands them back: bucket ``b`` holds the times in
    ``[10^(b/4), 10^((b+1)/4))`` ms (four per decade; times under 1 ms in bucket 0), null times left out. The same
    counts as :func:`spark_latency_buckets` over ``audit.parquet``, with no Spark job."""
    counted: dict[tuple[str, int], int] = {}
    for resolution, ms, count in times:
        if ms is None:
            continue
        key = (resolution, math.floor(math.log10(max(ms, 1)) * 4))
        counted[key] = counted.get(key, 0) + count
    return sorted((r, b, n) for (r, b), n in counted.items())


def spark_latency_buckets(audit: DataFrame) -> list[tuple[str, int, int]]:
    """:func:`latency_buckets` counted by Spark over the audit's rows (only the bucket counts come to the driver)."""
    bucket = F.floor(F.log10(F.greatest(F.col("time_to_resolution_ms"), F.lit(1))) * 4).cast("int")
    rows = (
        audit.filter(F.col("time_to_resolution_ms").isNotNull())
        .groupBy("resolution", bucket.alias("b"))
        .count()
        .collect()
    )
    return sorted((r["resolution"], int(r["b"]), int(r["count"])) for r in rows)


def _latency_chart(counts: list[tuple[str, int, int]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # A histogram: one bar per bucket [10^(b/4), 10^((b+1)/4)) ms, the resolutions stacked in it.
    fig, ax = plt.subplots(figsize=(7, 4))
    buckets = sorted({b for _r, b, _n in counts})
    bottom = dict.fromkeys(buckets, 0)
    for res, colour in RESOLUTION_COLOURS.items():
        by_bucket = {b: n for r, b, n in counts if r == res}
        if not by_bucket:
            continue
        lefts = [10 ** (b / 4) for b in buckets]
        widths = [10 ** ((b + 1) / 4) - 10 ** (b / 4) for b in buckets]
        heights = [by_bucket.get(b, 0) for b in buckets]
        ax.bar(lefts, heights, width=widths, bottom=[bottom[b] for b in buckets], align="edge", label=res,
               color=colour, edgecolor="white", linewidth=0.5)  # fmt: skip
        for b in buckets:
            bottom[b] += by_bucket.get(b, 0)
    ax.set_xscale("log")
    ax.yaxis.get_major_locator().set_params(integer=True)  # counts of transactions
    ax.set_xlabel("time from prepare to decision (ms, log scale)")
    ax.set_ylabel("transactions")
    ax.set_title("Time to resolution")
    if counts:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_report(
    spark: SparkSession,
    audit: DataFrame,
    anomaly_rows: DataFrame | None,
    summary: dict[str, Any],
    out_dir: str,
    latency: list[tuple[str, int, int]] | None = None,
) -> str:
    """Write ``report.html`` with ``resolutions.png`` and ``latency.png`` beside it; returns the HTML path.
    ``latency``: the chart's counts (:func:`latency_buckets`) when the caller has them, else Spark counts them;
    ``anomaly_rows``: None when the audit found none (no query for an empty sample)."""
    _resolution_chart(summary, os.path.join(out_dir, "resolutions.png"))
    _latency_chart(spark_latency_buckets(audit) if latency is None else latency, os.path.join(out_dir, "latency.png"))
    sample = (
        []
        if anomaly_rows is None
        else [r.asDict() for r in anomaly_rows.orderBy("anomaly", "half_commit_log_offset").limit(50).collect()]
    )
    totals = [{"resolution": k, "transactions": v} for k, v in summary["by_resolution"].items()]
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>txmq transaction audit</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse;margin-bottom:1.5em}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:left}} th{{background:#eee}}</style></head><body>
<h1>Transaction audit</h1>
<p>Store: <code>{html.escape(summary["store"])}</code> &middot; {summary["transactions"]} transactions</p>
<h2>Resolutions</h2>{_table(totals)}
<img src="resolutions.png" alt="resolutions per group and topic">
{_table(summary["by_group_topic"])}
<h2>Time to resolution</h2>{_table(summary["latency_ms"], "no resolved transactions")}
<img src="latency.png" alt="time to resolution">
<h2>Oldest in-doubt transactions</h2>{_table(summary["oldest_in_doubt"], "no transaction is in doubt")}
<h2>Anomalies</h2>{_table([{"anomaly": k, "count": v} for k, v in summary["anomalies"].items()], "none found")}
{_table(sample, "")}
</body></html>
"""
    path = os.path.join(out_dir, "report.html")
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
    return path
