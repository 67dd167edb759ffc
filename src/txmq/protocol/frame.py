"""RocketMQ remoting frames, sans-IO: :class:`RemotingCommand`, :func:`encode_frame` and :class:`FrameDecoder`.

A frame is ``int32 len | int32 (serializeType << 24 | hdrLen) | header | body`` with ``len = 4 + hdrLen + bodyLen``
(rocketmq-wire.md §1.2). Headers are JSON (type 0, what every default client sends) or RocketMQ's binary layout
(type 1). The decoder is a small state machine in the style of h11: bytes in, commands out, no sockets; any input
that is not a valid frame raises :class:`~txmq.errors.FrameError` and leaves the decoder dead.

Inbound extFields become strings the way Java prints them (3 -> "3", true -> "true", 1e10 -> "1.0E10"; null drops
the key). A nested object or array is kept as its compact JSON text rather than rejected, as fastjson would do for a
``Map<String, String>``. In binary headers an empty remark reads back as None (length 0 means null there).
"""

from __future__ import annotations

import itertools
import math
import struct
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final

import orjson

from txmq._hotpath import reduce_by_fields
from txmq.errors import FrameError

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "LANGUAGE_NAMES",
    "FrameDecoder",
    "RemotingCommand",
    "decode_frame",
    "encode_frame",
    "encode_frame_parts",
    "java_double_str",
    "next_opaque",
]

DEFAULT_MAX_FRAME_SIZE = 16 * 1024 * 1024
"""Largest frame accepted, counting the 4-byte length field (Netty's ``frameMaxLength`` semantics)."""

DEFAULT_VERSION = 409  # MQVersion of 4.9.8; Java clients gate features on the broker's version (wire §8.14)

JSON: Final = 0
ROCKETMQ: Final = 1

LANGUAGE_NAMES: tuple[str, ...] = (
    "JAVA",
    "CPP",
    "DOTNET",
    "PYTHON",
    "DELPHI",
    "ERLANG",
    "RUBY",
    "OTHER",
    "HTTP",
    "GO",
    "PHP",
    "OMS",
    "RUST",
)
_LANGUAGE_VALUES: Final = {name: i for i, name in enumerate(LANGUAGE_NAMES)}
_OTHER: Final = 7

_INT32_MIN: Final = -0x80000000
_INT32_MAX: Final = 0x7FFFFFFF

_PREFIX: Final = struct.Struct(">iI")  # frame length, (type << 24 | header length)
_I32: Final = struct.Struct(">i")
_U16: Final = struct.Struct(">H")
_BIN_FIXED: Final = struct.Struct(">hbhii")  # code, language, version, opaque, flag
_BIN_ENTRY_KEY: Final = struct.Struct(">h")

# A process-wide request id. itertools.count is atomic under the GIL; the mask keeps ids non-negative int32 and
# makes them wrap, which is what the C++ client does too.
_opaque_counter = itertools.count(1)


def next_opaque() -> int:
    """The next request id: a non-negative int32 that wraps after 2**31 - 1."""
    return next(_opaque_counter) & _INT32_MAX


