"""Prediction expressions: arithmetic over named model and hardware numbers, never Python eval.

A study's `predict.value` may be a formula such as `0.8 * roofline.decode_tokens_per_s(batch=1, context=640)`.
`parse` checks it against a strict grammar at compile time; `Expr.evaluate` computes it against an
environment of numbers and functions (`compiler.predict_env`).
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

Value = float | Callable[..., float]


class ExprError(ValueError):
    """An expression outside the grammar, or one that cannot be evaluated."""


_BINOPS: dict[type[ast.operator], tuple[str, Callable[[float, float], float]]] = {
    ast.Add: ("+", operator.add),
    ast.Sub: ("-", operator.sub),
    ast.Mult: ("*", operator.mul),
    ast.Div: ("/", operator.truediv),
    ast.Pow: ("**", operator.pow),
}
_BUILTINS: dict[str, Callable[..., float]] = {"min": min, "max": max}

# Friendly names for constructs people are likely to try.
_NODE_NAMES: dict[type[ast.AST], str] = {
    ast.Compare: "comparisons",
    ast.BoolOp: "and/or",
    ast.Subscript: "subscripts",
    ast.Lambda: "lambdas",
    ast.IfExp: "conditional expressions",
    ast.List: "lists",
    ast.Tuple: "tuples",
    ast.Dict: "dicts",
    ast.Set: "sets",
    ast.JoinedStr: "f-strings",
    ast.ListComp: "comprehensions",
    ast.GeneratorExp: "comprehensions",
    ast.Starred: "*args",
    ast.NamedExpr: "assignments (:=)",
}


def _where(node: ast.AST) -> str:
    col = getattr(node, "col_offset", None)
    return f" at column {col + 1}" if col is not None else ""


def _dotted(node: ast.expr) -> str | None:
    """`a.b.c` -> "a.b.c"; None when the node is not a plain dotted name."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


