"""Prediction expressions: every rejection's exact message, with the column it points at."""

from __future__ import annotations

import pytest

from compiler.expr import ExprError, parse


@pytest.mark.parametrize(("text", "message"), [
    ("2 * (1).real", "in '2 * (1).real': attribute access is only allowed on names, not on a call or value "
                     "at column 5"),
    ("1 + a._b", "in '1 + a._b': name 'a._b' is not allowed: parts may not start with '_' at column 5"),
    ("1 + 's'", "in \"1 + 's'\": only numbers are allowed as constants, got 's' at column 5"),
    ("1 + True", "in '1 + True': only numbers are allowed as constants, got True at column 5"),
    ("1 + a @ b", "in '1 + a @ b': operator MatMult is not allowed; use + - * / ** at column 5"),
    ("1 + ~a", "in '1 + ~a': unary operator Invert is not allowed at column 5"),
    ("1 + {x for x in y}", "in '1 + {x for x in y}': SetComp are not allowed in expressions at column 5"),
    ("1 + (a if b else c)", "in '1 + (a if b else c)': conditional expressions are not allowed in expressions "
                            "at column 6"),
    ("1 + f()()", "in '1 + f()()': only named functions can be called at column 5"),
    ("1 + max()", "in '1 + max()': max() takes one or more positional numbers at column 5"),
    ("1 + min(a, k=1)", "in '1 + min(a, k=1)': min() takes one or more positional numbers at column 5"),
    ("1 + f(**a)", "in '1 + f(**a)': **kwargs is not allowed at column 7"),
])  # fmt: skip
def test_rejections_name_the_construct_and_column(text: str, message: str) -> None:
    with pytest.raises(ExprError) as err:
        parse(text)
    assert str(err.value) == message


@pytest.mark.parametrize(("text", "message"), [
    ("", "empty expression"),
    (" \t", "empty expression"),
    ("1 +", "cannot parse '1 +': invalid syntax"),  # Python gives no column here
    ("1 2", "cannot parse '1 2': invalid syntax at column 3"),
])  # fmt: skip
def test_syntax_errors(text: str, message: str) -> None:
    with pytest.raises(ExprError) as err:
        parse(text)
    assert str(err.value) == message


def test_complex_result_names_the_expression() -> None:
    with pytest.raises(ExprError) as err:
        parse("(0 - 8) ** 0.5").evaluate({})
    assert str(err.value) == "** gives a complex number in '(0 - 8) ** 0.5'"


def test_parsed_text_keeps_its_spaces_and_evaluates() -> None:
    expr = parse("  2 * x ")
    assert expr.text == "  2 * x " and expr.evaluate({"x": 1.5}) == 3.0
