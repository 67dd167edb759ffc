"""Property tests for the frame codec: round-trips, split-invariance, and fuzzing the decoder."""

from __future__ import annotations

import struct

import orjson
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from txmq.errors import FrameError
from txmq.protocol.frame import LANGUAGE_NAMES, FrameDecoder, RemotingCommand, encode_frame

INT32 = st.integers(-(2**31), 2**31 - 1)
INT16 = st.integers(-(2**15), 2**15 - 1)
# Strings that UTF-8 can carry (no lone surrogates); include astral characters and NULs.
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
EXT = st.dictionaries(TEXT, TEXT, max_size=8)
BODY = st.binary(max_size=300)


@st.composite
def json_commands(draw: st.DrawFn) -> RemotingCommand:
    return RemotingCommand(
        code=draw(INT32),
        opaque=draw(INT32),
        flag=draw(INT32),
        remark=draw(st.none() | TEXT),
        ext_fields=draw(EXT),
        body=draw(BODY),
        language=draw(st.sampled_from(LANGUAGE_NAMES)),
        version=draw(INT32),
        serialize_type=0,
    )


@st.composite
def binary_commands(draw: st.DrawFn) -> RemotingCommand:
    remark = draw(st.none() | TEXT.filter(bool))  # an empty remark is written as length 0, which reads as None
    return RemotingCommand(
        code=draw(INT16),
        opaque=draw(INT32),
        flag=draw(INT32),
        remark=remark,
        ext_fields=draw(EXT),
        body=draw(BODY),
        language=draw(st.sampled_from(LANGUAGE_NAMES)),
        version=draw(INT16),
        serialize_type=1,
    )


ANY_COMMAND = json_commands() | binary_commands()


@given(json_commands())
@example(RemotingCommand(code=0, remark="", ext_fields={"": ""}))
def test_json_round_trip(cmd: RemotingCommand) -> None:
    assert FrameDecoder().feed(encode_frame(cmd)) == [cmd]


@given(binary_commands())
def test_binary_round_trip(cmd: RemotingCommand) -> None:
    assert FrameDecoder().feed(encode_frame(cmd)) == [cmd]


@given(st.lists(ANY_COMMAND, min_size=1, max_size=6), st.data())
@settings(deadline=None)
def test_any_split_equals_whole(cmds: list[RemotingCommand], data: st.DataObject) -> None:
    stream = b"".join(encode_frame(c) for c in cmds)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=20)))
    decoder = FrameDecoder()
    out: list[RemotingCommand] = []
    prev = 0
    for cut in [*cuts, len(stream)]:
        out += decoder.feed(stream[prev:cut])
        prev = cut
    assert out == cmds
    assert decoder.buffered == 0


@given(st.lists(ANY_COMMAND, min_size=1, max_size=3))
@settings(max_examples=30, deadline=None)
def test_byte_by_byte_equals_whole(cmds: list[RemotingCommand]) -> None:
    stream = b"".join(encode_frame(c) for c in cmds)
    decoder = FrameDecoder()
    out: list[RemotingCommand] = []
    for i in range(len(stream)):
        out += decoder.feed(stream[i : i + 1])
    assert out == FrameDecoder().feed(stream) == cmds


def _feed_all(chunks: list[bytes]) -> None:
    """Feed chunks; only FrameError may escape, and a failed decoder must keep failing."""
    decoder = FrameDecoder(max_frame_size=1 << 16)
    for chunk in chunks:
        try:
            for cmd in decoder.feed(chunk):
                assert isinstance(cmd, RemotingCommand)
                assert all(type(k) is str and type(v) is str for k, v in cmd.ext_fields.items())
                assert isinstance(cmd.body, bytes)
                encode_frame(cmd)  # whatever we decoded we can send back
        except FrameError:
            assert decoder.failed
            try:
                decoder.feed(b"\x00")
            except FrameError:
                return
            raise AssertionError("a failed decoder accepted more input") from None


@given(st.lists(st.binary(max_size=200), max_size=8))
def test_random_bytes_only_raise_frame_error(chunks: list[bytes]) -> None:
    _feed_all(chunks)


@st.composite
def mutated_streams(draw: st.DrawFn) -> bytes:
    cmds = draw(st.lists(ANY_COMMAND, min_size=1, max_size=3))
    stream = bytearray(b"".join(encode_frame(c) for c in cmds))
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        if not stream:
            break
        i = draw(st.integers(0, len(stream) - 1))
        if op == "flip":
            stream[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "set":
            stream[i] = draw(st.integers(0, 255))
        elif op == "insert":
            stream[i:i] = draw(st.binary(min_size=1, max_size=4))
        elif op == "delete":
            del stream[i : i + draw(st.integers(1, 4))]
        else:
            del stream[i:]
    return bytes(stream)


@given(mutated_streams(), st.integers(1, 64))
@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
def test_mutated_frames_only_raise_frame_error(stream: bytes, step: int) -> None:
    _feed_all([stream[i : i + step] for i in range(0, len(stream), step)])


@given(
    st.dictionaries(
        st.text(max_size=5),
        st.none()
        | st.booleans()
        | st.integers(-(2**63), 2**63 - 1)
        | st.floats(allow_nan=False, allow_infinity=False)
        | TEXT,
        max_size=6,
    )
)
def test_inbound_json_scalars_become_java_strings(ext: dict) -> None:
    header = orjson.dumps({"code": 1, "extFields": ext})
    cmd = FrameDecoder().feed(struct.pack(">iI", 4 + len(header), len(header)) + header)[0]
    assert set(cmd.ext_fields) == {k for k, v in ext.items() if v is not None}
    for key, text in cmd.ext_fields.items():
        value = ext[key]
        assert type(text) is str
        if isinstance(value, bool):
            assert text == ("true" if value else "false")
        elif isinstance(value, int):
            assert text == str(value)
        elif isinstance(value, float):
            assert float(text) == value  # Java's "1.0E10" parses back with Python's float()
            assert "." in text and "e" not in text
        else:
            assert text == value