class _Checker:
    """Walks a parsed expression, rejecting anything outside the grammar and collecting names."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.calls: set[str] = set()

    def name(self, node: ast.expr) -> str:
        dotted = _dotted(node)
        if dotted is None:
            # Only Attribute nodes get here: attribute access on something that is not a name.
            raise ExprError(
                f"attribute access is only allowed on names, not on a call or value{_where(node)}"
            )
        for part in dotted.split("."):
            if part.startswith("_"):
                raise ExprError(f"name {dotted!r} is not allowed: parts may not start with '_'{_where(node)}")
        return dotted

    def visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, int | float):
                raise ExprError(f"only numbers are allowed as constants, got {node.value!r}{_where(node)}")
        elif isinstance(node, ast.BinOp):
            if type(node.op) not in _BINOPS:
                op = type(node.op).__name__
                raise ExprError(f"operator {op} is not allowed; use + - * / **{_where(node)}")
            self.visit(node.left)
            self.visit(node.right)
        elif isinstance(node, ast.UnaryOp):
            if not isinstance(node.op, ast.USub | ast.UAdd):
                raise ExprError(f"unary operator {type(node.op).__name__} is not allowed{_where(node)}")
            self.visit(node.operand)
        elif isinstance(node, ast.Name | ast.Attribute):
            self.names.add(self.name(node))
        elif isinstance(node, ast.Call):
            self.call(node)
        else:
            what = _NODE_NAMES.get(type(node), type(node).__name__)
            raise ExprError(f"{what} are not allowed in expressions{_where(node)}")

    def call(self, node: ast.Call) -> None:
        if not isinstance(node.func, ast.Name | ast.Attribute):
            raise ExprError(f"only named functions can be called{_where(node)}")
        fn = self.name(node.func)
        if fn in _BUILTINS:
            if node.keywords or not node.args:
                raise ExprError(f"{fn}() takes one or more positional numbers{_where(node)}")
        else:
            self.names.add(fn)
            self.calls.add(fn)
        for arg in node.args:
            self.visit(arg)
        for kw in node.keywords:
            if kw.arg is None:
                raise ExprError(f"**kwargs is not allowed{_where(kw)}")
            self.visit(kw.value)


@dataclass(frozen=True)
class Expr:
    """A checked expression. `names` holds every dotted name it uses, values and functions alike;
    `calls` the subset it calls."""

    text: str
    names: frozenset[str]
    calls: frozenset[str] = frozenset()
    _tree: ast.Expression | None = field(default=None, repr=False, compare=False)

    def evaluate(self, env: Mapping[str, Value]) -> float:
        tree = self._tree if self._tree is not None else parse(self.text)._tree
        assert tree is not None
        try:
            result = _Evaluator(env, self.text).eval(tree.body)
        except ZeroDivisionError:
            raise ExprError(f"division by zero in {self.text!r}") from None
        except OverflowError:
            raise ExprError(f"numeric overflow in {self.text!r}") from None
        if isinstance(result, complex) or not math.isfinite(result):
            raise ExprError(f"{self.text!r} does not evaluate to a finite real number (got {result!r})")
        return float(result)


class _Evaluator:
    def __init__(self, env: Mapping[str, Value], text: str) -> None:
        self.env, self.text = env, text

    def lookup(self, name: str) -> Value:
        if name not in self.env:
            known = ", ".join(sorted(self.env))
            raise ExprError(f"unknown name {name!r}; known: {known}")
        return self.env[name]

    def eval(self, node: ast.expr) -> float:
        if isinstance(node, ast.Constant):
            return _number(node.value, "constant")  # floats throughout: `10**10**10` overflows instead of hanging
        if isinstance(node, ast.BinOp):
            symbol, op = _BINOPS[type(node.op)]
            result = op(self.eval(node.left), self.eval(node.right))
            if isinstance(result, complex):  # (-8) ** 0.5
                raise ExprError(f"{symbol} gives a complex number in {self.text!r}")
            return result
        if isinstance(node, ast.UnaryOp):
            value = self.eval(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.Call):
            return self.call(node)
        name = _dotted(node)
        assert name is not None  # the checker allowed only dotted names here
        found = self.lookup(name)
        if callable(found):
            raise ExprError(f"{name!r} is a function: call it, e.g. {name}(...)")
        return _number(found, repr(name))

    def call(self, node: ast.Call) -> float:
        name = _dotted(node.func)
        assert name is not None
        args = [self.eval(a) for a in node.args]
        if name in _BUILTINS:
            return _BUILTINS[name](args)
        fn = self.lookup(name)
        if not callable(fn):
            raise ExprError(f"{name!r} is a number, not a function")
        kwargs = {kw.arg: self.eval(kw.value) for kw in node.keywords if kw.arg is not None}
        try:
            result = fn(*args, **kwargs)
        except TypeError as e:
            raise ExprError(f"bad call to {name}(): {e}") from None
        except (ValueError, ArithmeticError) as e:
            if isinstance(e, ExprError):
                raise
            raise ExprError(f"{name}() failed: {e}") from None
        return _number(result, f"{name}()")


def _number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ExprError(f"{what} is not a number (got {value!r})")
    return float(value)


def parse(text: str) -> Expr:
    """Check `text` against the grammar: numbers, + - * / **, unary -, parentheses, dotted names,
    calls of dotted names with positional or keyword arguments, min() and max()."""
    if not isinstance(text, str) or not text.strip():
        raise ExprError("empty expression")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        where = f" at column {e.offset}" if e.offset else ""
        raise ExprError(f"cannot parse {text!r}: {e.msg}{where}") from None
    checker = _Checker()
    try:
        checker.visit(tree.body)
    except ExprError as e:
        raise ExprError(f"in {text!r}: {e}") from None
    return Expr(text=text, names=frozenset(checker.names), calls=frozenset(checker.calls), _tree=tree)
