"""Remote-address whitelists (rocketmq-wire.md §5.5): ``*``, exact addresses, lists, ``{a,b}``, ranges, IPv6.

A pattern is compiled once into an :class:`AddressPattern`; bad patterns raise :class:`WhitelistError` with a
message saying what is wrong. One deliberate difference from RocketMQ: segments after the range segment must be
``*`` (RocketMQ ignores them, so ``10.1-2.3.4`` would silently match all of ``10.1.*.*`` and ``10.2.*.*``).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field


class WhitelistError(ValueError):
    """A whitelist pattern that cannot be understood."""


_MATCH_ALL = frozenset({"*", "*.*.*.*", "*:*:*:*:*:*:*:*"})


def split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside ``{...}``, so ``1.2.3.{4,5},6.7.8.9`` gives two patterns."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for ch in text:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth = max(0, depth - 1)
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


def normalize_ip(ip: str) -> tuple[int, tuple[int, ...]] | None:
    """(4, four bytes) or (6, eight groups) for a peer address; None if it is not an IP address."""
    ip = ip.strip().strip("[]")
    if "%" in ip:  # a zone id (fe80::1%eth0) plays no part in matching
        ip = ip.split("%", 1)[0]
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    if isinstance(addr, ipaddress.IPv4Address):
        return 4, tuple(addr.packed)
    groups = addr.exploded.split(":")
    return 6, tuple(int(g, 16) for g in groups)


@dataclass(frozen=True, slots=True)
class _Range:
    """Segments ``prefix`` equal, then segment ``len(prefix)`` in ``[low, high]``; later segments are free."""

    version: int
    prefix: tuple[int, ...]
    low: int
    high: int

    def matches(self, version: int, segments: tuple[int, ...]) -> bool:
        n = len(self.prefix)
        return version == self.version and segments[:n] == self.prefix and self.low <= segments[n] <= self.high


@dataclass(frozen=True, slots=True)
class AddressPattern:
    """One compiled pattern (a comma list compiles to several of these inside a :class:`Whitelist`)."""

    text: str
    match_all: bool = False
    exact: frozenset[tuple[int, tuple[int, ...]]] = frozenset()
    ranges: tuple[_Range, ...] = ()

    def matches(self, ip: str) -> bool:
        if self.match_all:
            return True
        peer = normalize_ip(ip)
        if peer is None:
            return False
        return self.matches_normalized(peer)

    def matches_normalized(self, peer: tuple[int, tuple[int, ...]]) -> bool:
        if self.match_all:
            return True
        if peer in self.exact:
            return True
        return any(r.matches(peer[0], peer[1]) for r in self.ranges)


def _segments(text: str, version: int) -> list[str]:
    """The pattern's segments, with an IPv6 ``::`` expanded to the missing zero groups."""
    if version == 4:
        parts = text.split(".")
        if len(parts) != 4:
            raise WhitelistError(f"{text!r}: an IPv4 pattern has 4 dot-separated parts, this one has {len(parts)}")
        return parts
    if text.count("::") > 1:
        raise WhitelistError(f"{text!r}: '::' may appear only once")
    if "::" in text:
        head, tail = text.split("::")
        head_parts = head.split(":") if head else []
        tail_parts = tail.split(":") if tail else []
        missing = 8 - len(head_parts) - len(tail_parts)
        if missing < 1:
            raise WhitelistError(f"{text!r}: too many groups around '::'")
        return [*head_parts, *(["0"] * missing), *tail_parts]
    parts = text.split(":")
    if len(parts) != 8:
        raise WhitelistError(f"{text!r}: an IPv6 pattern has 8 colon-separated groups (or '::'), not {len(parts)}")
    return parts


def _number(text: str, version: int, pattern: str) -> int:
    text = text.strip()
    limit = 255 if version == 4 else 0xFFFF
    try:
        value = int(text, 10 if version == 4 else 16)
    except ValueError:
        kind = "a number 0-255" if version == 4 else "a hex group 0-ffff"
        raise WhitelistError(f"{pattern!r}: {text!r} is not {kind}") from None
    if not 0 <= value <= limit or text.startswith(("-", "+")):
        raise WhitelistError(f"{pattern!r}: {text!r} is out of range (0-{limit if version == 4 else 'ffff'})")
    return value


