"""Shared fixtures: real txmq processes on loopback."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from cluster_harness import DevCluster, ExtraBroker
from db_harness import PostgresServer, postgres_bin_dir
from txmq.testing import small_tmpfs, tmpfs_unavailable

# Property tests assert behaviour, never speed: no per-example deadline and no "too slow" health check, which a
# loaded 2-core machine trips (a 319 ms example against Hypothesis's 200 ms default failed a CI-like run).
settings.register_profile("txmq", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("txmq")

# A short retry table so that retry and DLQ tests take seconds.
TEST_BROKER_CONF = {
    "messageDelayLevel": "1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s",
    "transactionTimeOut": "1000",
    "transactionCheckInterval": "1000",
    # 16 MiB segments: a test cluster must not reserve RocketMQ's 1 GiB of disk for a few kilobytes of messages.
    "mappedFileSizeCommitLog": str(16 * 1024 * 1024),
}


@pytest.fixture(scope="session")
def txmq_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    """One ``txmq dev`` process shared by the tests that do not restart or kill it."""
    cluster = DevCluster(tmp_path_factory.mktemp("txmq-session"), dict(TEST_BROKER_CONF)).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[object]:
    """A factory of private clusters, for tests that kill or restart the broker."""
    made: list[DevCluster] = []

    def make(conf: dict[str, str] | None = None, name: str = "cluster") -> DevCluster:
        cluster = DevCluster(tmp_path / name, {**TEST_BROKER_CONF, **(conf or {})})
        made.append(cluster)
        return cluster.start()

    yield make
    for cluster in made:
        cluster.kill()


@pytest.fixture
def add_broker(tmp_path: Path) -> Iterator[object]:
    """Starts one more broker process (``txmq broker``) in a running cluster, registered with its name server."""
    made: list[ExtraBroker] = []

    def add(cluster: DevCluster, broker_name: str, conf: dict[str, str] | None = None) -> ExtraBroker:
        extra = ExtraBroker(
            tmp_path / broker_name,
            {**TEST_BROKER_CONF, "brokerName": broker_name, "brokerIP1": "127.0.0.1", **(conf or {})},
            namesrv_port=cluster.namesrv_port,
        )
        made.append(extra)
        return extra.start()

    yield add
    for broker in made:
        broker.kill()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A private PostgreSQL server for the session, started on first use. Without the PostgreSQL binaries or psycopg
    the tests that need it skip, unless TXMQ_REQUIRE_POSTGRES=1 (as in .ci/run) makes that a failure."""
    bin_dir = postgres_bin_dir()
    missing = "PostgreSQL binaries (initdb, pg_ctl)" if bin_dir is None else None
    if importlib.util.find_spec("psycopg") is None:
        missing = "psycopg (pip install -e '.[postgres]')"
    if missing or bin_dir is None:
        if os.environ.get("TXMQ_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"TXMQ_REQUIRE_POSTGRES=1 but {missing} is not installed")
        pytest.skip(f"{missing} not installed")
    server = PostgresServer(bin_dir).start()
    yield server
    server.stop()


@pytest.fixture
def postgres_db(postgres_server: PostgresServer) -> str:
    """The conninfo of a new, empty database on the session's PostgreSQL server."""
    return postgres_server.create_database()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """An empty 8 MiB tmpfs (mounting needs root: skipped without it)."""
    why_not = tmpfs_unavailable()
    if why_not:
        pytest.skip(why_not)
    with small_tmpfs(tmp_path / "disk", 8) as where:
        yield where
