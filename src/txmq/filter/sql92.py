"""Compile a RocketMQ SQL92 selector once into a tree of closures; evaluate it against message properties.

The checks at compile time and the three-valued evaluation follow RocketMQ's ``filter`` module
(``ComparisonExpression``, ``LogicExpression``, ``UnaryExpression``): a missing property is null, a comparison
with null is null, and only a result of exactly TRUE selects the message. Anything Java would throw while
evaluating (``a > 5`` when ``a`` is ``"6.5"``) makes the message not match.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from lark import Token
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError
from lark.visitors import Transformer_NonRecursive

from txmq.errors import FilterExpressionError
from txmq.filter import values as jv
from txmq.filter.grammar import PARSER, TERMINAL_NAMES

SQL92 = "SQL92"
TAG = "TAG"

Evaluator = Callable[[Mapping[str, str]], Any]


def is_tag_type(expression_type: str | None) -> bool:
    """RocketMQ's ``ExpressionType.isTagType``: null, empty and ``TAG`` are tag expressions."""
    return expression_type is None or expression_type == "" or expression_type == TAG


# ---------------------------------------------------------------------------------------------------------------
# The expression tree. Its node classes mirror RocketMQ's Java classes, because the compile-time checks look at
# what kind of expression an operand is (a constant, a property, a boolean expression), not at its value.


class _Node:
    boolean = False  # a BooleanExpression in Java: may stand where a condition is expected

    def text(self) -> str:
        raise NotImplementedError

    def evaluator(self) -> Evaluator:
        raise NotImplementedError


@dataclass(eq=False)
class _Constant(_Node):
    value: Any
    boolean: bool = False  # TRUE, FALSE and NULL are BooleanConstantExpressions

    def text(self) -> str:
        return jv.java_text(self.value)

    def evaluator(self) -> Evaluator:
        value = self.value
        return lambda _props: value


@dataclass(eq=False)
class _Property(_Node):
    name: str

    def text(self) -> str:
        return self.name

    def evaluator(self) -> Evaluator:
        name = self.name
        return lambda props: props.get(name)


@dataclass(eq=False)
class _Negate(_Node):
    operand: _Node

    def text(self) -> str:
        return f"(- {self.operand.text()})"

    def evaluator(self) -> Evaluator:
        if isinstance(self.operand, _Constant):
            value = jv.negate(self.operand.value)
            return lambda _props: value
        operand = self.operand.evaluator()
        return lambda props: jv.negate(operand(props))


@dataclass(eq=False)
class _BooleanCast(_Node):
    """A bare property used as a condition: true only if its value is a Boolean, which a string never is."""

    operand: _Node
    boolean = True

    def text(self) -> str:
        return self.operand.text()

    def evaluator(self) -> Evaluator:
        operand = self.operand.evaluator()

        def cast(props: Mapping[str, str]) -> Any:
            value = operand(props)
            if value is None:
                return None
            return value if type(value) is bool else False

        return cast


@dataclass(eq=False)
class _Not(_Node):
    operand: _Node
    boolean = True

    def text(self) -> str:
        return f"(NOT {self.operand.text()})"

    def evaluator(self) -> Evaluator:
        operand = self.operand.evaluator()

        def not_(props: Mapping[str, str]) -> Any:
            value = operand(props)
            return None if value is None else not value

        return not_


@dataclass(eq=False)
class _Logic(_Node):
    """An AND or OR chain, evaluated left to right with RocketMQ's short cuts and null rules."""

    is_and: bool
    operands: list[_Node]
    boolean = True

    def text(self) -> str:
        return "(" + (" AND " if self.is_and else " OR ").join(o.text() for o in self.operands) + ")"

    def evaluator(self) -> Evaluator:
        operands = tuple(o.evaluator() for o in self.operands)
        decisive = not self.is_and  # the value that ends the chain: FALSE for AND, TRUE for OR

        def chain(props: Mapping[str, str]) -> Any:
            unknown = False
            for operand in operands:
                value = operand(props)
                if value is None:
                    unknown = True
                elif value is decisive:
                    return decisive
            return None if unknown else not decisive

        return chain


@dataclass(eq=False)
class _Equal(_Node):
    left: _Node
    right: _Node
    boolean = True

    def text(self) -> str:
        if isinstance(self.right, _Constant) and self.right.value is None:
            return f"({self.left.text()} IS NULL)"
        return f"({self.left.text()} = {self.right.text()})"

    def evaluator(self) -> Evaluator:
        left, right = self.left.evaluator(), self.right.evaluator()

        def equal(props: Mapping[str, str]) -> Any:
            lv, rv = left(props), right(props)
            if lv is None or rv is None:
                if lv is None and rv is None:
                    return True
                return None if lv is None else False
            if jv.java_equals(lv, rv):
                return True
            return jv.java_compare(lv, rv) == 0

        return equal


