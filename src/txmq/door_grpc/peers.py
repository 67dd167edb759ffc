"""The other brokers of the cluster, as 5.x clients must see them: their queues of a topic (from the name server's
route) at their gRPC endpoints (which each broker publishes in the name server's KV config, namespace
``TXMQ_GRPC_ENDPOINTS``, keyed by its 4.x address)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import orjson

from txmq.door_grpc.pb import definition_pb2 as d
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.frame import RemotingCommand
from txmq.protocol.route import BrokerData, QueueData
from txmq.protocol.topics import is_readable, is_writable

log = logging.getLogger("txmq.door_grpc")

KV_NAMESPACE = "TXMQ_GRPC_ENDPOINTS"
ENDPOINT_CACHE_SECONDS = 30.0
ACCEPTED_TYPES = (d.NORMAL, d.FIFO, d.DELAY, d.TRANSACTION)

Ask = Callable[[RemotingCommand], Awaitable[RemotingCommand | None]]


def endpoints_of(host_port: str) -> d.Endpoints:
    host, _, port = host_port.rpartition(":")
    scheme = d.IPv4 if host.replace(".", "").isdigit() else d.DOMAIN_NAME
    return d.Endpoints(scheme=scheme, addresses=[d.Address(host=host, port=int(port))])


def queue_permission(queue_id: int, read_queue_nums: int, write_queue_nums: int, perm: int) -> int:
    """A queue's 5.x permission from RocketMQ's queue counts and permission bits."""
    readable = is_readable(perm) and queue_id < read_queue_nums
    writable = is_writable(perm) and queue_id < write_queue_nums
    return {(True, True): d.READ_WRITE, (True, False): d.READ, (False, True): d.WRITE}.get((readable, writable), d.NONE)


class ClusterPeers:
    def __init__(self, *, broker_name: str, ask: Ask, monotonic: Callable[[], float]) -> None:
        self.broker_name = broker_name
        self.ask = ask
        self.monotonic = monotonic
        self._endpoints: dict[str, tuple[float, str | None]] = {}

    async def _grpc_endpoint(self, broker_addr: str) -> str | None:
        cached = self._endpoints.get(broker_addr)
        if cached is not None and self.monotonic() - cached[0] < ENDPOINT_CACHE_SECONDS:
            return cached[1]
        ext = {"namespace": KV_NAMESPACE, "key": broker_addr}
        resp = await self.ask(RemotingCommand.request(RequestCode.GET_KV_CONFIG, ext))
        value = resp.ext_fields.get("value") if resp is not None and resp.code == ResponseCode.SUCCESS else None
        self._endpoints[broker_addr] = (self.monotonic(), value)
        return value

    async def queues(self, topic: str) -> list[d.MessageQueue]:
        """The topic's queues on the other brokers that serve a gRPC door (none when the name server is away)."""
        resp = await self.ask(RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}))
        if resp is None or resp.code != ResponseCode.SUCCESS or not resp.body:
            return []
        try:
            route = orjson.loads(resp.body)
            brokers = [BrokerData.from_json(b) for b in route.get("brokerDatas") or []]
            queue_data = {q.broker_name: q for q in (QueueData.from_json(x) for x in route.get("queueDatas") or [])}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("the name server's route of %s is unreadable: %s", topic, exc)
            return []
        out: list[d.MessageQueue] = []
        for broker in brokers:
            q = queue_data.get(broker.broker_name)
            master = broker.master_addr()
            if broker.broker_name == self.broker_name or q is None or master is None:
                continue
            endpoint = await self._grpc_endpoint(master)
            if endpoint is None:
                continue  # that broker has no gRPC door
            grpc_broker = d.Broker(name=broker.broker_name, id=0, endpoints=endpoints_of(endpoint))
            for queue_id in range(max(q.read_queue_nums, q.write_queue_nums)):
                out.append(
                    d.MessageQueue(
                        topic=d.Resource(name=topic),
                        id=queue_id,
                        permission=queue_permission(queue_id, q.read_queue_nums, q.write_queue_nums, q.perm),
                        broker=grpc_broker,
                        accept_message_types=ACCEPTED_TYPES,
                    )
                )
        return out
