"""The background event loop the blocking clients run on: one daemon thread per process, shared by all of them.

Blocking methods submit the async implementation's coroutine to this loop and wait for its result, so there is
exactly one implementation of every client behaviour (httpcore's approach, with a thread instead of codegen).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class Portal:
    """An event loop running in its own daemon thread, and the two ways into it from other threads."""

    def __init__(self, name: str = "txmq-client-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()
        self._ready.wait()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        self.loop.run_forever()

    def _check_thread(self) -> None:
        if threading.get_ident() == self.thread.ident:
            raise RuntimeError(
                "a blocking txmq client method was called on the client's own event-loop thread (from an async "
                "listener or a send callback?); use the asyncio API (txmq.client) there instead"
            )

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the loop; returns a thread-safe future."""
        try:
            self._check_thread()
        except RuntimeError:
            coro.close()  # never scheduled: close it so Python does not warn that it was never awaited
            raise
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and block until it finishes; its exception is re-raised here."""
        future = self.submit(coro)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"gave up waiting after {timeout:g}s") from None

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a plain function on the loop thread (for objects that must be created or mutated there)."""
        self._check_thread()

        async def wrapper() -> T:
            return fn(*args, **kwargs)

        return asyncio.run_coroutine_threadsafe(wrapper(), self.loop).result()

    def stop(self) -> None:
        """Stop the loop and join its thread (tests; the process-wide portal just dies with the process)."""
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        if threading.get_ident() != self.thread.ident:
            self.thread.join(5)
        if not self.loop.is_running() and not self.loop.is_closed():
            self.loop.close()


_lock = threading.Lock()
_portal: Portal | None = None


def get_portal() -> Portal:
    """The process-wide portal, started on first use (and again if it was stopped)."""
    global _portal
    with _lock:
        if _portal is None or not _portal.thread.is_alive():
            _portal = Portal()
        return _portal