_ORDERINGS: dict[str, Callable[[int], bool]] = {
    ">": lambda c: c > 0,
    ">=": lambda c: c >= 0,
    "<": lambda c: c < 0,
    "<=": lambda c: c <= 0,
}


@dataclass(eq=False)
class _Ordering(_Node):
    op: str
    left: _Node
    right: _Node
    boolean = True

    def text(self) -> str:
        return f"({self.left.text()} {self.op} {self.right.text()})"

    def evaluator(self) -> Evaluator:
        left, right = self.left.evaluator(), self.right.evaluator()
        accept = _ORDERINGS[self.op]
        op = self.op

        def ordering(props: Mapping[str, str]) -> Any:
            lv = left(props)
            if lv is None:
                return None
            rv = right(props)
            if rv is None:
                return None
            if type(lv) is str and type(rv) is str:  # two strings are compared as numbers, or not at all
                try:
                    return accept(jv.compare_doubles(jv.java_double(lv), jv.java_double(rv)))
                except jv.EvaluationError as exc:
                    raise jv.EvaluationError(f"It's illegal to compare string by '{op}'. lv={lv}, rv={rv}") from exc
            return accept(jv.java_compare(lv, rv))

        return ordering


@dataclass(eq=False)
class _In(_Node):
    operand: _Property
    choices: list[str]
    negated: bool
    boolean = True

    def text(self) -> str:
        word = "NOT IN" if self.negated else "IN"
        return f"{self.operand.text()} {word} ({', '.join(jv.java_text(c) for c in self.choices)})"

    def evaluator(self) -> Evaluator:
        name = self.operand.name
        choices = frozenset(self.choices)
        negated = self.negated

        def in_(props: Mapping[str, str]) -> Any:
            value = props.get(name)
            if type(value) is not str:
                return None
            return (value in choices) is not negated

        return in_


_STRING_TESTS: dict[str, Callable[[str, str], bool]] = {
    "CONTAINS": lambda value, search: search in value,
    "STARTSWITH": lambda value, search: value.startswith(search),
    "ENDSWITH": lambda value, search: value.endswith(search),
}


@dataclass(eq=False)
class _StringTest(_Node):
    """CONTAINS / STARTSWITH / ENDSWITH and their NOT forms: FALSE (never null) for a missing or empty operand."""

    word: str
    negated: bool
    operand: _Node
    search: str
    boolean = True

    def text(self) -> str:
        return f"({self.operand.text()} {'NOT ' if self.negated else ''}{self.word} {jv.java_text(self.search)})"

    def evaluator(self) -> Evaluator:
        if not self.search:
            return lambda _props: False
        operand = self.operand.evaluator()
        test = _STRING_TESTS[self.word]
        search, negated = self.search, self.negated

        def string_test(props: Mapping[str, str]) -> Any:
            value = operand(props)
            if type(value) is not str:
                return False
            return test(value, search) is not negated

        return string_test


# ---------------------------------------------------------------------------------------------------------------
# Compile-time checks, as RocketMQ's factory methods make them (each raises what Java's would, as a message).


class _Invalid(Exception):
    """A semantic error found while building the tree; becomes a FilterExpressionError."""


def _as_condition(node: _Node) -> _Node:
    if node.boolean:
        return node
    if isinstance(node, _Property):
        return _BooleanCast(node)
    raise _Invalid(
        f"{node.text()} is not a condition: AND, OR, NOT and the whole expression need a comparison "
        "such as a = 'x' or a > 5"
    )


def _check_equal_operand(node: _Node) -> None:
    if isinstance(node, _Constant) and node.value is None:
        raise _Invalid("NULL cannot be compared with = or <>; write a IS NULL or a IS NOT NULL")


def _check_ordering_operand(node: _Node, op: str) -> None:
    if isinstance(node, _Constant):
        if type(node.value) in (jv.JInt, jv.JLong, float):
            return
        raise _Invalid(
            f"{node.text()} cannot be compared with {op}: only numbers can "
            "(a property is compared as a number when the other side is a number)"
        )
    if node.boolean:
        raise _Invalid(f"the condition {node.text()} cannot be compared with {op}")


def _equal(left: _Node, right: _Node) -> _Node:
    _check_equal_operand(left)
    _check_equal_operand(right)
    if isinstance(left, _Constant) and isinstance(right, _Constant) and left.boolean and not right.boolean:
        raise _Invalid(f"{left.text()} cannot be compared with {right.text()}")
    return _Equal(left, right)


def _ordering(op: str, left: _Node, right: _Node) -> _Node:
    _check_ordering_operand(left, op)
    _check_ordering_operand(right, op)
    return _Ordering(op, left, right)


