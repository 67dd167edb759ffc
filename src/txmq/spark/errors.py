"""One-line errors at the Spark API boundary.

Sources raise :class:`TxmqSparkError`; Spark wraps it (``AnalysisException``, ``PythonException``,
``StreamingQueryException``) with a Python traceback and often a Java one. :func:`clear_errors` turns any of those
back into the original one-line message.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

from txmq.errors import TxmqError

_MARKER = re.compile(r"TxmqSparkError: (?:\[TXMQ\] )?([^\n]+)")


class TxmqSparkError(TxmqError):
    """A bad option, an unreachable broker, an unknown topic, an unreadable store: one line a person can act on."""


def extract_message(exc: BaseException) -> str | None:
    """The TxmqSparkError message buried in a Spark exception, or None."""
    texts = [str(exc)]
    for attr in ("desc", "_desc", "message"):
        value = getattr(exc, attr, None)
        if isinstance(value, str):
            texts.append(value)
    cause = exc.__cause__ or exc.__context__
    if cause is not None:
        texts.append(str(cause))
    for text in texts:
        found = _MARKER.search(text)
        if found:
            return found.group(1).strip()
    return None


@contextlib.contextmanager
def clear_errors() -> Iterator[None]:
    """Re-raise errors from txmq's Spark sources as a one-line :class:`TxmqSparkError` (no Java stack trace)."""
    try:
        yield
    except TxmqSparkError:
        raise
    except Exception as exc:
        message = extract_message(exc)
        if message is None:
            raise
        raise TxmqSparkError(message) from None
