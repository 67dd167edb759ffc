"""The gRPC door's server: a ``grpc.aio`` server on h2c (plaintext HTTP/2) in the broker's event loop, serving
:class:`~txmq.door_grpc.service.MessagingDoor` on ``grpcListenPort``.

**Accepting calls.** ``grpc.aio``'s server loop keeps one request for a new call outstanding per method and asks for
the next only after the previous one came back through gRPC's completion-queue thread and the event loop. So however
many calls a client pipelines on its connection, they are taken one per round trip between those two threads, and
on a busy machine (each hand-over waits for a time slice) that round trip, not the broker's work, set the gRPC door's
pace: at 128 in flight only about 18 calls were ever in the door at a time. :class:`_Acceptors` keeps more requests
outstanding for the busy methods and hands each accepted call to ``grpc.aio``'s own per-call handling
(``_handle_unary_unary_rpc``/``_handle_unary_stream_rpc`` under ``_schedule_rpc_coro``, as its loop does once it
has looked the handler up), so calls are served exactly as before, only taken in bunches. That reaches into
``grpc._cython.cygrpc``'s private functions; when their signatures are not the ones this was written against, the
door logs it and serves with ``grpc.aio``'s loop alone (slower, same behaviour).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

from txmq.door_grpc.pb import service_pb2
from txmq.door_grpc.service import Malformed, MessagingDoor

log = logging.getLogger("txmq.door_grpc")

# Room above the largest body for the rest of a SendMessage request, so that a body just over the limit gets
# MESSAGE_BODY_TOO_LARGE from the door rather than RESOURCE_EXHAUSTED from gRPC.
REQUEST_OVERHEAD_BYTES = 1 << 20
SHUTDOWN_GRACE_SECONDS = 1.0
SERVICE = "apache.rocketmq.v2.MessagingService"
# Extra outstanding requests for new calls, per method (beyond grpc.aio's own one). Sends, acks and transaction ends
# come pipelined from many producer/consumer threads; the rest are rare or long-lived.
EXTRA_ACCEPTS = {
    "SendMessage": 64,
    "AckMessage": 16,
    "EndTransaction": 16,
    "ChangeInvisibleDuration": 8,
    "ReceiveMessage": 8,
}


class GrpcDoor:
    def __init__(self, door: MessagingDoor, *, host: str, port: int, max_message_size: int) -> None:
        self.door = door
        self.host = host
        self.port = port
        self.max_request_bytes = max_message_size + REQUEST_OVERHEAD_BYTES
        self._server: grpc.aio.Server | None = None
        self._acceptors: _Acceptors | None = None

    async def start(self) -> int:
        """Listen; returns the port (the one picked when ``port`` is 0)."""
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", self.max_request_bytes),
                ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", 0),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
            ]
        )
        handlers = method_handlers(self.door)
        # Registered methods: the gRPC core matches a call to its method, and _Acceptors can ask for calls of one.
        server.add_registered_method_handlers(SERVICE, handlers)
        address = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
        try:
            port = server.add_insecure_port(address)
        except RuntimeError as exc:  # grpc raises when the address is taken
            port, problem = 0, str(exc)
        else:
            problem = "address in use?"
        if port == 0:
            raise OSError(f"the gRPC door cannot listen on {address} ({problem}); grpcListenPort=0 turns it off")
        await server.start()
        self._server = server
        self.port = port
        self._acceptors = _Acceptors.start(server, handlers, EXTRA_ACCEPTS)
        return port

    @property
    def accepting_in_bunches(self) -> bool:
        """Whether the extra acceptors run (False: this grpcio's internals differ; grpc.aio's loop alone serves)."""
        return self._acceptors is not None

    async def close(self) -> None:
        if self._server is not None:
            await self._server.stop(SHUTDOWN_GRACE_SECONDS)
            self._server = None
        if self._acceptors is not None:
            await self._acceptors.close()
            self._acceptors = None


class _Acceptors:
    """Extra requests for new calls outstanding in the gRPC core, each accepted call handed to grpc.aio's own
    per-call coroutine (see the module's docstring)."""

    def __init__(self, core: Any, cygrpc: Any) -> None:
        self.core = core
        self.cygrpc = cygrpc
        self.loop = asyncio.get_running_loop()
        self.tasks: set[asyncio.Task[Any]] = set()  # the calls they took (the loop holds only weak references)
        self.acceptors: list[asyncio.Task[Any]] = []

    @classmethod
    def start(
        cls, server: grpc.aio.Server, handlers: dict[str, grpc.RpcMethodHandler], extra: dict[str, int]
    ) -> _Acceptors | None:
        try:
            from grpc._cython import cygrpc

            core = server._server  # type: ignore[attr-defined]
            expected = {
                cygrpc._handle_unary_unary_rpc: "method_handler rpc_state loop",
                cygrpc._handle_unary_stream_rpc: "method_handler rpc_state loop",
                cygrpc._schedule_rpc_coro: "rpc_coro rpc_state loop method_name",
                type(core)._request_registered_call: "self method",
            }
            for function, parameters in expected.items():
                if " ".join(inspect.signature(function).parameters) != parameters:
                    raise TypeError(f"{function.__name__}{inspect.signature(function)}")
            acceptors = cls(core, cygrpc)
        except Exception as exc:  # another grpcio: serve with grpc.aio's own loop
            log.info("gRPC door: grpc.aio's loop alone accepts calls (%s: %s)", type(exc).__name__, exc)
            return None
        for method, count in extra.items():
            handler = handlers[method]
            if handler.request_streaming:
                continue  # (none of the busy methods streams requests; Telemetry keeps grpc.aio's loop alone)
            serve = cygrpc._handle_unary_stream_rpc if handler.response_streaming else cygrpc._handle_unary_unary_rpc
            for _ in range(count):
                accept = acceptors._accept(f"/{SERVICE}/{method}", handler, serve)
                acceptors.acceptors.append(acceptors.loop.create_task(accept, name="txmq-grpc-accept"))
        return acceptors

    async def _accept(self, method: str, handler: grpc.RpcMethodHandler, serve: Callable[..., Any]) -> None:
        """Take calls of one method. Each goes straight to grpc.aio's per-call coroutine of its kind (what
        ``_handle_rpc`` does after looking up the handler, which is known here, and building the invocation metadata
        for interceptors, which the door has none of), under ``_schedule_rpc_coro`` (cancellation, the call's end)."""
        method_bytes = method.encode()
        while self.core.is_running():
            try:
                rpc_state = await self.core._request_registered_call(method_bytes)
            except Exception:  # the server is shutting down (the core fails outstanding requests)
                return
            call = serve(handler, rpc_state, self.loop)
            task = self.loop.create_task(self.cygrpc._schedule_rpc_coro(call, rpc_state, self.loop, method))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def close(self) -> None:
        for task in self.acceptors:
            task.cancel()
        await asyncio.gather(*self.acceptors, *self.tasks, return_exceptions=True)


def _tolerant(message_class: type[Message]) -> Callable[[bytes], Any]:
    """A request parser that hands a malformed request to the method as :class:`Malformed` (answered with
    BAD_REQUEST in the RPC's own response) instead of failing the call with gRPC's UNKNOWN."""
    name = message_class.DESCRIPTOR.full_name

    def parse(data: bytes) -> Any:
        try:
            return message_class.FromString(data)
        except DecodeError as exc:
            return Malformed(f"the request is not a valid {name}: {exc}")

    return parse


def method_handlers(door: MessagingDoor) -> dict[str, grpc.RpcMethodHandler]:
    """``apache.rocketmq.v2.MessagingService``'s methods by name, as the generated registration builds them, but with
    tolerant request parsing."""
    service = service_pb2.DESCRIPTOR.services_by_name["MessagingService"]
    handlers = {}
    for method in service.methods:
        parse = _tolerant(GetMessageClass(method.input_type))
        serialize = GetMessageClass(method.output_type).SerializeToString
        behaviour = getattr(door, method.name)
        if method.client_streaming and method.server_streaming:
            make = grpc.stream_stream_rpc_method_handler
        elif method.server_streaming:
            make = grpc.unary_stream_rpc_method_handler
        elif method.client_streaming:
            make = grpc.stream_unary_rpc_method_handler
        else:
            make = grpc.unary_unary_rpc_method_handler
        handlers[method.name] = make(behaviour, request_deserializer=parse, response_serializer=serialize)
    return handlers
