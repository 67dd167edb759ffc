"""txmq's formats and jobs through Spark Connect (``sc://``), against a real Connect server.

One server for the module (pyspark's sbin/start-connect-server.sh, its own Spark on local[2]); its Python workers run
a virtualenv holding only the executor requirements (no txmq). The client is a separate process, as a user's is (a
Connect session marks its whole process as Connect mode, which the suite's classic session could not share): it
registers the formats on the remote session, which ships txmq to the server as a zip artifact.
"""

# ruff: noqa: E402  (txmq.spark imports pyspark: the skip must come first)
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

for _module in ("pyspark", "pyarrow", "grpc", "google.rpc", "zstandard"):
    pytest.importorskip(
        _module, reason="Spark Connect's client is not installed: pip install -e '.[spark-connect]' (.ci/run does)"
    )

import pyarrow.parquet as pq

from txmq.client import Message
from txmq.client.sync import Producer
from txmq.spark.local_cluster import ConnectServer
from txmq.spark.synthetic import Plan, write_transactions

pytestmark = pytest.mark.timeout(600)
SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: pytest.TempPathFactory, executor_python: str) -> Iterator[ConnectServer]:
    conf = {
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.driver.extraJavaOptions": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1",
    }
    server = ConnectServer(tmp_path_factory.mktemp("connect"), executor_python, conf=conf, daemon_memory="1g")
    server.start()
    yield server
    server.stop()


def client(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """A client process (the test's Python, with this checkout's txmq)."""
    env = dict(os.environ, PYTHONPATH=SRC)
    env.pop("SPARK_CONNECT_MODE_ENABLED", None)
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=400)


def explain(done: subprocess.CompletedProcess[str], server: ConnectServer) -> str:
    log = "\n".join(server.daemon.lines[-60:]) if server.daemon else ""
    return f"exit {done.returncode}\nstdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-5000:]}\nserver:\n{log}"


def test_batch_source_through_spark_connect(connect_server: ConnectServer, txmq_cluster: Any, tmp_path: Path) -> None:
    ns = txmq_cluster.namesrv_addr
    with Producer("ConnectPG", ns) as producer:
        sent = [producer.send(Message("ConnectTopic", f"m{i}".encode(), keys=f"k{i}")).msg_id for i in range(12)]
    script = textwrap.dedent(
        f"""
        import json
        from pyspark.sql import SparkSession
        from txmq.spark import is_connect, register
        spark = SparkSession.builder.remote({connect_server.url!r}).getOrCreate()
        assert is_connect(spark)
        register(spark)
        register(spark)  # a second time: the same artifact, no error
        df = spark.read.format("txmq").option("namesrv", {ns!r}).option("topics", "ConnectTopic").load()
        rows = df.select("msg_id", "keys", "body").collect()
        print(json.dumps(sorted([r.msg_id, r.keys, bytes(r.body).decode()] for r in rows)))
        """
    )
    done = client("-c", script, cwd=tmp_path)
    assert done.returncode == 0, explain(done, connect_server)
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(r[0] for r in rows) == sorted(sent)
    assert sorted((r[1], r[2]) for r in rows) == sorted((f"k{i}", f"m{i}") for i in range(12))


def test_audit_through_spark_connect(connect_server: ConnectServer, tmp_path: Path) -> None:
    store = tmp_path / "store"
    write_transactions(str(store), Plan(commit=5, rollback=2, discard=1, pending=2), segment_size=1 << 20)
    out = tmp_path / "out"
    done = client(
        "-m",
        "txmq",
        "spark",
        "audit",
        "--remote",
        connect_server.url,
        "--store",
        str(store),
        "--out",
        str(out),
        cwd=tmp_path,
    )
    assert done.returncode == 0, explain(done, connect_server)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["by_resolution"] == {"COMMIT": 5, "ROLLBACK": 2, "DISCARDED": 1, "PENDING": 2}
    assert summary["anomalies"] == {}
    assert pq.read_table(out / "audit.parquet").num_rows == 10
    assert (out / "report.html").exists() and (out / "resolutions.png").read_bytes()[:4] == b"\x89PNG"