@dataclass(slots=True, init=False)
class RemotingCommand:
    """One remoting command: a request, a response, or a oneway request.

    ``language`` is the enum *name* (``"JAVA"``, ``"CPP"``, ...). ``ext_fields`` holds strings; values of other
    types are stringified Java-style when encoded. ``serialize_type`` is 0 (JSON) or 1 (ROCKETMQ binary).
    """

    code: int
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    ext_fields: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    language: str = "JAVA"
    version: int = DEFAULT_VERSION
    serialize_type: int = JSON

    # Written out rather than generated: mypyc compiles this one, while a dataclass's generated __init__ runs
    # interpreted (two or three commands per message). tests/protocol/test_constructors.py holds it to the fields.
    def __init__(
        self,
        code: int,
        opaque: int = 0,
        flag: int = 0,
        remark: str | None = None,
        ext_fields: dict[str, str] | None = None,
        body: bytes = b"",
        language: str = "JAVA",
        version: int = DEFAULT_VERSION,
        serialize_type: int = JSON,
    ) -> None:
        self.code = code
        self.opaque = opaque
        self.flag = flag
        self.remark = remark
        self.ext_fields = {} if ext_fields is None else ext_fields
        self.body = body
        self.language = language
        self.version = version
        self.serialize_type = serialize_type

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        return reduce_by_fields(self)  # copy and pickle (the written-out __init__ needs its arguments)

    @property
    def is_response(self) -> bool:
        return bool(self.flag & 1)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & 2)

    @classmethod
    def request(
        cls,
        code: int,
        ext_fields: dict[str, str] | None = None,
        body: bytes = b"",
        oneway: bool = False,
    ) -> RemotingCommand:
        """A new request with a fresh opaque from the process-wide counter."""
        return cls(
            code=int(code),
            opaque=next_opaque(),
            flag=2 if oneway else 0,
            ext_fields={} if ext_fields is None else ext_fields,
            body=body,
        )

    def response(
        self,
        code: int = 0,
        remark: str | None = None,
        ext_fields: dict[str, str] | None = None,
        body: bytes = b"",
    ) -> RemotingCommand:
        """The response to this request: same opaque, flag=1, and the request's serialize type.

        Echoing the serialize type is what Java brokers do, and it is required for C++ clients, which only parse
        JSON (wire §1.2).
        """
        return RemotingCommand(
            code=int(code),
            opaque=self.opaque,
            flag=1,
            remark=remark,
            ext_fields={} if ext_fields is None else ext_fields,
            body=body,
            serialize_type=self.serialize_type,
        )


# --------------------------------------------------------------------------------------------------------------
# Java string forms


def java_double_str(value: float) -> str:
    """``Double.toString``: plain notation for 1e-3 <= |x| < 1e7, else ``d.dddE<exp>``; always a fraction digit."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0.0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    magnitude = abs(value)
    if 1e-3 <= magnitude < 1e7:
        text = repr(value)  # Python's shortest repr is positional in this range
        return text if "." in text else text + ".0"
    sign, digits, exponent = Decimal(repr(value)).as_tuple()
    assert isinstance(exponent, int)
    digit_text = "".join(map(str, digits)).rstrip("0") or "0"
    sci_exponent = exponent + len(digits) - 1
    mantissa = digit_text[0] + "." + (digit_text[1:] or "0")
    return f"{'-' if sign else ''}{mantissa}E{sci_exponent}"


def _to_java_str(value: Any) -> str | None:
    """A header value as Java's ``String.valueOf`` would print it; None means "omit the key"."""
    kind = type(value)
    if kind is str:
        return value
    if value is None:
        return None
    if kind is bool:
        return "true" if value else "false"
    if isinstance(value, int):  # also IntEnum members, printed as their number
        return str(int(value))
    if isinstance(value, float):
        return java_double_str(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, dict | list):
        # A nested JSON value has no Java string form in a Map<String,String>; fastjson would keep its JSON text.
        return orjson.dumps(value).decode()
    return str(value)


def _stringify_ext(ext: dict[str, Any]) -> dict[str, str]:
    for value in ext.values():
        if type(value) is not str:
            break
    else:
        return ext  # the common case: already all strings, no copy
    out: dict[str, str] = {}
    for key, value in ext.items():
        text = _to_java_str(value)
        if text is not None:
            out[key] = text
    return out


# --------------------------------------------------------------------------------------------------------------
# Encoding


_json_dumps: Final = orjson.dumps


def _encode_json_header(cmd: RemotingCommand) -> bytes:
    header: dict[str, Any] = {
        "code": cmd.code,
        "language": cmd.language,
        "version": cmd.version,
        "opaque": cmd.opaque,
        "flag": cmd.flag,
    }
    if cmd.remark is not None:
        header["remark"] = cmd.remark
    header["extFields"] = _stringify_ext(cmd.ext_fields)
    header["serializeTypeCurrentRPC"] = "JSON"
    return _json_dumps(header)


