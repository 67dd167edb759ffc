"""RocketMQ's SQL92 selector: grammar, three-valued semantics, Java coercions, compile errors.

The expected results are RocketMQ's: cases marked (RocketMQ test) repeat ``filter/src/test/.../ExpressionTest``
and ``ParserTest``; the rest follow from ``ComparisonExpression``, ``LogicExpression`` and ``UnaryExpression``.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txmq.errors import FilterExpressionError, TxmqError
from txmq.filter import EvaluationError, SqlFilter, compile_sql92

# (expression, properties, matched)
MATCH_TABLE: list[tuple[str, dict[str, str], bool]] = [
    # (RocketMQ test) AND / OR chains over string properties compared with numbers
    ("a=3 and b<>4 And c>5 AND d<=4", {"a": "3", "b": "5", "c": "6", "d": "1"}, True),
    ("a=3 and b<>4 And c>5 AND d<=4", {"a": "4", "b": "5", "c": "6", "d": "1"}, False),
    ("a=3 or b<>4 Or c>5 OR d<=4", {"a": "3"}, True),
    ("a=3 or b<>4 Or c>5 OR d<=4", {"a": "4", "b": "5"}, True),
    ("a=3 or b<>4 Or c>5 OR d<=4", {"a": "4", "b": "4", "c": "3", "d": "2"}, True),
    ("a=3 or b<>4 Or c>5 OR d<=4", {"a": "4", "b": "4", "c": "3", "d": "10"}, False),
    # (RocketMQ test) IN / NOT IN take strings only
    ("a in ('3', '4', '5')", {"a": "4"}, True),
    ("a in ('3', '4', '5')", {"a": "8"}, False),
    ("a not in ('3', '4', '5')", {"a": "8"}, True),
    ("a not in ('3', '4', '5')", {"a": "5"}, False),
    ("a not in ('3', '4', '5')", {}, False),  # missing: unknown, not "not in"
    ("a in ('3')", {"a": "03"}, False),  # string membership, no numeric coercion
    # (RocketMQ test) BETWEEN is inclusive; NOT BETWEEN is its complement for present values
    ("a between 2 and 10", {"a": "2"}, True),
    ("a between 2 and 10", {"a": "10"}, True),
    ("a between 2 and 10", {"a": "11"}, False),
    ("a not between 2 and 10", {"a": "1"}, True),
    ("a not between 2 and 10", {"a": "3"}, False),
    ("a not between 2 and 10", {}, False),
    ("a between -5 and 5", {"a": "-5"}, True),
    # (RocketMQ test) IS NULL / IS NOT NULL
    ("a is null", {"abc": "2"}, True),
    ("a is null", {"a": "2"}, False),
    ("a is not null", {"a": "2"}, True),
    ("a is not null", {"abc": "2"}, False),
    ("a is not null and a='hello'", {"a": "hello"}, True),
    ("a is not null and a='hello'", {}, False),
    ("a is null OR a='hello'", {}, True),
    ("a is null OR a='hello'", {"a": "hello"}, True),
    ("a is null OR a='hello'", {"a": "abc"}, False),
    # (RocketMQ test) = TRUE / = FALSE read the property with Boolean.valueOf
    ("a=TRUE OR b=FALSE", {"a": "true", "b": "false"}, True),
    ("a=TRUE OR b=FALSE", {"a": "false", "b": "true"}, False),
    ("a = TRUE", {"a": "TRUE"}, True),
    ("a = FALSE", {"a": "yes"}, True),  # anything but "true" is false
    # (RocketMQ test) quotes inside strings, system property TAGS
    ("TAGS is not null and TAGS='''''tag'''''", {"TAGS": "''tag''"}, True),
    ("TAGS = 'TagA'", {"TAGS": "TagA", "KEYS": "k1"}, True),
    ("KEYS = 'k1'", {"TAGS": "TagA", "KEYS": "k1"}, True),
    # (RocketMQ test) numbers
    ("a > 3.1E10", {"a": "3.1415E10"}, True),
    ("a > 3.14", {"a": "3.1415"}, True),
    ("a > b", {"a": "10", "b": "20"}, False),  # two properties compare as doubles
    ("a > b", {"a": "20", "b": "10"}, True),
    ("a > b", {"a": "20", "b": "x"}, False),  # Java throws: not matched
    ("a=b", {"a": "3.14", "b": "3.14"}, True),
    ("a<>b", {"a": "3.14", "b": "3.14"}, False),
    ("a<>b", {"a": "3.14", "b": "3.141"}, True),
    # a property against an integer literal goes through Integer.valueOf
    ("a > 5", {"a": "6"}, True),
    ("a > 5", {"a": "+6"}, True),
    ("a > 5", {"a": "6.5"}, False),  # NumberFormatException: not matched
    ("a > 5", {"a": "3000000000"}, False),  # not an int: not matched (RocketMQ's quirk)
    ("a > 5L", {"a": "3000000000"}, False),  # 5L fits an int, so it still is one
    ("a > 2147483648", {"a": "3000000000"}, True),  # a Long literal: Long.valueOf
    ("a > 5", {"a": " 6"}, False),  # Integer.valueOf does not trim
    ("a > 5.0", {"a": " 6"}, True),  # Double.valueOf does
    ("a = 5", {"a": "05"}, True),
    ("a = 5", {"a": "5.0"}, False),
    ("a = 5.0", {"a": "5"}, True),
    ("a = 1.5", {"a": "1.5d"}, True),  # Java's double syntax takes a type suffix
    ("a = -5", {"a": "-5"}, True),
    ("a = - -5", {"a": "5"}, True),
    ("a = +5", {"a": "5"}, True),
    ("a >= 0", {"a": "0"}, True),
    ("a < 10 AND a >= 1", {"a": "9"}, True),
    ("a <= 10", {"a": "NaN"}, False),
    ("a > 10.5", {"a": "NaN"}, True),  # Double.compareTo puts NaN above everything
    ("a > 10.5", {"a": "Infinity"}, True),
    ("a > -a", {"a": "1"}, False),  # negating a string is null
    # strings
    ("a = 'x'", {"a": "x"}, True),
    ("a = 'x'", {"a": "X"}, False),
    ("a <> 'x'", {"a": "y"}, True),
    ("a <> 'x'", {}, False),  # missing: unknown
    ("a = 'it''s'", {"a": "it's"}, True),
    ("a = ''", {"a": ""}, True),
    # (RocketMQ test) CONTAINS / STARTSWITH / ENDSWITH and their NOT forms
    ("value contains 'x'", {"value": "axb"}, True),
    ("value startswith 'ax'", {"value": "axb"}, True),
    ("value endswith 'xb'", {"value": "axb"}, True),
    ("value not contains 'x'", {"value": "axb"}, False),
    ("value not contains 'x'", {"value": "abb"}, True),
    ("value not startswith 'x'", {"value": "abb"}, True),
    ("value not endswith 'x'", {"value": "abb"}, True),
    ("value contains ''", {"value": "axb"}, False),  # an empty search is always false
    ("value not contains ''", {"value": "axb"}, False),
    ("value contains 'x'", {}, False),
    ("value not contains 'x'", {}, False),  # missing: false, not unknown...
    ("NOT (value contains 'x')", {}, True),  # ...so its negation is true
    ("'axb' contains 'x'", {}, True),
    ("' ' startswith ' '", {}, True),
    ("'axb' not endswith '.'", {}, True),
    (
        "a not in ('4', '4', '5') and b between 3 and 10 and c not contains 'axbc'",
        {"a": "3", "b": "3", "c": "axbdc"},
        True,
    ),
    # three-valued logic: unknown never selects, TRUE short-cuts OR, FALSE short-cuts AND
    ("a = 1 OR b = 2", {"b": "2"}, True),
    ("a = 1 OR b = 2", {"b": "3"}, False),
    ("a = 1 AND b = 2", {"b": "2"}, False),
    ("NOT (a = 1)", {}, False),
    ("NOT (a = 1)", {"a": "2"}, True),
    ("b = 'x' OR a > 5", {"b": "x", "a": "6.5"}, True),  # the failing operand is never evaluated
    ("a > 5 OR b = 'x'", {"b": "x", "a": "6.5"}, False),  # Java throws on the left operand: not matched
    # constants and bare properties as conditions
    ("TRUE", {}, True),
    ("FALSE", {}, False),
    ("NULL", {}, False),
    ("a", {"a": "true"}, False),  # a property is a Boolean only if it is one, and properties are strings
    ("NOT a", {"a": "x"}, True),
    ("NOT a = 1", {"a": "1"}, False),  # NOT binds to a: (NOT a) = 1, which RocketMQ never matches
    ("'x' = TRUE", {}, False),
    ("TRUE = TRUE", {}, True),
    ("5 = TRUE", {}, False),  # Integer and Boolean do not compare: -1
    ("a = -NULL", {}, True),  # -NULL is no constant, so it passes the NULL check and is null = null
    # keywords in any case, comments, whitespace
    ("A = 1 aNd b Is NoT nUlL", {"A": "1", "b": "x"}, True),
    ("a = 1 -- the rest is a comment\n OR b = 2", {"b": "2"}, True),
    ("a = --1", {"a": "1"}, True),  # "--" with no line end is two minus signs
    ("a /* here */ = 1", {"a": "1"}, True),
    ("a\t=\r\n1", {"a": "1"}, True),
    ("$a_1 = 1", {"$a_1": "1"}, True),
    ("now = 1", {"now": "1"}, True),  # NOW is not a keyword
    # property names are case-sensitive
    ("a = 1", {"A": "1"}, False),
]


@pytest.mark.parametrize(("expression", "properties", "matched"), MATCH_TABLE)
def test_matches_as_rocketmq_does(expression: str, properties: dict[str, str], matched: bool) -> None:
    assert compile_sql92(expression).matches(properties) is matched


def test_between_reads_the_property_as_a_double_when_a_bound_is_one() -> None:
    f = compile_sql92("a between 1.5 and 2.5")
    assert f.matches({"a": "2.0"})
    assert f.matches({"a": "2.5"})
    assert not f.matches({"a": "2.6"})


@pytest.mark.parametrize(
    ("expression", "properties", "value"),
    [
        ("a = 1", {}, None),
        ("a = 1", {"a": "2"}, False),
        ("a is null", {}, True),
        ("a > 1 OR b = 1", {"b": "2"}, None),
        ("a > 1 AND b = 1", {"b": "2"}, False),
        ("NOT a", {}, None),
        ("a in ('x')", {}, None),
        ("a contains 'x'", {}, False),
    ],
)
def test_three_valued_results(expression: str, properties: dict[str, str], value: bool | None) -> None:
    assert compile_sql92(expression).evaluate(properties) is value


# (expression, a word the message must contain)
MALFORMED: list[tuple[str, str]] = [
    ("a and between 2 and 10", "unexpected"),  # (RocketMQ test)
    (" a between 10 and 0", "lower bound"),  # (RocketMQ test)
    ("a > 100000000000000000000000", "largest long"),  # (RocketMQ test)
    ("a > " + "1" * 5000 + "." + "1" * 5000, "largest double"),  # (RocketMQ test)
    ("value contains x", "string literal"),  # (RocketMQ test)
    ("value contains 123", "string literal"),  # (RocketMQ test)
    ("'axb' contains ", "ends too early"),  # (RocketMQ test)
    ("", "empty"),
    ("   ", "empty"),
    ("a >", "ends too early"),
    ("a = NULL", "IS NULL"),
    ("NULL = a", "IS NULL"),
    ("a <> NULL", "IS NULL"),
    ("a > 'x'", "only numbers"),
    ("a > TRUE", "only numbers"),
    ("a > NULL", "only numbers"),
    ("a > (b = 1)", "cannot be compared"),
    ("NOT a > 1", "cannot be compared"),  # (NOT a) > 1
    ("TRUE = 'x'", "cannot be compared"),
    ("a between NULL and 5", "NULL"),
    ("a between 'a' and 'b'", "only numbers"),
    ("1 in ('1')", "property"),
    ("(a = 1) in ('1')", "property"),
    ("a in ()", "string literal"),
    ("a in (1, 2)", "string literal"),
    ("5", "not a condition"),
    ("'x'", "not a condition"),
    ("a AND 5", "not a condition"),
    ("NOT 5", "not a condition"),
    ("-a AND b", "not a condition"),
    ("a = 0x1F", "unexpected"),  # no hexadecimal literals in RocketMQ's grammar
    ("a = 010", "unexpected"),  # nor octal ones (leading zeros)
    ("a = 0L", "unexpected"),
    ("a = 0.0", "0.0"),  # RocketMQ refuses floating-point zero
    ("a = 1.5L", "unexpected"),
    ("a == 1", "unexpected"),
    ("a != 1", "not-equal is <>"),
    ('a = "x"', "single quotes"),
    ("a = 'x", "not closed"),
    ("a.b = 1", "unexpected character"),
    ("a = 1 /* open", "unexpected character"),
    ("(a = 1", "ends too early"),
    ("a = 1)", "unexpected"),
    ("a = 1 --", "unexpected"),
    ("contains = 1", "unexpected"),  # keywords are reserved
    ("a IS 1", "unexpected"),
]


@pytest.mark.parametrize(("expression", "word"), MALFORMED)
def test_malformed_expressions_raise_the_typed_error(expression: str, word: str) -> None:
    with pytest.raises(FilterExpressionError) as caught:
        compile_sql92(expression)
    assert isinstance(caught.value, TxmqError)
    assert word in str(caught.value)
    assert caught.value.expression == expression


def test_a_syntax_error_says_where_and_what_was_expected() -> None:
    with pytest.raises(FilterExpressionError) as caught:
        compile_sql92("a = 1 AND AND b = 2")
    assert caught.value.column == 11
    message = str(caught.value)
    assert "at column 11" in message and "a property name" in message and "NOT" in message


def test_none_is_an_empty_expression() -> None:
    with pytest.raises(FilterExpressionError, match="empty"):
        compile_sql92(None)


def test_long_chains_and_deep_parentheses_compile_and_evaluate() -> None:
    chain = compile_sql92(" AND ".join(f"p{i} = '{i}'" for i in range(3000)))
    props = {f"p{i}": str(i) for i in range(3000)}
    assert chain.matches(props)
    props["p2999"] = "x"
    assert not chain.matches(props)
    nested = compile_sql92("(" * 500 + "a = 1" + ")" * 500)
    assert nested.matches({"a": "1"})


def test_deep_nesting_is_a_clear_error_or_works_never_a_crash() -> None:
    expression = "NOT " * 5000 + "a = 1"
    try:
        f = compile_sql92(expression)
    except FilterExpressionError as exc:
        assert "nests too deeply" in str(exc)
    else:
        assert f.matches({"a": "1"}) in (True, False)


def test_one_compiled_filter_is_reused() -> None:
    f = compile_sql92("a > 5")
    assert isinstance(f, SqlFilter)
    assert [f.matches({"a": str(i)}) for i in range(8)] == [False] * 6 + [True] * 2


# ---------------------------------------------------------------------------------------------------------------
# Random property values never crash evaluation

_EXPRESSIONS = [
    "a > 5 AND b = 'x'",
    "a BETWEEN -1.5 AND 2147483648",
    "a = b OR a <> c",
    "a > b",
    "NOT (a IN ('1', '2')) OR b IS NULL",
    "a CONTAINS 'x' OR b NOT STARTSWITH 'y' OR c ENDSWITH 'z'",
    "a = TRUE OR b = 1.5 OR c = 9223372036854775807",
    "a",
    "NOT a",
    "-a > 1 OR a NOT BETWEEN 1 AND 2",
    "(a = 1) = (b = 2)",
    "TRUE = a",
]
_NAMES = st.sampled_from(["a", "b", "c", "d", "TAGS"])
_VALUES = st.one_of(
    st.text(max_size=12),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["true", "FALSE", "NaN", "Infinity", "-0.0", " 5", "1e999", "0x1p3", "1.5f", "+", ""]),
)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(_EXPRESSIONS), st.dictionaries(_NAMES, _VALUES, max_size=5))
def test_random_properties_never_crash_evaluation(expression: str, properties: dict[str, str]) -> None:
    f = compile_sql92(expression)
    try:
        value = f.evaluate(properties)
    except EvaluationError:  # what Java would have thrown (a NumberFormatException): the message does not match
        assert f.matches(properties) is False
    else:
        assert value in (True, False, None)
        assert f.matches(properties) is (value is True)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_random_text_compiles_or_raises_the_typed_error(text: str) -> None:
    try:
        f = compile_sql92(text)
    except FilterExpressionError:
        return
    assert f.matches({}) in (True, False)
