"""Messages received through the gRPC door (pop) count in ``rocketmq_messages_out_total`` like pulled ones."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

import grpc
from prometheus_client.parser import text_string_to_metric_families
from tests.cluster_harness import free_port
from tests.door_grpc.test_door import create_group, message, receive, send

from txmq.door_grpc.pb import service_pb2_grpc
from txmq.testing import InProcessBroker


def out_counts(url: str) -> dict[tuple[str, str, str], float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in ("rocketmq_messages_out_total", "rocketmq_throughput_out_total"):
                found[(sample.name, sample.labels["topic"], sample.labels["consumer_group"])] = sample.value
    return found


async def test_pop_receives_count_as_messages_out(tmp_path: Path) -> None:
    grpc_port, metrics_port = free_port(), free_port()
    harness = InProcessBroker(
        tmp_path, grpc_listen_port=grpc_port, metrics_port=metrics_port, min_invisible_time_mills_for_recv=1000
    )
    await harness.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}")
    try:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        await create_group(harness, "PopG")
        await send(stub, message("PopT", b"one", "01C1"), message("PopT", b"two!", "01C2"))
        got = [r.message for r in await receive(stub, "PopT", "PopG", invisible_s=10) if r.HasField("message")]
        assert sorted(m.body for m in got) == [b"one", b"two!"]
        counts = await asyncio.to_thread(out_counts, f"http://127.0.0.1:{metrics_port}/metrics")
        assert counts[("rocketmq_messages_out_total", "PopT", "PopG")] == 2
        stored = counts[("rocketmq_throughput_out_total", "PopT", "PopG")]
        assert stored > len(b"one") + len(b"two!")  # whole records, as for pulls
    finally:
        await channel.close()
        await harness.stop()