def _encode_binary_header(cmd: RemotingCommand) -> bytes:
    remark = cmd.remark.encode() if cmd.remark else b""
    parts = [
        _BIN_FIXED.pack(cmd.code, _LANGUAGE_VALUES.get(cmd.language, _OTHER), cmd.version, cmd.opaque, cmd.flag),
        _I32.pack(len(remark)),
        remark,
    ]
    entries = []
    for key, value in _stringify_ext(cmd.ext_fields).items():
        key_bytes = key.encode()
        value_bytes = value.encode()
        entries.append(_BIN_ENTRY_KEY.pack(len(key_bytes)))
        entries.append(key_bytes)
        entries.append(_I32.pack(len(value_bytes)))
        entries.append(value_bytes)
    ext = b"".join(entries)
    parts.append(_I32.pack(len(ext)))
    parts.append(ext)
    return b"".join(parts)


def encode_frame_parts(cmd: RemotingCommand) -> tuple[bytes, bytes]:
    """``(length prefix + header, body)``: lets a transport write a large body without concatenating it."""
    try:
        if cmd.serialize_type == JSON:
            header = _encode_json_header(cmd)
        elif cmd.serialize_type == ROCKETMQ:
            header = _encode_binary_header(cmd)
        else:
            raise ValueError(f"unknown serialize type {cmd.serialize_type!r} (expected 0=JSON or 1=ROCKETMQ)")
        header_len = len(header)
        if header_len > 0xFFFFFF:
            raise ValueError(f"header of {header_len} bytes does not fit the 24-bit header length field")
        body = cmd.body
        prefix = _PREFIX.pack(4 + header_len + len(body), (cmd.serialize_type << 24) | header_len)
    except (struct.error, UnicodeEncodeError, orjson.JSONEncodeError) as exc:
        raise ValueError(f"cannot encode {cmd!r:.200}: {exc}") from exc
    return prefix + header, body


def encode_frame(cmd: RemotingCommand) -> bytes:
    """The complete frame for ``cmd``. Raises ValueError for values the chosen header format cannot carry."""
    head, body = encode_frame_parts(cmd)
    return head + body if body else head


# --------------------------------------------------------------------------------------------------------------
# Decoding


def _int32_field(header: dict[str, Any], key: str, default: int | None) -> int:
    value = header.get(key)
    if value is None:
        if default is None:
            raise FrameError(f"JSON header has no '{key}' field")
        return default
    if type(value) is not int:
        raise FrameError(f"JSON header field '{key}' must be an integer, got {type(value).__name__} {value!r:.50}")
    if not _INT32_MIN <= value <= _INT32_MAX:
        raise FrameError(f"JSON header field '{key}' = {value} is outside the int32 range")
    return value


def _language_name(value: Any) -> str:
    if type(value) is str:
        return value if value in _LANGUAGE_VALUES else "OTHER"
    if type(value) is int:  # fastjson also accepts an ordinal for an enum
        return LANGUAGE_NAMES[value] if 0 <= value < len(LANGUAGE_NAMES) else "OTHER"
    if value is None:
        return "JAVA"
    raise FrameError(f"JSON header field 'language' must be a string, got {type(value).__name__}")


_json_loads: Final = orjson.loads  # read once, not as a module attribute per frame


