"""Shared fixtures: real txmq processes on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster_harness import DevCluster, ExtraBroker

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
