"""A tolerant reader for the JSON dialect Java brokers write with fastjson (no IO).

Admin bodies such as ConsumeStats and TopicStatsTable are maps keyed by MessageQueue, which fastjson writes with
JSON *objects* as keys: ``{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:{...}}}``. Older name servers
also write unquoted numeric keys (``{0:"addr"}``). :func:`loads` accepts those, plus single-quoted strings, bare
identifiers and trailing commas, and is a superset of standard JSON. Object keys that are objects come back as
:class:`FrozenDict` (hashable); array keys as tuples.
"""

from __future__ import annotations

from typing import Any

import orjson

__all__ = ["FastjsonError", "FrozenDict", "loads"]


class FastjsonError(ValueError):
    """Text that is not JSON even by fastjson's relaxed rules."""


class FrozenDict(dict):  # type: ignore[type-arg]
    """A read-only, hashable dict: the value of an object used as a map key."""

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted((k, _freeze(v)) for k, v in self.items())))

    def _readonly(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("FrozenDict is read-only")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _readonly  # type: ignore[assignment]


def _freeze(value: Any) -> Any:
    if isinstance(value, dict) and not isinstance(value, FrozenDict):
        return FrozenDict(value)
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def loads(text: str | bytes | bytearray | memoryview) -> Any:
    """Parse standard JSON (fast path) or fastjson's relaxed dialect."""
    raw = bytes(text) if isinstance(text, bytearray | memoryview) else text
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FastjsonError(f"body is not UTF-8: {exc}") from None
    return _Parser(raw).parse()


_ESCAPES = {'"': '"', "'": "'", "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_WS = " \t\r\n\ufeff"
_BARE_END = set(_WS) | set(",:]}[{")


class _Parser:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self.n = len(text)

    def fail(self, what: str) -> FastjsonError:
        snippet = self.s[max(0, self.i - 20) : self.i + 20]
        return FastjsonError(f"{what} at character {self.i} (near {snippet!r})")

    def ws(self) -> None:
        s, i, n = self.s, self.i, self.n
        while i < n and s[i] in _WS:
            i += 1
        self.i = i

    def parse(self) -> Any:
        value = self.value()
        self.ws()
        if self.i != self.n:
            raise self.fail("unexpected text after the JSON value")
        return value

    def value(self) -> Any:
        self.ws()
        if self.i >= self.n:
            raise self.fail("unexpected end of input")
        c = self.s[self.i]
        if c == "{":
            return self.obj()
        if c == "[":
            return self.arr()
        if c in "\"'":
            return self.string(c)
        return self.bare()

    def obj(self) -> dict[Any, Any]:
        self.i += 1
        out: dict[Any, Any] = {}
        while True:
            self.ws()
            if self.i >= self.n:
                raise self.fail("unterminated object")
            if self.s[self.i] == "}":
                self.i += 1
                return out
            key = _freeze(self.value())
            self.ws()
            if self.i >= self.n or self.s[self.i] != ":":
                raise self.fail("expected ':' after an object key")
            self.i += 1
            out[key] = self.value()
            self.ws()
            if self.i < self.n and self.s[self.i] == ",":
                self.i += 1
            elif self.i < self.n and self.s[self.i] == "}":
                continue
            else:
                raise self.fail("expected ',' or '}' in an object")

    def arr(self) -> list[Any]:
        self.i += 1
        out: list[Any] = []
        while True:
            self.ws()
            if self.i >= self.n:
                raise self.fail("unterminated array")
            if self.s[self.i] == "]":
                self.i += 1
                return out
            out.append(self.value())
            self.ws()
            if self.i < self.n and self.s[self.i] == ",":
                self.i += 1
            elif self.i < self.n and self.s[self.i] == "]":
                continue
            else:
                raise self.fail("expected ',' or ']' in an array")

    def string(self, quote: str) -> str:
        s, n = self.s, self.n
        i = self.i + 1
        parts: list[str] = []
        start = i
        while True:
            if i >= n:
                self.i = i
                raise self.fail("unterminated string")
            c = s[i]
            if c == quote:
                parts.append(s[start:i])
                self.i = i + 1
                return "".join(parts)
            if c == "\\":
                parts.append(s[start:i])
                if i + 1 >= n:
                    self.i = i
                    raise self.fail("unterminated escape")
                e = s[i + 1]
                if e == "u":
                    hexits = s[i + 2 : i + 6]
                    try:
                        parts.append(chr(int(hexits, 16)))
                    except ValueError:
                        self.i = i
                        raise self.fail("bad \\u escape") from None
                    i += 6
                elif e == "x":  # fastjson writes \xNN for some control characters
                    try:
                        parts.append(chr(int(s[i + 2 : i + 4], 16)))
                    except ValueError:
                        self.i = i
                        raise self.fail("bad \\x escape") from None
                    i += 4
                else:
                    parts.append(_ESCAPES.get(e, e))
                    i += 2
                start = i
                continue
            i += 1

    def bare(self) -> Any:
        s, n = self.s, self.n
        start = i = self.i
        while i < n and s[i] not in _BARE_END:
            i += 1
        token = s[start:i]
        if not token:
            raise self.fail("unexpected character")
        self.i = i
        if token == "true":
            return True
        if token == "false":
            return False
        if token in ("null", "undefined"):
            return None
        number = token.rstrip("LlFfDd") if token[:1] in "-0123456789." else token
        try:
            return int(number)
        except ValueError:
            pass
        try:
            return float(number)
        except ValueError:
            pass
        return token  # an unquoted identifier used as a key
