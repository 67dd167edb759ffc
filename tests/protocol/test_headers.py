"""Typed headers parse extFields Java-style and write every value as a string."""

from __future__ import annotations

from typing import Any, get_type_hints

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txmq import _hotpath
from txmq.protocol import headers
from txmq.protocol.headers import (
    EndTransactionRequestHeader,
    HeaderError,
    PullMessageRequestHeader,
    QueueHeader,
    SendMessageRequestHeader,
)


def test_send_header_accepts_v2_letters_and_v1_names() -> None:
    v2 = {
        "a": "PG",
        "b": "T",
        "c": "TBW102",
        "d": "4",
        "e": "2",
        "f": "0",
        "g": "1700000000000",
        "h": "0",
        "i": "TAGS\x01A",
        "j": "0",
        "k": "false",
        "m": "true",
        "n": "broker-a",
    }
    h = SendMessageRequestHeader.from_ext(v2)
    assert (h.producerGroup, h.topic, h.queueId, h.bornTimestamp, h.batch, h.unitMode) == (
        "PG",
        "T",
        2,
        1_700_000_000_000,
        True,
        False,
    )
    assert h.properties == "TAGS\x01A"
    # C++ 1.x: code 10 with long names, numbers coerced to strings by the frame decoder, batch as "1".
    v1 = {
        "producerGroup": "PG",
        "topic": "T",
        "defaultTopic": "TBW102",
        "defaultTopicQueueNums": "4",
        "queueId": "1",
        "sysFlag": "0",
        "bornTimestamp": "5",
        "flag": "0",
        "batch": "1",
    }
    h1 = SendMessageRequestHeader.from_ext(v1)
    assert h1.batch is True and h1.queueId == 1
    assert SendMessageRequestHeader.from_ext(h.to_v2_ext()) == h


def test_missing_and_malformed_fields_are_named() -> None:
    with pytest.raises(HeaderError, match="'topic' is missing"):
        PullMessageRequestHeader.from_ext({"consumerGroup": "G"})
    with pytest.raises(HeaderError, match="'queueId' has an invalid value 'x'"):
        PullMessageRequestHeader.from_ext(
            {
                "consumerGroup": "G",
                "topic": "T",
                "queueId": "x",
                "queueOffset": "0",
                "maxMsgNums": "32",
                "sysFlag": "0",
                "commitOffset": "0",
                "suspendTimeoutMillis": "15000",
            }
        )


def test_to_ext_writes_strings_and_java_booleans() -> None:
    h = EndTransactionRequestHeader(
        producerGroup="PG",
        tranStateTableOffset=3,
        commitLogOffset=99,
        commitOrRollback=8,
        fromTransactionCheck=True,
        msgId="M",
    )
    ext = h.to_ext()
    assert ext == {
        "producerGroup": "PG",
        "tranStateTableOffset": "3",
        "commitLogOffset": "99",
        "commitOrRollback": "8",
        "fromTransactionCheck": "true",
        "msgId": "M",
    }
    assert all(isinstance(v, str) for v in ext.values())
    assert EndTransactionRequestHeader.from_ext(ext) == h
    assert EndTransactionRequestHeader.from_ext({**ext, "fromTransactionCheck": "TRUE"}).fromTransactionCheck
    assert not EndTransactionRequestHeader.from_ext({**ext, "fromTransactionCheck": "yes"}).fromTransactionCheck


def test_send_v2_fast_path_still_names_bad_fields() -> None:
    with pytest.raises(HeaderError, match="'queueId' has an invalid value 'x'"):
        SendMessageRequestHeader.from_ext({"a": "PG", "b": "T", "e": "x"})
    with pytest.raises(HeaderError, match="'producerGroup' is missing"):
        SendMessageRequestHeader.from_ext({"b": "T"})
    h = SendMessageRequestHeader.from_ext({"a": "PG", "b": "T"})
    assert (h.queueId, h.defaultTopic, h.batch, h.reconsumeTimes) == (-1, "TBW102", None, None)


