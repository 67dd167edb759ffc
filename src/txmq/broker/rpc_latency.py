"""``rocketmq_rpc_latency``'s measurement: every remoting request timed from its handler's call to its response.

Apart from :mod:`txmq.broker.metrics` (which exports the table and imports prometheus_client) because it runs on every
request: mypyc compiles this module (setup.py's ``HOT_MODULES``), so the wrapper around each handler and the callback
on each answer's future run compiled.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections.abc import Callable
from typing import Any, Final

from txmq.net.pending import Pending
from txmq.protocol.frame import RemotingCommand

# RocketMQ's rpc latency buckets, in milliseconds (RemotingMetricsManager).
RPC_BUCKETS_MS: Final = (1.0, 3.0, 5.0, 7.0, 10.0, 100.0, 1000.0, 2000.0, 3000.0)

Handler = Callable[[Any, RemotingCommand], Any]


class RpcLatency:
    """Times every remoting request from its handler's call to its response: ``rocketmq_rpc_latency``.

    Per (request code, response code, long polling, result) a list of bucket counts plus the sum; a request costs two
    clock reads, a bisect and two list updates.
    """

    def __init__(self) -> None:
        self.table: dict[tuple[int, int, bool, bool], list[float]] = {}

    def record(self, code: int, cmd: RemotingCommand, response: object, t0: float, long_polling: bool) -> None:
        ms = (time.perf_counter() - t0) * 1000.0
        key = (code, response.code if isinstance(response, RemotingCommand) else -1, long_polling, cmd.is_oneway)
        row = self.table.get(key)
        if row is None:
            row = self.table[key] = [0.0] * (len(RPC_BUCKETS_MS) + 2)
        row[bisect.bisect_left(RPC_BUCKETS_MS, ms)] += 1
        row[-1] += ms

    def timed(self, code: int, handler: Handler) -> Handler:
        """``handler``, timed: a response returned at once is recorded at once, a future's when it is done, a
        coroutine's when it has been awaited."""
        return Timed(self, code, handler)


class Timed:
    """One request code's handler, timed (a class rather than a closure: its call is the per-request path)."""

    def __init__(self, rpc: RpcLatency, code: int, handler: Handler) -> None:
        self.rpc = rpc
        self.code = code
        self.handler = handler

    def __call__(self, conn: Any, cmd: RemotingCommand) -> Any:
        t0 = time.perf_counter()
        result = self.handler(conn, cmd)
        if result is None or isinstance(result, RemotingCommand):
            self.rpc.record(self.code, cmd, result, t0, False)
            return result
        if type(result) is Pending:
            result.then(WhenAnswered(self.rpc, self.code, cmd, t0))
            return result
        if isinstance(result, asyncio.Future):
            result.add_done_callback(WhenDone(self.rpc, self.code, cmd, t0))
            return result
        return self._awaiting(cmd, result, t0)

    async def _awaiting(self, cmd: RemotingCommand, awaitable: Any, t0: float) -> Any:
        response = None
        try:
            response = await awaitable
            return response
        finally:
            self.rpc.record(self.code, cmd, response, t0, False)


class WhenDone:
    """Records a request answered through a future (a long poll, a send waiting for the store) once it is done."""

    def __init__(self, rpc: RpcLatency, code: int, cmd: RemotingCommand, t0: float) -> None:
        self.rpc = rpc
        self.code = code
        self.cmd = cmd
        self.t0 = t0

    def __call__(self, fut: asyncio.Future[Any]) -> None:
        response = None if fut.cancelled() or fut.exception() is not None else fut.result()
        self.rpc.record(self.code, self.cmd, response, self.t0, True)


class WhenAnswered:
    """Records a request answered through a :class:`~txmq.net.pending.Pending` (a send waiting for the store or a
    slave) once it is settled; not a long poll (RocketMQ labels only suspended pulls so)."""

    def __init__(self, rpc: RpcLatency, code: int, cmd: RemotingCommand, t0: float) -> None:
        self.rpc = rpc
        self.code = code
        self.cmd = cmd
        self.t0 = t0

    def __call__(self, response: Any, error: BaseException | None) -> None:
        self.rpc.record(self.code, self.cmd, None if error is not None else response, self.t0, False)
