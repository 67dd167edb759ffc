"""How the campaign reads a broker's log for unhandled exceptions: one line per record followed by a traceback (or
a CRITICAL one), with the traceback's last exception line, so that a failed CI run says what went wrong."""

from __future__ import annotations

from txmq.chaos.fuzz import unhandled_lines

LOG = """\
2026-11-28 05:33:59,001 INFO txmq.broker: started
2026-11-28 05:34:00,818 ERROR txmq.net: handler failed on request code 34 (opaque 46812) from 127.0.0.1:37448
Traceback (most recent call last):
  File "/x/admin.py", line 139, in heartbeat
    sub = self.subscriptions.get(group) if group else None
OSError: [Errno 28] No space left on device

2026-11-28 05:34:01,000 WARNING txmq.net: request code 10 from 127.0.0.1:1 refused, the disk is full: x
2026-11-28 05:34:02,000 ERROR asyncio: Task exception was never retrieved
Traceback (most recent call last):
  File "/x/a.py", line 1, in f
KeyError: 'a'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/x/a.py", line 3, in f
ValueError: the last one
2026-11-28 05:34:03,000 CRITICAL txmq.broker: the store failed
2026-11-28 05:34:04,000 INFO txmq.broker: stopped
"""


def test_each_unhandled_exception_is_one_line_with_its_cause() -> None:
    assert unhandled_lines(LOG) == [
        "2026-11-28 05:34:00,818 ERROR txmq.net: handler failed on request code 34 (opaque 46812) from "
        "127.0.0.1:37448 => OSError: [Errno 28] No space left on device",
        "2026-11-28 05:34:02,000 ERROR asyncio: Task exception was never retrieved => ValueError: the last one",
        "2026-11-28 05:34:03,000 CRITICAL txmq.broker: the store failed",
    ]


def test_a_quiet_log_has_none() -> None:
    assert unhandled_lines("2026-11-28 05:34:01,000 WARNING txmq.net: refused, the disk is full: x\n") == []