def _between(value: _Node, low: _Node, high: _Node) -> _Node:
    if isinstance(low, _Constant) and isinstance(high, _Constant):
        if low.value is None or high.value is None:
            raise _Invalid("the bounds of BETWEEN cannot be NULL")
        try:
            order = jv.java_compare(high.value, low.value)
        except jv.EvaluationError as exc:
            raise _Invalid(f"the bounds of BETWEEN {low.text()} AND {high.text()} cannot be compared") from exc
        if order < 0:
            raise _Invalid(
                f"BETWEEN {low.text()} AND {high.text()}: the lower bound must not be greater than the upper bound"
            )
    return _Logic(True, [_ordering(">=", value, low), _ordering("<=", value, high)])


def _not_between(value: _Node, low: _Node, high: _Node) -> _Node:
    return _Logic(False, [_ordering("<", value, low), _ordering(">", value, high)])


def _in(operand: _Node, choices: list[str], negated: bool) -> _Node:
    if not isinstance(operand, _Property):
        raise _Invalid(f"IN needs a property on its left, got {operand.text()}")
    return _In(operand, choices, negated)


def _decode_string(token: Token) -> str:
    return str(token)[1:-1].replace("''", "'")


def _decimal(token: Token) -> _Constant:
    text = str(token).rstrip("lL")
    value = int(text) if len(text) <= 20 else jv.LONG_MAX + 1  # (Python refuses to parse very long numbers)
    if value > jv.LONG_MAX:
        raise _Invalid(f"the number {token} is larger than the largest long ({jv.LONG_MAX})")
    return _Constant(jv.JInt(value) if value <= jv.INT_MAX else jv.JLong(value))


def _floating(token: Token) -> _Constant:
    value = float(str(token))
    if value > jv.DOUBLE_MAX:
        raise _Invalid(f"the number {token} is larger than the largest double")
    if value < jv.DOUBLE_MIN:  # RocketMQ rejects a zero floating-point literal (it checks against Double.MIN_VALUE)
        raise _Invalid(f"the floating-point number {token} is not accepted by RocketMQ: write 0 instead of 0.0")
    return _Constant(value)


class _Builder(Transformer_NonRecursive):
    """Turns lark's parse tree into the checked expression tree."""

    def start(self, items: list[_Node]) -> _Node:
        return _as_condition(items[0])

    def or_chain(self, items: list[_Node]) -> _Node:
        return _chain(False, items)

    def and_chain(self, items: list[_Node]) -> _Node:
        return _chain(True, items)

    def eq(self, items: list[_Node]) -> _Node:
        return _equal(items[0], items[1])

    def ne(self, items: list[_Node]) -> _Node:
        return _Not(_equal(items[0], items[1]))

    def is_null(self, items: list[_Node]) -> _Node:
        return _Equal(items[0], _Constant(None, boolean=True))

    def is_not_null(self, items: list[_Node]) -> _Node:
        return _Not(_Equal(items[0], _Constant(None, boolean=True)))

    def gt(self, items: list[_Node]) -> _Node:
        return _ordering(">", items[0], items[1])

    def ge(self, items: list[_Node]) -> _Node:
        return _ordering(">=", items[0], items[1])

    def lt(self, items: list[_Node]) -> _Node:
        return _ordering("<", items[0], items[1])

    def le(self, items: list[_Node]) -> _Node:
        return _ordering("<=", items[0], items[1])

    def contains(self, items: list[Any]) -> _Node:
        return _StringTest("CONTAINS", False, items[0], _decode_string(items[1]))

    def not_contains(self, items: list[Any]) -> _Node:
        return _StringTest("CONTAINS", True, items[0], _decode_string(items[1]))

    def startswith(self, items: list[Any]) -> _Node:
        return _StringTest("STARTSWITH", False, items[0], _decode_string(items[1]))

    def not_startswith(self, items: list[Any]) -> _Node:
        return _StringTest("STARTSWITH", True, items[0], _decode_string(items[1]))

    def endswith(self, items: list[Any]) -> _Node:
        return _StringTest("ENDSWITH", False, items[0], _decode_string(items[1]))

    def not_endswith(self, items: list[Any]) -> _Node:
        return _StringTest("ENDSWITH", True, items[0], _decode_string(items[1]))

    def between(self, items: list[_Node]) -> _Node:
        return _between(items[0], items[1], items[2])

    def not_between(self, items: list[_Node]) -> _Node:
        return _not_between(items[0], items[1], items[2])

    def string_list(self, items: list[Token]) -> list[str]:
        return [_decode_string(t) for t in items]

    def in_list(self, items: list[Any]) -> _Node:
        return _in(items[0], items[1], False)

    def not_in_list(self, items: list[Any]) -> _Node:
        return _in(items[0], items[1], True)

    def plus(self, items: list[_Node]) -> _Node:
        return items[0]

    def negate(self, items: list[_Node]) -> _Node:
        return _Negate(items[0])

    def not_(self, items: list[_Node]) -> _Node:
        return _Not(_as_condition(items[0]))

    def string(self, items: list[Token]) -> _Node:
        return _Constant(_decode_string(items[0]))

    def decimal(self, items: list[Token]) -> _Node:
        return _decimal(items[0])

    def floating(self, items: list[Token]) -> _Node:
        return _floating(items[0])

    def true(self, _items: list[Any]) -> _Node:
        return _Constant(True, boolean=True)

    def false(self, _items: list[Any]) -> _Node:
        return _Constant(False, boolean=True)

    def null(self, _items: list[Any]) -> _Node:
        return _Constant(None, boolean=True)

    def property(self, items: list[Token]) -> _Node:
        return _Property(str(items[0]))