@pytest.mark.parametrize("text", ["1_000", "\u0661", str(2**63), str(-(2**63) - 1), "+-1", "-", "", "0x10", "1e3"])
def test_numbers_parse_as_java_long_does(text: str) -> None:
    """ASCII digits with one optional sign, within 64 bits (found by the fault campaign's fuzzer)."""
    with pytest.raises(HeaderError, match="queueId"):
        QueueHeader.from_ext({"topic": "T", "queueId": text})


def test_the_64_bit_limits_and_blanks_are_accepted() -> None:
    assert QueueHeader.from_ext({"topic": "T", "queueId": str(2**63 - 1)}).queueId == 2**63 - 1
    assert QueueHeader.from_ext({"topic": "T", "queueId": f" {-(2**63)} "}).queueId == -(2**63)
    assert QueueHeader.from_ext({"topic": "T", "queueId": "+7"}).queueId == 7


def _java_long(text: str) -> int | None:
    """Long.parseLong as the docstring of parse_int states it: blanks around, one optional sign, ASCII digits, 64
    bits. None where it refuses."""
    t = text.strip()
    body = t[1:] if t[:1] in ("+", "-") else t
    if not body or not all("0" <= c <= "9" for c in body):
        return None
    value = int(t)
    return value if -(2**63) <= value < 2**63 else None


@given(
    text=st.text(alphabet="0123456789", min_size=0, max_size=22)
    | st.text(alphabet="0123456789+- \u0661\u00b2_", max_size=22)
    | st.integers(-(2**65), 2**65).map(str)
)
@settings(max_examples=400, deadline=None)
def test_parse_int_is_java_long_for_any_text(text: str) -> None:
    """The digits-only shortcut (fewer than 19 digits) and the full rule agree everywhere."""
    try:
        got: int | None = headers.parse_int(text)
    except ValueError:
        got = None
    assert got == _java_long(text)


# -- one implementation: the explicit parsers of the hot requests read as the generic loop over the fields does -----

HEADER_VALUE = (
    st.integers(-(2**70), 2**70).map(str)
    | st.sampled_from(["true", "TRUE", "false", "1", "0", " 7 ", "+3", "-0", "1_000", "\u0661", "", "0x10", "-"])
    | st.text(max_size=8)
)


def _outcome(parse: Any, ext: dict[str, str]) -> Any:
    try:
        return parse(ext)
    except HeaderError as exc:
        return ("raised", str(exc))


@pytest.mark.parametrize("cls", [SendMessageRequestHeader, EndTransactionRequestHeader, PullMessageRequestHeader])
@given(data=st.data())
@settings(max_examples=150, deadline=None)
def test_explicit_parsers_agree_with_the_generic_one(cls: Any, data: st.DataObject) -> None:
    names = [wire for _name, wire, *_ in headers.spec_of(cls)]
    present = data.draw(st.lists(st.sampled_from(names), unique=True, min_size=len(names) - 2))
    ext = {k: data.draw(HEADER_VALUE) for k in present}
    generic = _outcome(cls.parse_fields, ext)
    assert _outcome(cls.from_ext, ext) == generic
    if cls is SendMessageRequestHeader:  # the same values under V2's letters
        assert _outcome(cls.from_ext, {headers.SEND_V2_LETTERS[k]: v for k, v in ext.items()}) == generic


def test_each_field_declares_the_kind_of_its_annotation() -> None:
    """A compiled class keeps no annotations, so each field says its kind; here (interpreted) they must agree."""
    if _hotpath.is_compiled(headers):
        pytest.skip("the compiled module keeps no annotations (CI checks this in its interpreted pass)")
    kinds = {str: headers.TEXT, int: headers.INT, bool: headers.BOOL}
    checked = 0
    for cls in vars(headers).values():
        if isinstance(cls, type) and issubclass(cls, headers.Header) and cls is not headers.Header:
            hints = get_type_hints(cls)
            for name, _wire, kind, _required, _default in headers.spec_of(cls):
                hint = hints[name]
                base = next(t for t in (bool, int, str) if hint is t or t in getattr(hint, "__args__", ()))
                assert kind == kinds[base], (cls.__name__, name)
                checked += 1
    assert checked > 100
