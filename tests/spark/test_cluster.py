"""txmq's Spark jobs on a real Spark standalone cluster, submitted as docs/spark.md says.

One master and one worker of two cores (pyspark's own spark-class, loopback, ports of their choosing) for the module.
Executors run a virtualenv holding only the executor requirements of `txmq spark package` (no txmq, no pandas); txmq
reaches them as the package's zip on --py-files. The driver is the test's Python, which spark-submit launches.
"""

# ruff: noqa: E402  (txmq.spark imports pyspark: the skip must come first)
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

for _module in ("pyspark", "pyarrow"):
    pytest.importorskip(_module, reason="pyspark/pyarrow are not installed: pip install -e '.[spark]' (.ci/run does)")

import pyarrow.parquet as pq

from txmq.client import Message
from txmq.client.sync import Producer
from txmq.spark.local_cluster import StandaloneCluster, clean_env, spark_home
from txmq.spark.package import Package
from txmq.spark.synthetic import Plan, write_transactions

pytestmark = pytest.mark.timeout(600)

# Settings of these tests only (a small machine shared by the whole suite); docs/spark.md's command has none of them.
TEST_CONF = {
    "spark.executor.memory": "512m",
    "spark.driver.memory": "512m",
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.extraJavaOptions": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1",
    "spark.executor.extraJavaOptions": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1",
}


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    cluster = StandaloneCluster(tmp_path_factory.mktemp("standalone"), workers=1, cores=2, memory="1g")
    cluster.start()
    yield cluster
    cluster.stop()


def submit(
    cluster: StandaloneCluster, pkg: Package, executor_python: str, job_args: list[str], cwd: Path
) -> subprocess.CompletedProcess[str]:
    """docs/spark.md's spark-submit line, plus the driver's Python (the test's own) and TEST_CONF."""
    cmd = pkg.submit_command(cluster.master_url, executor_python, tuple(job_args))
    cmd[0] = str(spark_home() / "bin" / "spark-submit")
    extra = ["--conf", f"spark.pyspark.driver.python={sys.executable}"]
    for key, value in TEST_CONF.items():
        extra += ["--conf", f"{key}={value}"]
    cmd[1:1] = extra
    env = clean_env({"SPARK_LOCAL_IP": "127.0.0.1", "SPARK_CONF_DIR": str(cluster.work_dir / "conf")})
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=400)
    return done


def explain(done: subprocess.CompletedProcess[str], cluster: StandaloneCluster) -> str:
    logs = "".join(f"\n--- {p}\n{p.read_text()[-3000:]}" for p in cluster.executor_logs()[-2:])
    return f"exit {done.returncode}\nstdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-6000:]}{logs}"


def test_the_executors_python_holds_only_the_executor_requirements(executor_python: str) -> None:
    """What the other tests here prove rests on this: the executors cannot import txmq or pandas on their own."""
    for module, importable in (("txmq", False), ("pandas", False), ("pyspark", False), ("pyarrow", True)):
        done = subprocess.run([executor_python, "-c", f"import {module}"], capture_output=True, env=clean_env())
        assert (done.returncode == 0) == importable, (module, done.stderr)


def test_audit_on_a_standalone_cluster(
    standalone: StandaloneCluster, spark_package: Package, executor_python: str, tmp_path: Path
) -> None:
    plan = Plan(commit=7, rollback=3, discard=2, pending=1)
    store = tmp_path / "store"
    write_transactions(str(store), plan, segment_size=1 << 20)
    out = tmp_path / "audit-out"
    done = submit(
        standalone, spark_package, executor_python, ["audit", "--store", str(store), "--out", str(out)], tmp_path
    )
    assert done.returncode == 0, explain(done, standalone)
    assert "13 transactions" in done.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["by_resolution"] == {"COMMIT": 7, "ROLLBACK": 3, "DISCARDED": 2, "PENDING": 1}
    assert summary["anomalies"] == {}
    table = pq.read_table(out / "audit.parquet")
    assert table.num_rows == 13
    assert sorted(table.column("resolution").to_pylist()).count("COMMIT") == 7
    assert (out / "report.html").exists() and (out / "latency.png").read_bytes()[:4] == b"\x89PNG"
    # The work ran in executors of the cluster (their logs are in the worker's folder), not in the driver.
    assert standalone.executor_logs(), "no executor ran"


def test_broker_source_on_a_standalone_cluster(
    standalone: StandaloneCluster, spark_package: Package, executor_python: str, txmq_cluster: Any, tmp_path: Path
) -> None:
    """`txmq spark reconcile --namesrv`: format("txmq") read from a live broker by the cluster's executors."""
    ns = txmq_cluster.namesrv_addr
    with Producer("ClusterPG", ns) as producer:
        for order in ("o1", "o2", "o3", "o4", "o-stray"):
            producer.send(Message("ClusterOrders", json.dumps({"order_id": order}).encode(), keys=order))
        producer.send(Message("ClusterOrders", b'{"order_id": "o2"}', keys="o2"))  # o2 twice
    source = tmp_path / "orders.json"
    source.write_text("".join(json.dumps({"order_id": o}) + "\n" for o in ("o1", "o2", "o3", "o4", "o5")))
    out = tmp_path / "rec-out"
    args = ["reconcile", "--source", str(source), "--source-key", "order_id", "--topics", "ClusterOrders"]
    args += ["--key", "keys", "--namesrv", ns, "--out", str(out)]
    done = submit(standalone, spark_package, executor_python, args, tmp_path)
    assert done.returncode == 1, explain(done, standalone)  # inconsistent: exit 1 with its summary
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["source_rows"], summary["deliveries"]) == (5, 6), summary
    assert (summary["missing"], summary["unexpected"], summary["duplicates"]) == (1, 1, 1), summary
    missing = pq.read_table(out / "missing.parquet").to_pylist()
    assert [r["order_id"] for r in missing] == ["o5"]
    assert os.path.getsize(out / "unexpected.parquet") > 0
