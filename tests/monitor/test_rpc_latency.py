"""RpcLatency's wrapper records each request once, whichever way its handler answers: a response at once, a future
(recorded as long polling, when it is done), a Pending (a send: when settled, not long polling), a coroutine (when
awaited), or nothing (a oneway request)."""

from __future__ import annotations

import asyncio

from txmq.broker.rpc_latency import RPC_BUCKETS_MS, RpcLatency
from txmq.net.pending import Pending
from txmq.protocol.frame import RemotingCommand

CODE = 310


def counts(rpc: RpcLatency) -> dict[tuple[int, int, bool, bool], float]:
    return {key: sum(row[: len(RPC_BUCKETS_MS) + 1]) for key, row in rpc.table.items()}


def test_each_kind_of_answer_is_recorded_once() -> None:
    async def main() -> None:
        rpc = RpcLatency()
        cmd = RemotingCommand(CODE, opaque=1)
        oneway = RemotingCommand(CODE, opaque=2, flag=2)
        loop = asyncio.get_running_loop()
        pending: asyncio.Future[RemotingCommand] = loop.create_future()

        async def later(_conn: object, c: RemotingCommand) -> RemotingCommand:
            await asyncio.sleep(0)
            return c.response(1, "busy")

        at_once = rpc.timed(CODE, lambda _conn, c: c.response(0))
        by_future = rpc.timed(CODE, lambda _conn, _c: pending)
        by_coroutine = rpc.timed(CODE, later)
        nothing = rpc.timed(CODE, lambda _conn, _c: None)

        assert at_once(None, cmd).code == 0
        assert by_future(None, cmd) is pending
        assert counts(rpc) == {(CODE, 0, False, False): 1}  # the future is not done yet
        pending.set_result(cmd.response(17))
        await asyncio.sleep(0)
        assert (await by_coroutine(None, cmd)).code == 1
        assert nothing(None, oneway) is None
        assert counts(rpc) == {
            (CODE, 0, False, False): 1,
            (CODE, 17, True, False): 1,
            (CODE, 1, False, False): 1,
            (CODE, -1, False, True): 1,
        }
        failed: asyncio.Future[RemotingCommand] = loop.create_future()
        rpc.timed(CODE, lambda _conn, _c: failed)(None, cmd)
        failed.set_exception(RuntimeError("lost"))
        await asyncio.sleep(0)
        failed.exception()
        assert counts(rpc)[(CODE, -1, True, False)] == 1
        assert all(row[-1] >= 0.0 for row in rpc.table.values())

        stored = Pending()
        assert rpc.timed(CODE, lambda _conn, _c: stored)(None, cmd) is stored
        assert (CODE, 0, False, False) in counts(rpc) and counts(rpc)[(CODE, 0, False, False)] == 1
        stored.resolve(cmd.response(0))  # recorded at once, no loop turn
        assert counts(rpc)[(CODE, 0, False, False)] == 2
        lost = Pending()
        rpc.timed(CODE, lambda _conn, _c: lost)(None, cmd)
        lost.fail(RuntimeError("lost"))
        assert counts(rpc)[(CODE, -1, False, False)] == 1

    asyncio.run(main())
