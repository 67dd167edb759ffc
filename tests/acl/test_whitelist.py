"""Whitelist patterns (rocketmq-wire.md §5.5): property tests against a small reference model, plus IPv6 and errors."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from txmq.acl.whitelist import Whitelist, WhitelistError, compile_pattern

octet = st.integers(0, 255)
ipv4 = st.tuples(octet, octet, octet, octet)


@dataclass(frozen=True)
class Model:
    """A pattern as data: its text, and the reference answer for an address (a 4-tuple)."""

    text: str
    kind: str
    exact: frozenset[tuple[int, ...]] = frozenset()
    prefix: tuple[int, ...] = ()
    low: int = 0
    high: int = 255

    def matches(self, ip: tuple[int, ...]) -> bool:
        if self.kind == "all":
            return True
        if self.kind in ("exact", "list", "brace"):
            return ip in self.exact
        n = len(self.prefix)
        return ip[:n] == self.prefix and self.low <= ip[n] <= self.high


def dotted(parts: tuple[int, ...] | list[object]) -> str:
    return ".".join(str(p) for p in parts)


@st.composite
def patterns(draw: st.DrawFn) -> Model:
    kind = draw(st.sampled_from(["all", "exact", "list", "brace", "range", "star"]))
    if kind == "all":
        return Model(draw(st.sampled_from(["*", "*.*.*.*", "*:*:*:*:*:*:*:*"])), "all")
    if kind == "exact":
        ip = draw(ipv4)
        return Model(dotted(ip), "exact", frozenset({ip}))
    if kind == "list":
        ips = draw(st.lists(ipv4, min_size=2, max_size=4))
        return Model(",".join(dotted(i) for i in ips), "list", frozenset(ips))
    if kind == "brace":
        prefix = draw(st.tuples(octet, octet, octet))
        values = draw(st.lists(octet, min_size=1, max_size=5))
        text = f"{dotted(prefix)}.{{{','.join(map(str, values))}}}"
        return Model(text, "brace", frozenset((*prefix, v) for v in values))
    index = draw(st.integers(1, 3))
    prefix = draw(st.tuples(*[octet] * index))
    if kind == "star":
        low, high, seg = 0, 255, "*"
    else:
        low = draw(octet)
        high = draw(st.integers(low, 255))
        seg = f"{low}-{high}"
    text = dotted([*prefix, seg, *(["*"] * (3 - index))])
    return Model(text, "range", prefix=prefix, low=low, high=high)


@st.composite
def pattern_and_ip(draw: st.DrawFn) -> tuple[Model, tuple[int, ...]]:
    model = draw(patterns())
    # Addresses near the pattern hit both branches: a listed address, or one that shares the prefix.
    choices = [draw(ipv4)]
    if model.exact:
        choices.append(draw(st.sampled_from(sorted(model.exact))))
    if model.kind == "range":
        rest = draw(st.tuples(*[octet] * (4 - len(model.prefix))))
        choices.append((*model.prefix, *rest))
        choices.append((*model.prefix, draw(st.integers(model.low, model.high)), *rest[1:]))
    return model, draw(st.sampled_from(choices))


@given(pattern_and_ip())
def test_matcher_agrees_with_the_reference_model(case: tuple[Model, tuple[int, ...]]) -> None:
    model, ip = case
    assert compile_pattern(model.text).matches(dotted(ip)) is model.matches(ip)


@given(st.lists(patterns(), min_size=0, max_size=4), ipv4)
def test_a_whitelist_matches_when_any_entry_does(models: list[Model], ip: tuple[int, ...]) -> None:
    wl = Whitelist.compile([m.text for m in models])
    assert wl.matches(dotted(ip)) is any(m.matches(ip) for m in models)


@given(ipv4)
def test_blank_matches_nothing(ip: tuple[int, ...]) -> None:
    for blank in (None, "", "   "):
        assert not compile_pattern(blank).matches(dotted(ip))


def test_lists_may_mix_braces_and_ranges() -> None:
    wl = compile_pattern("10.0.0.1, 192.168.1.{1,2}, 172.16.*.*")
    assert wl.matches("10.0.0.1") and wl.matches("192.168.1.2") and wl.matches("172.16.9.9")
    assert not wl.matches("192.168.1.3") and not wl.matches("10.0.0.2")


@pytest.mark.parametrize(
    ("pattern", "ip", "expected"),
    [
        ("::1", "0:0:0:0:0:0:0:1", True),
        ("0:0:0:0:0:0:0:1", "::1", True),
        ("FE80::ABCD", "fe80::abcd", True),
        ("fe80::abcd", "fe80::abce", False),
        ("fe80::*", "fe80::1234", True),
        ("fe80::*", "fe81::1", False),
        ("2001:db8:0:0:0:0:0:{1,a}", "2001:db8::a", True),
        ("2001:db8:0:0:0:0:0:{1,a}", "2001:db8::b", False),
        ("2001:db8::10-1f", "2001:db8::1a", True),
        ("2001:db8::10-1f", "2001:db8::20", False),
        ("2001:db8:1-2:*:*:*:*:*", "2001:db8:2:ffff::1", True),
        ("*:*:*:*:*:*:*:*", "2001:db8::1", True),
        ("10.0.0.1", "::ffff:10.0.0.1", True),
        ("10.*.*.*", "2001:db8::1", False),
        ("fe80::*", "10.0.0.1", False),
    ],
)
def test_ipv6(pattern: str, ip: str, expected: bool) -> None:
    assert compile_pattern(pattern).matches(ip) is expected


def test_garbage_peer_addresses_never_match_except_star() -> None:
    assert not compile_pattern("10.*.*.*").matches("not-an-ip")
    assert not compile_pattern("10.0.0.1").matches("")
    assert compile_pattern("*").matches("whatever")


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("1.2.3", "4 dot-separated parts"),
        ("*.1.2.3", "first segment must be a number"),
        ("10.1-2.3.4", "must be '*'"),
        ("10.5-1.*.*", "start > end"),
        ("10.-5.*.*", "needs both ends"),
        ("10.0.0.{1,2", "braces"),
        ("10.0.{1,2}.3", "braces"),
        ("10.0.0.{}", "no value"),
        ("10.0.0.{1,300}", "out of range"),
        ("300.1.1.*", "out of range"),
        ("a.b.c.d", "not a number"),
        ("hostname", "not an IP address"),
        ("fe80::1::2", "only once"),
        ("1.2.3.4,,5.6.7.8", "empty item"),
    ],
)
def test_bad_patterns_are_explained(pattern: str, message: str) -> None:
    with pytest.raises(WhitelistError, match=message.replace("*", r"\*").replace("(", r"\(")):
        compile_pattern(pattern)
