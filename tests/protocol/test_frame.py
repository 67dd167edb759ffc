"""Frame codec: known bytes, Java/C++ quirks, and every kind of malformed input."""

from __future__ import annotations

import struct

import orjson
import pytest

from txmq.errors import FrameError
from txmq.protocol.codes import LanguageCode, RequestCode, ResponseCode, SerializeType
from txmq.protocol.frame import (
    FrameDecoder,
    RemotingCommand,
    decode_frame,
    encode_frame,
    encode_frame_parts,
    java_double_str,
    next_opaque,
)


def frame(header: bytes, body: bytes = b"", serialize_type: int = 0) -> bytes:
    return struct.pack(">iI", 4 + len(header) + len(body), (serialize_type << 24) | len(header)) + header + body


def json_frame(header: object, body: bytes = b"") -> bytes:
    return frame(orjson.dumps(header), body)


def binary_header(
    code: int = 10,
    language: int = 0,
    version: int = 409,
    opaque: int = 7,
    flag: int = 0,
    remark: bytes = b"",
    entries: list[tuple[bytes, bytes]] | None = None,
) -> bytes:
    ext = b"".join(struct.pack(">h", len(k)) + k + struct.pack(">i", len(v)) + v for k, v in (entries or []))
    return (
        struct.pack(">hbhii", code, language, version, opaque, flag)
        + struct.pack(">i", len(remark))
        + remark
        + struct.pack(">i", len(ext))
        + ext
    )


# ---------------------------------------------------------------------------------------------------------------
# codes


def test_codes_match_rocketmq_numbers() -> None:
    assert RequestCode.SEND_MESSAGE_V2 == 310
    assert RequestCode.END_TRANSACTION == 37
    assert RequestCode.CHECK_TRANSACTION_STATE == 39
    assert RequestCode.GET_ROUTEINFO_BY_TOPIC == 105
    assert RequestCode.ADD_WRITE_PERM_OF_BROKER == 327
    assert ResponseCode.TRANSACTION_FAILED == 4
    assert ResponseCode.QUERY_NOT_FOUND == 22
    assert ResponseCode.REQUEST_CODE_NOT_SUPPORTED == 3
    assert ResponseCode.TRANSACTION_STATE_GROUP_WRONG == 203
    assert ResponseCode.FLOW_CONTROL == 215
    assert [m.name for m in LanguageCode][:3] == ["JAVA", "CPP", "DOTNET"]
    assert LanguageCode.RUST == 12
    assert SerializeType.ROCKETMQ == 1


# ---------------------------------------------------------------------------------------------------------------
# commands


def test_request_and_response_constructors() -> None:
    req = RemotingCommand.request(RequestCode.END_TRANSACTION, {"a": "b"}, b"x", oneway=True)
    assert req.code == 37 and type(req.code) is int
    assert req.is_oneway and not req.is_response
    assert 0 <= req.opaque <= 0x7FFFFFFF
    req.serialize_type = 1
    resp = req.response(ResponseCode.TOPIC_NOT_EXIST, remark="nope", ext_fields={"k": "v"}, body=b"b")
    assert resp.opaque == req.opaque
    assert resp.flag == 1 and resp.is_response and not resp.is_oneway
    assert resp.serialize_type == 1  # echoed
    assert (resp.code, resp.remark, resp.ext_fields, resp.body) == (17, "nope", {"k": "v"}, b"b")
    assert resp.language == "JAVA" and resp.version == 409


def test_opaque_counter_increases_and_stays_non_negative() -> None:
    a, b = next_opaque(), next_opaque()
    assert 0 <= a < b <= 0x7FFFFFFF


def test_opaque_counter_wraps(monkeypatch: pytest.MonkeyPatch) -> None:
    import itertools

    from txmq.protocol import frame as frame_mod

    monkeypatch.setattr(frame_mod, "_opaque_counter", itertools.count(0x7FFFFFFF))
    assert frame_mod.next_opaque() == 0x7FFFFFFF
    assert frame_mod.next_opaque() == 0


# ---------------------------------------------------------------------------------------------------------------
# encoding: exact bytes