def _chain(is_and: bool, items: list[_Node]) -> _Node:
    operands: list[_Node] = []
    for item in items:
        item = _as_condition(item)
        # a AND b AND c nests to the left in Java; one flat chain keeps its order, short cuts and nulls
        if isinstance(item, _Logic) and item.is_and == is_and and not operands:
            operands.extend(item.operands)
        else:
            operands.append(item)
    return _Logic(is_and, operands)


# ---------------------------------------------------------------------------------------------------------------
# Public surface


class SqlFilter:
    """A compiled selector. ``matches(properties)`` is what the broker asks for each message."""

    __slots__ = ("_evaluate", "expression")

    def __init__(self, expression: str, evaluate: Evaluator) -> None:
        self.expression = expression
        self._evaluate = evaluate

    def evaluate(self, properties: Mapping[str, str]) -> bool | None:
        """TRUE, FALSE or None (unknown). Raises ``EvaluationError`` where Java would throw."""
        result = self._evaluate(properties)
        return result if result is None or type(result) is bool else None

    def matches(self, properties: Mapping[str, str]) -> bool:
        """True only when the expression is TRUE for these properties; never raises."""
        try:
            return self._evaluate(properties) is True
        except Exception:  # what Java throws while evaluating (and a stack overflow) means "not matched"
            return False

    def __repr__(self) -> str:
        return f"SqlFilter({self.expression!r})"


def compile_sql92(expression: str | None) -> SqlFilter:
    """Compile ``expression`` or raise :class:`FilterExpressionError` saying what is wrong and where."""
    if expression is None or not expression.strip():
        raise FilterExpressionError("the SQL92 expression is empty; write a condition such as a > 5", expression)
    try:
        tree = PARSER.parse(expression)
    except UnexpectedInput as exc:
        raise _syntax_error(expression, exc) from None
    try:
        root = _Builder().transform(tree)
        return SqlFilter(expression, root.evaluator())
    except VisitError as exc:
        cause = exc.orig_exc
        if isinstance(cause, _Invalid):
            raise FilterExpressionError(f"Invalid SQL92 expression {expression!r}: {cause}", expression) from None
        if isinstance(cause, RecursionError):
            raise _too_deep(expression) from None
        raise
    except RecursionError:
        raise _too_deep(expression) from None


def _too_deep(expression: str) -> FilterExpressionError:
    return FilterExpressionError(f"the SQL92 expression nests too deeply: {expression[:80]!r}...", expression)


def _describe_terminal(name: str) -> str:
    if name in TERMINAL_NAMES:
        return TERMINAL_NAMES[name]
    try:
        pattern = PARSER.get_terminal(name).pattern
    except KeyError:
        return name
    return pattern.value.upper() if pattern.type == "str" else name


def _syntax_error(expression: str, exc: UnexpectedInput) -> FilterExpressionError:
    column = getattr(exc, "column", None)
    column = column if isinstance(column, int) and column > 0 else None
    where = f" at column {column}" if column else ""
    if isinstance(exc, UnexpectedCharacters):
        char = expression[exc.pos_in_stream] if 0 <= exc.pos_in_stream < len(expression) else ""
        reason = f"unexpected character {char!r}{where}"
        if char == "'":
            reason += " (a string literal is not closed)"
        elif char in '"!':
            reason += " (strings use single quotes; not-equal is <>)"
    elif isinstance(exc, UnexpectedEOF) or (isinstance(exc, UnexpectedToken) and exc.token.type == "$END"):
        reason = "the expression ends too early"
    elif isinstance(exc, UnexpectedToken):
        reason = f"unexpected {str(exc.token)!r}{where}"
    else:  # pragma: no cover - lark raises only the kinds above
        reason = str(exc)
    choices = sorted({_describe_terminal(t) for t in getattr(exc, "expected", None) or ()})
    if choices:
        reason += "; expected " + ", ".join(choices)
    return FilterExpressionError(f"Invalid SQL92 expression {expression!r}: {reason}", expression, column)
