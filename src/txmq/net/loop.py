"""Event-loop selection: uvloop when it is installed, asyncio's default loop otherwise."""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger("txmq.net")


def install_event_loop() -> str:
    """Make new event loops uvloop loops if uvloop is importable. Returns ``"uvloop"`` or ``"asyncio"``.

    Call it before ``asyncio.run`` (CLI entry points do); tests keep asyncio's default loop.
    """
    try:
        import uvloop
    except ImportError:
        log.debug("uvloop not installed; using asyncio's default event loop")
        return "asyncio"
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return "uvloop"