def test_encode_json_exact_bytes() -> None:
    cmd = RemotingCommand(code=310, opaque=5, flag=0, ext_fields={"a": "G"}, body=b"hi")
    header = (
        b'{"code":310,"language":"JAVA","version":409,"opaque":5,"flag":0,'
        b'"extFields":{"a":"G"},"serializeTypeCurrentRPC":"JSON"}'
    )
    assert encode_frame(cmd) == struct.pack(">ii", 4 + len(header) + 2, len(header)) + header + b"hi"


def test_encode_json_remark_present_only_when_set() -> None:
    with_remark = decode_header_json(encode_frame(RemotingCommand(code=1, remark="boom")))
    without = decode_header_json(encode_frame(RemotingCommand(code=0)))
    assert with_remark["remark"] == "boom"
    assert "remark" not in without
    assert without["extFields"] == {}  # always an object


def decode_header_json(data: bytes) -> dict:
    (header_len,) = struct.unpack_from(">I", data, 4)
    return orjson.loads(data[8 : 8 + (header_len & 0xFFFFFF)])


def test_encode_stringifies_every_ext_value_java_style() -> None:
    cmd = RemotingCommand(
        code=34,
        ext_fields={  # type: ignore[dict-item]
            "i": 4,
            "big": 2**40,
            "t": True,
            "f": False,
            "d": 1.5,
            "e": 1e10,
            "gone": None,
            "enum": RequestCode.PULL_MESSAGE,
            "s": "x",
        },
    )
    ext = decode_header_json(encode_frame(cmd))["extFields"]
    assert ext == {
        "i": "4",
        "big": "1099511627776",
        "t": "true",
        "f": "false",
        "d": "1.5",
        "e": "1.0E10",
        "enum": "11",
        "s": "x",
    }
    assert all(isinstance(v, str) for v in ext.values())


def test_encode_binary_exact_bytes() -> None:
    cmd = RemotingCommand(
        code=11, opaque=9, flag=2, remark="r", ext_fields={"k": "v"}, body=b"B", serialize_type=1, language="CPP"
    )
    header = binary_header(code=11, language=1, version=409, opaque=9, flag=2, remark=b"r", entries=[(b"k", b"v")])
    assert encode_frame(cmd) == frame(header, b"B", serialize_type=1)


def test_encode_parts_join_to_the_frame() -> None:
    cmd = RemotingCommand(code=0, opaque=1, body=b"x" * 1000)
    head, body = encode_frame_parts(cmd)
    assert body is cmd.body
    assert head + body == encode_frame(cmd)


def test_encode_rejects_unencodable_values() -> None:
    with pytest.raises(ValueError, match="serialize type"):
        encode_frame(RemotingCommand(code=0, serialize_type=5))
    with pytest.raises(ValueError):
        encode_frame(RemotingCommand(code=70000, serialize_type=1))  # binary code is int16
    with pytest.raises(ValueError):
        encode_frame(RemotingCommand(code=0, remark="\ud800"))


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1.0, "1.0"),
        (0.5, "0.5"),
        (123.456, "123.456"),
        (1e7, "1.0E7"),
        (1.5e-4, "1.5E-4"),
        (0.001, "0.001"),
        (9999999.0, "9999999.0"),
        (-2.5e-10, "-2.5E-10"),
        (1e21, "1.0E21"),
        (0.0, "0.0"),
        (-0.0, "-0.0"),
        (float("inf"), "Infinity"),
    ],
)
def test_java_double_str(value: float, text: str) -> None:
    assert java_double_str(value) == text


# ---------------------------------------------------------------------------------------------------------------
# decoding: what real clients send


def test_decode_cpp_style_json_header() -> None:
    # C++: language CPP, numbers and bools mixed into extFields, a trailing newline counted in the header length,
    # no serializeTypeCurrentRPC.
    header = (
        b'{"code":10,"extFields":{"AccessKey":"","queueId":3,"sysFlag":0,"batch":false,"unitMode":"false",'
        b'"bornTimestamp":"1700000000000","weight":0.25,"nothing":null},'
        b'"flag":0,"language":"CPP","opaque":42,"version":63}\n'
    )
    cmd = decode_frame(frame(header, b"payload"))
    assert cmd.code == 10 and cmd.opaque == 42 and cmd.version == 63
    assert cmd.language == "CPP"
    assert cmd.serialize_type == 0
    assert cmd.body == b"payload"
    assert cmd.remark is None
    assert cmd.ext_fields == {
        "AccessKey": "",
        "queueId": "3",
        "sysFlag": "0",
        "batch": "false",
        "unitMode": "false",
        "bornTimestamp": "1700000000000",
        "weight": "0.25",
    }


