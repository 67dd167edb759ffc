"""Java's value rules as RocketMQ's selector applies them: Integer/Long/Double/String/Boolean and their coercions.

Property values are strings; numbers and booleans come only from literals. A failed coercion (``Integer.valueOf``
of ``"6.5"``) is an :class:`EvaluationError`, which makes the whole expression fail for that message, as the
Java broker's ``catch (Throwable)`` around ``evaluate`` does.
"""

from __future__ import annotations

import re
import struct
from typing import Any

from txmq.errors import TxmqError

INT_MIN, INT_MAX = -(2**31), 2**31 - 1
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1
DOUBLE_MAX = 1.7976931348623157e308
DOUBLE_MIN = 4.9e-324  # Java's Double.MIN_VALUE, the smallest positive double


class EvaluationError(TxmqError):
    """A value that Java would have refused (a NumberFormatException, a ClassCastException)."""


class JInt(int):
    """A ``java.lang.Integer`` literal (decimal literals that fit 32 bits)."""

    __slots__ = ()


class JLong(int):
    """A ``java.lang.Long`` literal."""

    __slots__ = ()


# Java parses integers with Character.digit (any Unicode decimal digit) after an optional sign.
_JAVA_INTEGER = re.compile(r"[+-]?\d+")
# Double.valueOf: decimal or hexadecimal floating point, NaN, Infinity, an optional f/F/d/D suffix; ASCII digits.
_JAVA_DECIMAL_DOUBLE = re.compile(r"[+-]?(?:NaN|Infinity|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFdD]?)")
_JAVA_HEX_DOUBLE = re.compile(r"([+-]?0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)[pP][+-]?[0-9]+)[fFdD]?")
_CANONICAL_NAN_BITS = 0x7FF8000000000000
_DOUBLE = struct.Struct(">d")
_LONG = struct.Struct(">q")


def java_integer(text: str) -> JInt:
    """``Integer.valueOf(text)``."""
    if len(text) <= 4000 and _JAVA_INTEGER.fullmatch(text):  # (Python refuses longer digit strings)
        value = int(text)
        if INT_MIN <= value <= INT_MAX:
            return JInt(value)
    raise EvaluationError(f'For input string: "{text}" (not an int)')


def java_long(text: str) -> JLong:
    """``Long.valueOf(text)``."""
    if len(text) <= 4000 and _JAVA_INTEGER.fullmatch(text):  # (Python refuses longer digit strings)
        value = int(text)
        if LONG_MIN <= value <= LONG_MAX:
            return JLong(value)
    raise EvaluationError(f'For input string: "{text}" (not a long)')


def java_double(text: str) -> float:
    """``Double.valueOf(text)``: leading and trailing characters up to U+0020 are ignored, as String.trim does."""
    start, end = 0, len(text)
    while start < end and text[start] <= " ":
        start += 1
    while end > start and text[end - 1] <= " ":
        end -= 1
    trimmed = text[start:end]
    if _JAVA_DECIMAL_DOUBLE.fullmatch(trimmed):
        core = trimmed.rstrip("fFdD") if not trimmed.endswith(("NaN", "Infinity")) else trimmed
        return float(core)
    hex_match = _JAVA_HEX_DOUBLE.fullmatch(trimmed)
    if hex_match:
        return float.fromhex(hex_match.group(1))
    raise EvaluationError(f'For input string: "{text}" (not a double)')


def java_boolean(text: str) -> bool:
    """``Boolean.valueOf(text)``: true only for "true" in any case."""
    return text.lower() == "true"


def _double_bits(value: float) -> int:
    if value != value:
        return _CANONICAL_NAN_BITS
    (bits,) = _LONG.unpack(_DOUBLE.pack(value))
    return int(bits)


def compare_doubles(left: float, right: float) -> int:
    """``Double.compareTo``: NaN above everything, -0.0 below 0.0."""
    if left < right:
        return -1
    if left > right:
        return 1
    lb, rb = _double_bits(left), _double_bits(right)
    return 0 if lb == rb else (-1 if lb < rb else 1)


def _compare_same(left: Any, right: Any) -> int:
    if type(left) is float:
        return compare_doubles(left, right)
    return -1 if left < right else (1 if left > right else 0)


def java_compare(left: Any, right: Any) -> int:
    """RocketMQ's ``ComparisonExpression.__compare`` with string conversion on (it always is).

    Mixed types are converted up (Integer -> Long -> Double, String -> the other side's type); pairs Java cannot
    convert compare as -1, which makes ``=`` false and ``<``/``<=`` true.
    """
    lc, rc = type(left), type(right)
    if lc is not rc:
        if lc is bool:
            if rc is str:  # Java casts the Boolean itself to String here and fails
                raise EvaluationError("java.lang.ClassCastException: Boolean cannot be cast to String")
            return -1
        if lc is JInt:
            if rc is JLong:
                left = JLong(left)
            elif rc is float:
                left = float(left)
            elif rc is str:
                right = java_integer(right)
            else:
                return -1
        elif lc is JLong:
            if rc is JInt:
                right = JLong(right)
            elif rc is float:
                left = float(left)
            elif rc is str:
                right = java_long(right)
            else:
                return -1
        elif lc is float:
            if rc is JInt or rc is JLong:
                right = float(right)
            elif rc is str:
                right = java_double(right)
            else:
                return -1
        elif lc is str:
            if rc is bool:
                left = java_boolean(left)
            elif rc is JInt:
                left = java_integer(left)
            elif rc is JLong:
                left = java_long(left)
            elif rc is float:
                left = java_double(left)
            else:
                return -1
        else:
            return -1
    return _compare_same(left, right)


def java_equals(left: Any, right: Any) -> bool:
    """``left.equals(right)`` for the value types a selector produces (Double compares by bits)."""
    if type(left) is not type(right):
        return False
    if type(left) is float:
        return _double_bits(left) == _double_bits(right)
    return bool(left == right)


def negate(value: Any) -> Any:
    """Unary minus: numbers only; anything else (a string property, a boolean) is null."""
    kind = type(value)
    if kind is JInt:
        return JInt(-value)
    if kind is JLong:
        return JLong(-value)
    if kind is float:
        return -value
    return None


def java_text(value: Any) -> str:
    """How Java prints a value in an expression (``TRUE``, ``'it''s'``, ``5``, ``5.0``)."""
    if value is None:
        return "NULL"
    if type(value) is bool:
        return "TRUE" if value else "FALSE"
    if type(value) is str:
        return "'" + value.replace("'", "''") + "'"
    if type(value) is float:
        return repr(value).replace("inf", "Infinity").replace("e+", "E").replace("e-", "E-")
    return str(int(value))
