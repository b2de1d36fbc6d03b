"""Building pip environments directly (no cluster): uv when present, pip as the fallback."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from nbcluster._runtime.runtime_env import pip_env

INDEX = next(
    (
        f
        for i, f in enumerate(pip_env.pip_config_flags())
        if f.startswith("file://") and pip_env.pip_config_flags()[i - 1].endswith("index-url")
    ),
    None,
)
pytestmark = pytest.mark.skipif(INDEX is None, reason="no local (file://) package index configured")


def _build(tmp_path: Path, installer: str, *packages: str) -> tuple[str, list[str]]:
    lines: list[str] = []
    spec = {
        "packages": list(packages),
        "install_options": ["--index-url", str(INDEX)],
        "check": False,
    }
    python = asyncio.run(
        pip_env.build(
            spec,
            tmp_path / "env",
            tmp_path / "env.install.log",
            installer,
            lambda p, t: lines.append(t),
        )
    )
    return python, lines


def test_pip_is_the_fallback_when_uv_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pip_env, "find_uv", lambda: None)
    python, lines = _build(tmp_path, "auto", "tabulate")
    assert any("with pip" in line for line in lines) and (tmp_path / "env" / ".ready").exists()
    out = subprocess.run(
        [python, "-c", "import tabulate, nbcluster; print(tabulate.__file__)"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.startswith(str(tmp_path / "env"))  # layered: nbcluster from the base


def test_uv_is_used_when_present(tmp_path: Path) -> None:
    if pip_env.find_uv() is None:
        pytest.skip("uv is not installed here")
    python, lines = _build(tmp_path, "auto", "tabulate")
    assert any("with uv" in line for line in lines)
    assert Path(python).parent.parent == tmp_path / "env"


def test_asking_for_uv_without_uv_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pip_env, "find_uv", lambda: None)
    with pytest.raises(pip_env.PipInstallError, match=r"no uv executable was found.*INSTALLER=pip"):
        _build(tmp_path, "uv", "tabulate")
    assert not (tmp_path / "env").exists()


def test_a_failed_pip_install_names_the_package_and_removes_the_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pip_env, "find_uv", lambda: None)
    with pytest.raises(pip_env.PipInstallError, match=r"'no-such-pkg-17' could not be installed"):
        _build(tmp_path, "pip", "no-such-pkg-17")
    assert not (tmp_path / "env").exists() and (tmp_path / "env.install.log").exists()