def test_decode_unknown_language_is_other_and_missing_fields_default() -> None:
    cmd = decode_frame(json_frame({"code": 34, "language": "COBOL"}))
    assert cmd.language == "OTHER"
    assert (cmd.opaque, cmd.flag, cmd.version, cmd.ext_fields, cmd.remark) == (0, 0, 0, {}, None)
    assert decode_frame(json_frame({"code": 34, "language": 9})).language == "GO"
    assert decode_frame(json_frame({"code": 34, "extFields": None, "remark": None})).ext_fields == {}


def test_decode_nested_ext_values_become_their_json_text() -> None:
    cmd = decode_frame(json_frame({"code": 34, "extFields": {"o": {"a": 1}, "l": [1, "x"]}}))
    assert cmd.ext_fields == {"o": '{"a":1}', "l": '[1,"x"]'}


def test_decode_binary_duplicate_key_last_wins_and_empty_remark_is_none() -> None:
    header = binary_header(
        code=310, language=0, opaque=3, flag=0, entries=[(b"a", b"first"), (b"b", b""), (b"a", b"second")]
    )
    cmd = decode_frame(frame(header, b"body", serialize_type=1))
    assert cmd.ext_fields == {"a": "second", "b": ""}
    assert cmd.remark is None
    assert cmd.serialize_type == 1
    assert cmd.body == b"body"


def test_decode_binary_unknown_language_byte_is_other() -> None:
    cmd = decode_frame(frame(binary_header(language=99), serialize_type=1))
    assert cmd.language == "OTHER"
    cmd = decode_frame(frame(binary_header(language=-1), serialize_type=1))
    assert cmd.language == "OTHER"


def test_decode_several_frames_in_one_feed_and_split_feeds() -> None:
    cmds = [RemotingCommand(code=i, opaque=i, body=bytes([i]) * i) for i in range(1, 6)]
    stream = b"".join(encode_frame(c) for c in cmds)
    assert FrameDecoder().feed(stream) == cmds
    decoder = FrameDecoder()
    out = []
    for i in range(0, len(stream), 7):
        out += decoder.feed(stream[i : i + 7])
    assert out == cmds
    assert decoder.buffered == 0


def test_decoder_accepts_bytearray_and_memoryview() -> None:
    data = encode_frame(RemotingCommand(code=1, opaque=2))
    assert FrameDecoder().feed(bytearray(data))[0].opaque == 2
    assert FrameDecoder().feed(memoryview(data))[0].opaque == 2


def test_max_frame_size_is_configurable_and_counts_the_length_field() -> None:
    data = encode_frame(RemotingCommand(code=1, body=b"x" * 100))
    assert FrameDecoder(max_frame_size=len(data)).feed(data)
    with pytest.raises(FrameError, match="maximum frame size"):
        FrameDecoder(max_frame_size=len(data) - 1).feed(data)


def test_large_frame_fed_in_small_pieces_is_linear() -> None:
    # 4 MiB in 1 KiB pieces: with re-parsing or re-copying on every feed this would take minutes.
    body = bytes(range(256)) * (4 * 4096)
    data = encode_frame(RemotingCommand(code=1, body=body))
    decoder = FrameDecoder()
    out = []
    for i in range(0, len(data), 1024):
        out += decoder.feed(data[i : i + 1024])
    assert len(out) == 1 and out[0].body == body


# ---------------------------------------------------------------------------------------------------------------
# decoding: malformed input