def _decode_json_header(header_bytes: bytes, body: bytes) -> RemotingCommand:
    try:
        header = _json_loads(header_bytes)
    except orjson.JSONDecodeError as exc:
        raise FrameError(f"JSON header is not valid JSON (or not UTF-8): {exc}") from None
    if type(header) is not dict:
        raise FrameError(f"JSON header must be an object, got {type(header).__name__}")
    remark = header.get("remark")
    if remark is not None and type(remark) is not str:
        raise FrameError(f"JSON header field 'remark' must be a string, got {type(remark).__name__}")
    ext = header.get("extFields")
    if ext is None:
        ext = {}
    elif type(ext) is not dict:
        raise FrameError(f"JSON header field 'extFields' must be an object, got {type(ext).__name__}")
    else:
        # C++ clients send some values as JSON numbers (wire §1.6); they must become Java's strings because
        # header parsing and ACL signatures work on the strings.
        ext = _stringify_ext(ext)
    code = header.get("code")
    opaque = header.get("opaque", 0)
    flag = header.get("flag", 0)
    version = header.get("version", 0)
    language = header.get("language")
    # Fast path for what every client sends; anything unusual goes through the checks that explain the problem.
    if not (
        type(code) is int
        and type(opaque) is int
        and type(flag) is int
        and type(version) is int
        and _INT32_MIN <= code <= _INT32_MAX
        and _INT32_MIN <= opaque <= _INT32_MAX
        and _INT32_MIN <= flag <= _INT32_MAX
        and _INT32_MIN <= version <= _INT32_MAX
    ):
        code = _int32_field(header, "code", None)
        opaque = _int32_field(header, "opaque", 0)
        flag = _int32_field(header, "flag", 0)
        version = _int32_field(header, "version", 0)
    if type(language) is not str or language not in _LANGUAGE_VALUES:
        language = _language_name(language)
    return RemotingCommand(code, opaque, flag, remark, ext, body, language, version, JSON)


def _decode_binary_header(header: bytes, body: bytes) -> RemotingCommand:
    size = len(header)
    if size < 21:  # 13 fixed bytes + remark length + ext length
        raise FrameError(f"binary header of {size} bytes is shorter than the 21-byte minimum")
    code, language, version, opaque, flag = _BIN_FIXED.unpack_from(header, 0)
    pos = 13
    (remark_len,) = _I32.unpack_from(header, pos)
    pos += 4
    if remark_len < 0 or remark_len > size - pos - 4:
        raise FrameError(f"binary header remark length {remark_len} does not fit the {size}-byte header")
    remark = None
    if remark_len:
        remark = _utf8(header[pos : pos + remark_len], "remark")
        pos += remark_len
    (ext_len,) = _I32.unpack_from(header, pos)
    pos += 4
    if ext_len < 0 or ext_len != size - pos:
        raise FrameError(
            f"binary header extFields length {ext_len} does not match the {size - pos} bytes left in the header"
        )
    ext: dict[str, str] = {}
    while pos < size:
        if size - pos < 2:
            raise FrameError("binary header extFields entry is truncated in its key length")
        (key_len,) = _BIN_ENTRY_KEY.unpack_from(header, pos)
        pos += 2
        if key_len < 0 or key_len > size - pos - 4:
            raise FrameError(f"binary header extFields key length {key_len} runs past the header")
        key = _utf8(header[pos : pos + key_len], "extFields key")
        pos += key_len
        (value_len,) = _I32.unpack_from(header, pos)
        pos += 4
        if value_len < 0 or value_len > size - pos:
            raise FrameError(f"binary header extFields value length {value_len} for key {key!r} runs past the header")
        # FastCodes headers plus an RPC hook can write the same key twice (wire §1.4): the last one wins.
        ext[key] = _utf8(header[pos : pos + value_len], "extFields value")
        pos += value_len
    return RemotingCommand(
        code=code,
        opaque=opaque,
        flag=flag,
        remark=remark,
        ext_fields=ext,
        body=body,
        language=LANGUAGE_NAMES[language] if 0 <= language < len(LANGUAGE_NAMES) else "OTHER",
        version=version,
        serialize_type=ROCKETMQ,
    )


def _utf8(data: bytes, what: str) -> str:
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise FrameError(f"binary header {what} is not valid UTF-8: {exc}") from None


