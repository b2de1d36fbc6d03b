"""Under CI the multi-host tests fail, not skip, when namespaces cannot be made (item 8)."""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

import pytest


@pytest.mark.parametrize("ci", ["true", "1", "TRUE"])
def test_ci_fails_without_namespaces(
    namespaces_unavailable: Callable[[str], NoReturn], monkeypatch: pytest.MonkeyPatch, ci: str
) -> None:
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception, match="no iproute2 here.*CI=true"):
        namespaces_unavailable("no iproute2 here")


@pytest.mark.parametrize("ci", [None, "", "false", "0"])
def test_elsewhere_it_skips_with_the_reason(
    namespaces_unavailable: Callable[[str], NoReturn],
    monkeypatch: pytest.MonkeyPatch,
    ci: str | None,
) -> None:
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.skip.Exception, match="no iproute2 here"):
        namespaces_unavailable("no iproute2 here")