GOOD = {"code": 10, "opaque": 1, "flag": 0, "language": "JAVA", "version": 409, "extFields": {}}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (struct.pack(">i", 0x7FFFFFF0), "exceeds the maximum frame size"),
        (struct.pack(">i", -5), "negative frame length"),
        (struct.pack(">i", 2), "too small"),
        (struct.pack(">iI", 10, 7), "header length 7 exceeds"),
        (struct.pack(">iI", 10, (2 << 24) | 2), "unknown serialize type 2"),
        (struct.pack(">iI", 10, (0xFF << 24) | 2), "unknown serialize type 255"),
        (frame(b"{not json"), "not valid JSON"),
        (frame(b""), "not valid JSON"),
        (frame(b"[1,2]"), "must be an object"),
        (frame(b'"code"'), "must be an object"),
        (json_frame({"opaque": 1}), "no 'code' field"),
        (json_frame({**GOOD, "code": "10"}), "'code' must be an integer"),
        (json_frame({**GOOD, "code": True}), "'code' must be an integer"),
        (json_frame({**GOOD, "code": 1.5}), "'code' must be an integer"),
        (json_frame({**GOOD, "opaque": 2**40}), "outside the int32 range"),
        (json_frame({**GOOD, "flag": [1]}), "'flag' must be an integer"),
        (json_frame({**GOOD, "remark": 5}), "'remark' must be a string"),
        (json_frame({**GOOD, "extFields": []}), "'extFields' must be an object"),
        (json_frame({**GOOD, "language": {}}), "'language' must be a string"),
        (frame(b'{"code":1,"remark":"\xff\xfe"}'), "not valid JSON"),
        (frame(b"\x00\x01", serialize_type=1), "shorter than the 21-byte minimum"),
        (frame(binary_header(entries=[(b"k", b"v")])[:-1], serialize_type=1), "does not match"),
        (frame(binary_header(remark=b"abc")[:15], serialize_type=1), "shorter"),
        (
            frame(
                binary_header(entries=[(b"k", b"v")]).replace(b"\x00\x00\x00\x01v", b"\x00\x00\x00\x09v"),
                serialize_type=1,
            ),
            "value length 9",
        ),
        (frame(binary_header(remark=b"\xff\xfe"), serialize_type=1), "remark is not valid UTF-8"),
        (frame(binary_header(entries=[(b"\xc3", b"v")]), serialize_type=1), "key is not valid UTF-8"),
        (frame(binary_header(entries=[(b"k", b"\xe2\x82")]), serialize_type=1), "value is not valid UTF-8"),
        (frame(binary_header() + b"junk", serialize_type=1), "does not match"),
    ],
)
def test_malformed_input_raises_frame_error(data: bytes, message: str) -> None:
    decoder = FrameDecoder()
    with pytest.raises(FrameError, match=message):
        decoder.feed(data)
    assert decoder.failed
    with pytest.raises(FrameError, match="already failed"):
        decoder.feed(encode_frame(RemotingCommand(code=1)))


def test_binary_header_with_negative_lengths() -> None:
    h = struct.pack(">hbhii", 1, 0, 1, 1, 0) + struct.pack(">i", -1) + struct.pack(">i", 0)
    with pytest.raises(FrameError, match="remark length -1"):
        decode_frame(frame(h, serialize_type=1))
    entry = struct.pack(">h", -3) + b"abc" + struct.pack(">i", 0)
    h = struct.pack(">hbhii", 1, 0, 1, 1, 0) + struct.pack(">i", 0) + struct.pack(">i", len(entry)) + entry
    with pytest.raises(FrameError, match="key length -3"):
        decode_frame(frame(h, serialize_type=1))


def test_bad_length_detected_before_the_frame_arrives() -> None:
    decoder = FrameDecoder()
    with pytest.raises(FrameError, match="exceeds"):
        decoder.feed(b"\x7f\xff\xff\xff")  # 2 GiB announced: fail now, don't wait for it
    decoder = FrameDecoder()
    assert decoder.feed(struct.pack(">i", 1000)) == []
    with pytest.raises(FrameError, match="serialize type 3"):
        decoder.feed(struct.pack(">I", (3 << 24) | 10))


def test_error_names_the_frame_and_offset() -> None:
    good = encode_frame(RemotingCommand(code=1))
    decoder = FrameDecoder()
    assert len(decoder.feed(good)) == 1
    with pytest.raises(FrameError, match=rf"frame #2 at stream offset {len(good)}"):
        decoder.feed(frame(b"nope"))


def test_decode_frame_requires_exactly_one_frame() -> None:
    one = encode_frame(RemotingCommand(code=1))
    with pytest.raises(FrameError, match="exactly one frame"):
        decode_frame(one + one)
    with pytest.raises(FrameError, match="exactly one frame"):
        decode_frame(one[:-1])
