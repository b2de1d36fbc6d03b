"""String predicates for ``filter(expr="...")``, parsed into Arrow expressions (never eval'd).

Ray Data accepts ``ds.filter(expr="score > 0.5 and label == 'cat'")``. The string is parsed
with :mod:`ast` and translated, node by node from a small whitelist, into a
``pyarrow.compute.Expression``: column names, constants (numbers, strings, booleans,
None), comparisons (chains too), ``and``/``or``/``not``, arithmetic (``+ - * /``), unary
minus, ``is None``/``is not None`` and ``in``/``not in`` a literal list. Anything else is a
``ValueError`` naming the part that is not supported. Being an Arrow expression, the
predicate is vectorized, and right after ``read_parquet`` it is pushed into the read.
"""

from __future__ import annotations

import ast
from typing import Any

import pyarrow.compute as pc

__all__ = ["parse_expression"]

_COMPARE = {
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
    ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b,
    ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b,
}
_ARITH = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: pc.divide(a, b),
}


def _fail(node: ast.AST, text: str) -> ValueError:
    part = ast.get_source_segment(text, node) or type(node).__name__
    return ValueError(
        f"filter(expr={text!r}): {part!r} is not supported; use column names, constants, "
        "comparisons, and/or/not, + - * /, 'is None' and 'in [...]'"
    )


def _literal(node: ast.AST, text: str) -> Any:
    if isinstance(node, ast.Constant) and isinstance(
        node.value, int | float | str | bool | type(None)
    ):
        return node.value
    if (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, ast.USub)
        and isinstance(node.operand, ast.Constant)
    ):
        return -node.operand.value
    raise _fail(node, text)


def _convert(node: ast.AST, text: str) -> Any:
    if isinstance(node, ast.Name):
        return pc.field(node.id)
    if isinstance(node, ast.Constant):
        return pc.scalar(_literal(node, text))
    if isinstance(node, ast.BoolOp):
        parts = [_convert(v, text) for v in node.values]
        out = parts[0]
        for p in parts[1:]:
            out = (out & p) if isinstance(node.op, ast.And) else (out | p)
        return out
    if isinstance(node, ast.UnaryOp):
        if isinstance(node.op, ast.Not):
            return ~_convert(node.operand, text)
        if isinstance(node.op, ast.USub):
            return pc.negate(_convert(node.operand, text))
        raise _fail(node, text)
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITH:
        return _ARITH[type(node.op)](_convert(node.left, text), _convert(node.right, text))
    if isinstance(node, ast.Compare):
        out = None
        left = node.left
        for op, right in zip(node.ops, node.comparators, strict=True):
            part = _compare(op, left, right, text)
            out = part if out is None else (out & part)
            left = right
        return out
    raise _fail(node, text)


def _compare(op: ast.cmpop, left: ast.AST, right: ast.AST, text: str) -> Any:
    if isinstance(op, ast.Is | ast.IsNot):
        if not (isinstance(right, ast.Constant) and right.value is None):
            raise _fail(right, text)
        test = _convert(left, text).is_null()
        return test if isinstance(op, ast.Is) else ~test
    if isinstance(op, ast.In | ast.NotIn):
        if not isinstance(right, ast.List | ast.Tuple | ast.Set):
            raise _fail(right, text)
        test = _convert(left, text).isin([_literal(e, text) for e in right.elts])
        return test if isinstance(op, ast.In) else ~test
    if type(op) in _COMPARE:
        return _COMPARE[type(op)](_convert(left, text), _convert(right, text))
    raise _fail(right, text)


def parse_expression(text: str) -> pc.Expression:
    """``"a > 1 and b == 'x'"`` -> ``(pc.field("a") > 1) & (pc.field("b") == "x")``."""
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as err:
        raise ValueError(f"filter(expr={text!r}) is not a valid expression: {err.msg}") from None
    if not any(isinstance(n, ast.Name) for n in ast.walk(tree)):
        raise ValueError(f"filter(expr={text!r}) must refer to at least one column")
    return _convert(tree.body, text)
