"""The SQL92 selector grammar of RocketMQ's ``SelectorParser.jj``, written for lark (LALR, context-free lexer).

Precedence, loosest first: OR; AND; ``=``, ``<>``, ``IS [NOT] NULL``; the comparisons, ``[NOT] BETWEEN``,
``[NOT] IN``, ``[NOT] CONTAINS/STARTSWITH/ENDSWITH``; unary ``+``, ``-`` and ``NOT``. ``NOT`` is unary, so
``NOT a = 1`` means ``(NOT a) = 1``, as in RocketMQ. Keywords are case-insensitive; numbers are decimal (no hex,
no octal, no leading zeros) or floating point; strings use single quotes with ``''`` for a quote.
"""

from __future__ import annotations

from lark import Lark

GRAMMAR = r"""
start: or_expr

?or_expr: and_expr
    | or_expr _OR and_expr                    -> or_chain
?and_expr: eq_expr
    | and_expr _AND eq_expr                   -> and_chain

?eq_expr: cmp_expr
    | eq_expr "=" cmp_expr                    -> eq
    | eq_expr "<>" cmp_expr                   -> ne
    | eq_expr _IS _NULL                       -> is_null
    | eq_expr _IS _NOT _NULL                  -> is_not_null

?cmp_expr: unary
    | cmp_expr ">" unary                      -> gt
    | cmp_expr ">=" unary                     -> ge
    | cmp_expr "<" unary                      -> lt
    | cmp_expr "<=" unary                     -> le
    | cmp_expr _CONTAINS STRING               -> contains
    | cmp_expr _NOT _CONTAINS STRING          -> not_contains
    | cmp_expr _STARTSWITH STRING             -> startswith
    | cmp_expr _NOT _STARTSWITH STRING        -> not_startswith
    | cmp_expr _ENDSWITH STRING               -> endswith
    | cmp_expr _NOT _ENDSWITH STRING          -> not_endswith
    | cmp_expr _BETWEEN unary _AND unary      -> between
    | cmp_expr _NOT _BETWEEN unary _AND unary -> not_between
    | cmp_expr _IN "(" string_list ")"        -> in_list
    | cmp_expr _NOT _IN "(" string_list ")"   -> not_in_list

string_list: STRING ("," STRING)*

?unary: primary
    | "+" unary                               -> plus
    | "-" unary                               -> negate
    | _NOT unary                              -> not_

?primary: STRING                              -> string
    | DECIMAL                                 -> decimal
    | FLOAT                                   -> floating
    | _TRUE                                   -> true
    | _FALSE                                  -> false
    | _NULL                                   -> null
    | ID                                      -> property
    | "(" or_expr ")"

_NOT: "NOT"i
_AND: "AND"i
_OR: "OR"i
_BETWEEN: "BETWEEN"i
_IN: "IN"i
_TRUE: "TRUE"i
_FALSE: "FALSE"i
_NULL: "NULL"i
_IS: "IS"i
_CONTAINS: "CONTAINS"i
_STARTSWITH: "STARTSWITH"i
_ENDSWITH: "ENDSWITH"i

ID: /[a-z_$][a-z0-9_$]*/i
FLOAT.4: /[0-9]+\.[0-9]*(e[+-]?[0-9]+)?|\.[0-9]+(e[+-]?[0-9]+)?|[0-9]+e[+-]?[0-9]+/i
DECIMAL.3: /0|[1-9][0-9]*[lL]?/
STRING.2: /'(?:''|[^'])*'/

LINE_COMMENT.5: /--[^\r\n]*(\r\n|\r|\n)/
BLOCK_COMMENT.5: /\/\*[^*]*\*+(?:[^\/*][^*]*\*+)*\//
WHITESPACE: /[ \t\n\r\f]+/
%ignore LINE_COMMENT
%ignore BLOCK_COMMENT
%ignore WHITESPACE
"""

# Human names for the terminals a syntax error may say were expected.
TERMINAL_NAMES = {
    "ID": "a property name",
    "STRING": "a string literal",
    "DECIMAL": "a number",
    "FLOAT": "a number",
    "$END": "the end of the expression",
}

PARSER = Lark(GRAMMAR, parser="lalr", lexer="basic", start="start", maybe_placeholders=False)
