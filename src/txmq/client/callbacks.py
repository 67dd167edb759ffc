"""The one rule for calling user code that may be a plain function or ``async def`` (listeners).

From the event loop (:func:`call_user`): an ``async def`` callable is awaited on the loop; a plain one runs in a
thread (the caller's executor) so that it may block. From a plain thread (:func:`call_user_blocking`): the callable
runs in that thread. Either way, an awaitable that a plain function returns is awaited too.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

# Callables already classified (bench: deciding per call showed up in the transactional send path). A bound
# method is a new object per attribute access, so its function is the key; bounded, since a listener may hand out
# a new callable per access.
_async_kind: dict[Any, bool] = {}
_KIND_CACHE_MAX = 64


def is_async_callable(fn: Any) -> bool:
    """True for ``async def`` functions and methods, partials of them, and objects with an ``async def __call__``."""
    key = getattr(fn, "__func__", fn)
    try:
        return _async_kind[key]
    except KeyError:
        pass
    except TypeError:  # an unhashable callable: decide every time
        return _decide(fn)
    kind = _decide(fn)
    if len(_async_kind) >= _KIND_CACHE_MAX:
        _async_kind.clear()
    _async_kind[key] = kind
    return kind


def _decide(fn: Any) -> bool:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


async def call_user(fn: Callable[..., Any], *args: Any, executor: concurrent.futures.Executor | None = None) -> Any:
    """``fn(*args)`` from the event loop: ``async def`` on the loop, a plain function in ``executor`` (None: the
    loop's default executor)."""
    if is_async_callable(fn):
        result = await fn(*args)
    else:
        result = await asyncio.get_running_loop().run_in_executor(executor, functools.partial(fn, *args))
    if inspect.isawaitable(result):
        result = await result
    return result


def call_user_blocking(fn: Callable[..., Any], *args: Any, run: Callable[[Awaitable[Any]], Any]) -> Any:
    """``fn(*args)`` in this (non-loop) thread; an awaitable it returns (``async def``) is finished by ``run``."""
    result = fn(*args)
    if inspect.isawaitable(result):
        result = run(result)
    return result
