"""A task's arguments are checked against its function at submission (``_check_arity``),
on a fast path for plain positional functions: the same answers as ``Signature.bind``."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

import nbcluster
from nbcluster._remote import _positional_range


def plain(a: Any, b: Any = 1) -> None: ...
def star(a: Any, *rest: Any) -> None: ...
def kwonly(a: Any, *, b: Any) -> None: ...
def keywords(a: Any, **kw: Any) -> None: ...


def test_the_fast_range_is_only_for_plain_positional_functions() -> None:
    assert _positional_range(inspect.signature(plain)) == (1, 2)
    for fn in (star, kwonly, keywords):
        assert _positional_range(inspect.signature(fn)) is None


@pytest.mark.parametrize("fn", [plain, star, kwonly, keywords])
@pytest.mark.parametrize(
    "args,kwargs",
    [((), {}), ((1,), {}), ((1, 2), {}), ((1, 2, 3), {}), ((1,), {"b": 2}), ((), {"a": 1})],
)
def test_the_check_answers_as_signature_bind(fn: Any, args: Any, kwargs: Any) -> None:
    rf = nbcluster.remote(fn)
    for _ in range(2):  # the first call learns the signature, the second takes the fast path
        try:
            inspect.signature(fn).bind(*args, **kwargs)
        except TypeError:
            with pytest.raises(TypeError, match=rf"{fn.__name__}\.remote\(\): "):
                rf._check_arity(args, kwargs)
        else:
            rf._check_arity(args, kwargs)
