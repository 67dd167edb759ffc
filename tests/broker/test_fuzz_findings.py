"""Requests the fault campaign's fuzzer (``txmq chaos``, issue 18) found mishandled, each pinned on a real broker:
the answer is a clear error, nothing is logged as a broker bug, and nothing it stored poisons later work."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.frame import RemotingCommand
from txmq.testing import InProcessBroker

pytestmark = pytest.mark.timeout(60)

OFFSET = {"consumerGroup": "G", "topic": "T", "queueId": "0"}


def handler_failures(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What the connection's last-resort catch logged: a handler that raised instead of answering."""
    return [r.getMessage() for r in caplog.records if "handler failed" in r.getMessage()]


async def test_a_header_missing_a_field_or_with_a_bad_number_is_refused_without_a_logged_bug(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broker = InProcessBroker(tmp_path)
    await broker.start()
    try:
        conn = await broker.connect()
        with caplog.at_level(logging.ERROR):
            missing = await conn.request(RemotingCommand.request(RequestCode.QUERY_CONSUMER_OFFSET, {"topic": "T"}), 5)
            not_a_number = await conn.request(
                RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"topic": "T", "queueId": "{}"}), 5
            )
        assert missing.code == ResponseCode.SYSTEM_ERROR and "'consumerGroup' is missing" in (missing.remark or "")
        assert not_a_number.code == ResponseCode.SYSTEM_ERROR and "'queueId'" in (not_a_number.remark or "")
        assert handler_failures(caplog) == []
    finally:
        await broker.stop()


@pytest.mark.parametrize("number", [str(10**30), str(2**63), "1_000", "\u0661\u0662", "+-5", "-"])
async def test_an_offset_beyond_64_bits_is_refused_and_offsets_stay_persistable(
    tmp_path: Path, number: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A commitOffset of 10**30 used to be stored; from then on every write of the offsets file failed (orjson
    cannot write it), so no group's progress survived a restart."""
    broker = InProcessBroker(tmp_path)
    await broker.start()
    try:
        conn = await broker.connect()
        with caplog.at_level(logging.ERROR):
            bad = await conn.request(
                RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, {**OFFSET, "commitOffset": number}), 5
            )
        assert bad.code == ResponseCode.SYSTEM_ERROR and "commitOffset" in (bad.remark or "")
        assert handler_failures(caplog) == []
        good = await conn.request(
            RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, {**OFFSET, "commitOffset": "42"}), 5
        )
        assert good.code == ResponseCode.SUCCESS
        await broker.restart()  # the offsets file is written at shutdown and read at start
        conn = await broker.connect()
        back = await conn.request(RemotingCommand.request(RequestCode.QUERY_CONSUMER_OFFSET, OFFSET), 5)
        assert (back.code, back.ext_fields.get("offset")) == (ResponseCode.SUCCESS, "42")
    finally:
        await broker.stop()


@pytest.mark.parametrize("code", [RequestCode.LOCK_BATCH_MQ, RequestCode.UNLOCK_BATCH_MQ])
@pytest.mark.parametrize("body", [b"[]", b"null", b"3", b'"x"'])
async def test_a_lock_body_that_is_not_an_object_is_refused(
    tmp_path: Path, code: int, body: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    broker = InProcessBroker(tmp_path)
    await broker.start()
    try:
        conn = await broker.connect()
        with caplog.at_level(logging.ERROR):
            answer = await conn.request(RemotingCommand.request(code, {}, body), 5)
        assert answer.code == ResponseCode.SYSTEM_ERROR and "must be a JSON object" in (answer.remark or "")
        assert handler_failures(caplog) == []
    finally:
        await broker.stop()


# Found by fuzzing the gRPC door: a consumer group named with a NUL byte was auto-created, its pop lease expired and
# the retry copy went to "%RETRY%<group>"; the consume queue's directory could not be made, so from then on every
# checkpoint of the store failed (every second, for every queue). A group named "../../x" would have put that
# directory outside the store. The 4.x door reached the same through a heartbeat (auto-creation of the group and
# its retry topic) and CONSUMER_SEND_MSG_BACK. Group names are now checked before a group is auto-created.
BAD_GROUPS = ["bad\x00group", "../../escape", "G\n", "a/b", "x" * 121, " "]


async def test_a_heartbeat_auto_creates_no_group_with_an_illegal_name(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import orjson

    from txmq.broker.topics import retry_topic

    broker = InProcessBroker(tmp_path)
    app = await broker.start()
    try:
        conn = await broker.connect()
        groups = [*BAD_GROUPS, "Good_Group-1"]
        body = orjson.dumps(
            {
                "clientID": "fuzz@1",
                "producerDataSet": [],
                "consumerDataSet": [
                    {
                        "groupName": g,
                        "consumeType": "CONSUME_PASSIVELY",
                        "messageModel": "CLUSTERING",
                        "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
                        "subscriptionDataSet": [],
                        "unitMode": False,
                    }
                    for g in groups
                ],
            }
        )
        with caplog.at_level(logging.ERROR):
            answer = await conn.request(RemotingCommand.request(RequestCode.HEART_BEAT, {}, body), 5)
        assert answer.code == ResponseCode.SUCCESS
        assert set(app.subscriptions.groups) >= {"Good_Group-1"}
        for group in BAD_GROUPS:
            assert group not in app.subscriptions.groups
            assert app.topics.get(retry_topic(group)) is None
        assert app.topics.get(retry_topic("Good_Group-1")) is not None
        assert handler_failures(caplog) == []
        assert not [p for p in (tmp_path).rglob("*escape*")]
    finally:
        await broker.stop()


@pytest.mark.parametrize("group", BAD_GROUPS)
async def test_creating_a_group_with_an_illegal_name_is_refused(tmp_path: Path, group: str) -> None:
    import orjson

    broker = InProcessBroker(tmp_path)
    app = await broker.start()
    try:
        conn = await broker.connect()
        body = orjson.dumps({"groupName": group})
        answer = await conn.request(
            RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, body), 5
        )
        assert answer.code == ResponseCode.SYSTEM_ERROR and "group" in (answer.remark or "")
        assert group not in app.subscriptions.groups
    finally:
        await broker.stop()


def test_a_topic_or_group_name_with_a_trailing_newline_is_illegal() -> None:
    """Python's ``$`` matches before a final newline: "T\\n" passed the topic check (Java's ``matches`` does not)."""
    from txmq.broker.topics import validate_group, validate_topic

    assert validate_topic("T") is None and validate_group("G") is None
    assert validate_topic("T\n") is not None and validate_group("G\n") is not None
    assert validate_group("x" * 120) is None and validate_group("x" * 121) is not None