def decode_frame(frame: bytes, *, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> RemotingCommand:
    """Decode exactly one complete frame (length prefix included). Raises FrameError otherwise."""
    decoder = FrameDecoder(max_frame_size=max_frame_size)
    commands = decoder.feed(frame)
    if len(commands) != 1 or decoder.buffered:
        raise FrameError(
            f"expected exactly one frame, got {len(commands)} frame(s) and {decoder.buffered} trailing byte(s)"
        )
    return commands[0]


class FrameDecoder:
    """Turns a byte stream into :class:`RemotingCommand` objects.

    ``feed`` may be called with any split of the stream; it returns the commands completed so far. Partial frames
    are kept, and the decoder only re-parses once enough bytes for the next step have arrived, so feeding a large
    frame in many small pieces costs O(total bytes). The length prefix and the type/header-length word are checked
    as soon as they arrive, so a bogus 2 GiB length fails after 4 bytes, not after 2 GiB.

    The first malformed frame raises :class:`FrameError`; the decoder is then dead and every later ``feed``
    raises too (after a framing error the stream cannot be resynchronised).
    """

    __slots__ = ("_buf", "_dead", "_frames", "_max_frame_size", "_need", "_offset")

    def __init__(self, *, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        if max_frame_size < 8:
            raise ValueError("max_frame_size must be at least 8 bytes")
        self._max_frame_size = max_frame_size
        self._buf = bytearray()
        self._need = 4  # bytes the buffer must hold before parsing is worth trying again
        self._dead: str | None = None
        self._offset = 0  # stream offset of the buffer's first byte, for error messages
        self._frames = 0

    @property
    def buffered(self) -> int:
        """Bytes received that do not yet form a complete frame."""
        return len(self._buf)

    @property
    def failed(self) -> bool:
        return self._dead is not None

    def feed(self, data: bytes | bytearray | memoryview) -> list[RemotingCommand]:
        if self._dead is not None:
            raise FrameError(f"decoder already failed: {self._dead}")
        buf = self._buf
        if buf:
            buf += data
            if len(buf) < self._need:
                return []
            data = bytes(buf)
            buf.clear()
        elif not data:
            return []
        elif type(data) is not bytes:
            data = bytes(data)
        try:
            commands, consumed = self._parse(data)
        except FrameError as exc:
            self._dead = str(exc)
            raise
        if consumed < len(data):
            buf += memoryview(data)[consumed:]
        self._offset += consumed
        return commands

    def _fail(self, pos: int, reason: str) -> FrameError:
        return FrameError(f"frame #{self._frames + 1} at stream offset {self._offset + pos}: {reason}")

    def _parse(self, data: bytes) -> tuple[list[RemotingCommand], int]:
        commands: list[RemotingCommand] = []
        size = len(data)
        max_length = self._max_frame_size - 4
        pos = 0
        while True:
            available = size - pos
            if available < 4:
                self._need = 4
                return commands, pos
            length, type_and_header_len = (
                _PREFIX.unpack_from(data, pos) if available >= 8 else (_I32.unpack_from(data, pos)[0], None)
            )
            if length < 4 or length > max_length:
                if length < 0:
                    reason = f"negative frame length {length}"
                elif length < 4:
                    reason = f"frame length {length} is too small to hold the 4-byte header-length field"
                else:
                    reason = (
                        f"frame length {length} (+4) exceeds the maximum frame size of {self._max_frame_size} "
                        "bytes; not a RocketMQ remoting stream, or a peer sending oversized messages"
                    )
                raise self._fail(pos, reason)
            if type_and_header_len is None:
                self._need = 8
                return commands, pos
            serialize_type = type_and_header_len >> 24
            header_len = type_and_header_len & 0xFFFFFF
            if serialize_type > 1:
                raise self._fail(pos, f"unknown serialize type {serialize_type} (expected 0=JSON or 1=ROCKETMQ)")
            if header_len > length - 4:
                raise self._fail(pos, f"header length {header_len} exceeds the frame's {length - 4} bytes")
            end = pos + 4 + length
            if end > size:
                self._need = 4 + length
                return commands, pos
            header_start = pos + 8
            body_start = header_start + header_len
            header = data[header_start:body_start]
            body = data[body_start:end]
            try:
                if serialize_type == JSON:
                    command = _decode_json_header(header, body)
                else:
                    command = _decode_binary_header(header, body)
            except FrameError as exc:
                raise self._fail(pos, str(exc)) from None
            commands.append(command)
            self._frames += 1
            pos = end
