"""The audit's HTML report as people look at it: opened in a real headless Chromium, both charts drawn, the tables
there with what the audit found (issue 22)."""

# ruff: noqa: E402  (txmq.spark imports pyspark: the skip must come first)
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

for _module in ("pyspark", "pyarrow"):
    pytest.importorskip(_module, reason="pyspark/pyarrow are not installed: pip install -e '.[spark]' (.ci/run does)")

from selenium.webdriver.common.by import By

from monitor.browser import browser, shot  # noqa: F401  (the fixture)
from txmq.spark.audit import run_audit


def _tables(driver: Any) -> list[tuple[list[str], list[list[str]]]]:
    """Every table of the page: its header cells and its rows' cells, as the browser shows them."""
    out = []
    for table in driver.find_elements(By.TAG_NAME, "table"):
        rows = table.find_elements(By.TAG_NAME, "tr")
        head = [th.text for th in rows[0].find_elements(By.TAG_NAME, "th")]
        body = [[td.text for td in row.find_elements(By.TAG_NAME, "td")] for row in rows[1:]]
        out.append((head, body))
    return out


def test_the_audit_report_in_a_browser(spark: Any, planted_store: str, browser: Any, tmp_path: Path) -> None:  # noqa: F811
    out = tmp_path / "audit-out"
    result = run_audit(spark, planted_store, str(out))
    assert result.report is not None and result.anomalies > 0
    summary = json.loads((out / "summary.json").read_text())
    browser.get((out / "report.html").as_uri())
    shot(browser, "audit-report")

    # Both charts are drawn: the images loaded, with a real size.
    images = browser.execute_script(
        "return Array.from(document.images).map(i => [i.getAttribute('alt'), i.complete, i.naturalWidth, "
        "i.naturalHeight])"
    )
    assert {alt for alt, *_ in images} == {"resolutions per group and topic", "time to resolution"}
    for alt, complete, width, height in images:
        assert complete and width >= 300 and height >= 200, (alt, complete, width, height)

    # The tables: totals per resolution, per group and topic, the latency percentiles, the in-doubt transactions,
    # the anomaly counts and a sample of the anomalies themselves.
    tables = {tuple(head): body for head, body in _tables(browser)}
    totals = {row[0]: int(row[1]) for row in tables["resolution", "transactions"]}
    assert totals == summary["by_resolution"]
    latency_head = ("resolution", "count", "p50_ms", "p90_ms", "p99_ms", "max_ms")
    assert [row[0] for row in tables[latency_head]] == [r["resolution"] for r in summary["latency_ms"]]
    assert {row[0]: int(row[1]) for row in tables["anomaly", "count"]} == summary["anomalies"]
    sample = next(body for head, body in tables.items() if "anomaly" in head and "uniq_key" in head)
    sample_head = next(head for head in tables if "anomaly" in head and "uniq_key" in head)
    keys = {row[sample_head.index("uniq_key")] for row in sample}
    assert {"NO_DELIVERY", "DOUBLE", "ROLLED_BACK_BUT_DELIVERED"} <= keys
    in_doubt = next(body for head, body in tables.items() if "age_ms" in head or "prepared_at" in head)
    assert len(in_doubt) == len(summary["oldest_in_doubt"]) > 0