def _compile_one(text: str) -> AddressPattern:
    text = text.strip()
    if text in _MATCH_ALL:
        return AddressPattern(text, match_all=True)
    exact = normalize_ip(text)
    if exact is not None:
        return AddressPattern(text, exact=frozenset({exact}))
    version = 6 if ":" in text else 4
    if version == 4 and "." not in text:
        raise WhitelistError(f"{text!r} is not an IP address or an address pattern")
    segments = _segments(text, version)
    last = segments[-1].strip()
    if "{" in text or "}" in text:
        if not (last.startswith("{") and last.endswith("}")) or any(("{" in s or "}" in s) for s in segments[:-1]):
            raise WhitelistError(f"{text!r}: braces must enclose the whole last segment, as in 192.168.1.{{1,2,3}}")
        prefix = tuple(_number(s, version, text) for s in segments[:-1])
        items = [i for i in last[1:-1].split(",")]
        if not any(i.strip() for i in items):
            raise WhitelistError(f"{text!r}: the braces list no value")
        values = {_number(i, version, text) for i in items if i.strip()}
        return AddressPattern(text, exact=frozenset((version, (*prefix, v)) for v in values))
    # A range: the first '*' or 'n-m' segment (never the first one) sets it; later segments must be '*'.
    for index, raw in enumerate(segments):
        seg = raw.strip()
        if seg == "*" or "-" in seg:
            if index == 0:
                raise WhitelistError(f"{text!r}: the first segment must be a number, not {seg!r}")
            if seg == "*":
                low, high = 0, 255 if version == 4 else 0xFFFF
            else:
                lo_text, _, hi_text = seg.partition("-")
                if not lo_text.strip() or not hi_text.strip():
                    raise WhitelistError(f"{text!r}: range {seg!r} needs both ends, as in 1-200")
                low, high = _number(lo_text, version, text), _number(hi_text, version, text)
                if low > high:
                    raise WhitelistError(f"{text!r}: range {seg!r} is empty (start > end)")
            later = [s.strip() for s in segments[index + 1 :]]
            if any(s != "*" for s in later):
                raise WhitelistError(
                    f"{text!r}: segments after the range segment {seg!r} must be '*' (they would not be checked)"
                )
            prefix = tuple(_number(s, version, text) for s in segments[:index])
            return AddressPattern(text, ranges=(_Range(version, prefix, low, high),))
    # No range and no braces: an exact address that ipaddress refused (leading zeros, say) or a bad segment.
    return AddressPattern(text, exact=frozenset({(version, tuple(_number(s, version, text) for s in segments))}))


@dataclass(frozen=True, slots=True)
class Whitelist:
    """Several patterns; matches when any does. An empty whitelist matches nothing."""

    patterns: tuple[AddressPattern, ...] = ()
    match_all: bool = field(default=False)

    @classmethod
    def compile(cls, entries: Iterable[str | None]) -> Whitelist:
        """Compile YAML entries; each entry may itself be a comma list. Blank entries match nothing."""
        patterns: list[AddressPattern] = []
        for entry in entries:
            if entry is None or not entry.strip():
                continue
            for piece in split_top_level(entry):
                if not piece.strip():
                    raise WhitelistError(f"{entry!r}: empty item in a comma-separated list")
                patterns.append(_compile_one(piece))
        return cls(tuple(patterns), any(p.match_all for p in patterns))

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def matches(self, ip: str) -> bool:
        if self.match_all:
            return True
        if not self.patterns:
            return False
        peer = normalize_ip(ip)
        if peer is None:
            return False
        return any(p.matches_normalized(peer) for p in self.patterns)


def compile_pattern(text: str | None) -> Whitelist:
    """One whitelist value (``whiteRemoteAddress`` or one global entry)."""
    return Whitelist.compile([text])
