"""Typed headers parse extFields Java-style and write every value as a string."""

from __future__ import annotations

import pytest

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
