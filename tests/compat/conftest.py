"""Fixtures of the RocketMQ 5.x (gRPC) client tests: one `txmq dev` with its gRPC door, shared by a module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.cluster_harness import DevCluster
from tests.conftest import TEST_BROKER_CONF

# Short retry back-offs (levels 3 and 4: 1 s), and levels up to 5 s for delivery times.
GRPC_CONF = {
    **TEST_BROKER_CONF,
    "messageDelayLevel": "1s 1s 1s 1s 3s 5s 10s",
    "minInvisibleTimeMillsForRecv": "1000",
    "grpcPushLongPollingMills": "3000",  # a push consumer's close waits for its pending receive
}


@pytest.fixture(scope="module")
def grpc_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    cluster = DevCluster(tmp_path_factory.mktemp("txmq-grpc"), dict(GRPC_CONF)).start()
    yield cluster
    cluster.stop()
