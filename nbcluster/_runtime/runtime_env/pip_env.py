"""Virtual environments for ``runtime_env['pip']``: one per distinct spec and host, cached.

An environment is layered over the base one (the interpreter that runs nbcluster): a
``.pth`` file makes the base site-packages importable after the environment's own, so a
package installed here wins and everything else (nbcluster, numpy, ...) comes from the
base. ``uv`` installs when it is found (``NBCLUSTER_RUNTIME_ENV_INSTALLER=auto|uv|pip``),
with pip's configured indexes passed explicitly (uv does not read pip's config); otherwise
pip, run from the base environment inside the new one.

An environment is usable only once its ``.ready`` marker exists: a failed or interrupted
build is deleted (its install log is kept beside it) and never reused.
"""

from __future__ import annotations

import asyncio
import configparser
import contextlib
import os
import re
import shlex
import shutil
import site
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["PipInstallError", "base_site_dirs", "build", "find_uv", "pip_config_flags"]

READY = ".ready"
Progress = Callable[[str, str], None]


class PipInstallError(RuntimeError):
    """Installing a pip spec failed; the message names the package and the install log."""


def base_site_dirs() -> list[str]:
    """The running interpreter's site-packages directories (what an env layers over)."""
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        dirs.append(site.getusersitepackages())
    return [d for d in dirs if os.path.isdir(d)]


def find_uv() -> str | None:
    """The ``uv`` executable: beside this interpreter (a venv's bin), else on PATH."""
    beside = Path(sys.executable).parent / "uv"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("uv")


def _pip_config_files(environ: Mapping[str, str]) -> list[str]:
    xdg = environ.get("XDG_CONFIG_DIRS", "/etc/xdg").split(":")
    home = os.path.expanduser("~")
    files = ["/etc/pip.conf", *(os.path.join(d, "pip", "pip.conf") for d in xdg)]
    files += [
        os.path.join(home, ".pip", "pip.conf"),
        os.path.join(home, ".config", "pip", "pip.conf"),
    ]
    files.append(os.path.join(sys.prefix, "pip.conf"))
    if environ.get("PIP_CONFIG_FILE"):
        files.append(environ["PIP_CONFIG_FILE"])
    return files


def pip_config_flags(environ: Mapping[str, str] | None = None) -> list[str]:
    """pip's configured indexes, find-links and constraints as ``uv pip install`` flags."""
    env = os.environ if environ is None else environ
    values: dict[str, str] = {}
    parser = configparser.RawConfigParser()
    for path in _pip_config_files(env):
        parser.clear()
        try:
            parser.read(path)
        except (configparser.Error, OSError, UnicodeDecodeError):
            continue
        for section in ("global", "install"):
            if parser.has_section(section):
                values.update(parser.items(section))
    for key in ("index-url", "extra-index-url", "find-links", "no-index", "constraint"):
        var = "PIP_" + key.upper().replace("-", "_")
        if env.get(var):
            values[key] = env[var]
    flags: list[str] = []
    if values.get("no-index", "").lower() in ("1", "true", "yes", "on"):
        flags.append("--no-index")
    if values.get("index-url"):
        flags += ["--index-url", values["index-url"].split()[0]]
    for url in values.get("extra-index-url", "").split():
        flags += ["--extra-index-url", url]
    for link in values.get("find-links", "").split():
        flags += ["--find-links", link]
    for path in values.get("constraint", "").split():
        if os.path.exists(path):
            flags += ["--constraint", path]
    return flags


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(req: str) -> str:
    return re.split(r"[\s<>=!~;\[@]", req.strip(), maxsplit=1)[0]


def _failed_package(packages: Sequence[str], log_tail: str) -> str | None:
    """Which requested package the installer's error output is about (None if unclear)."""
    text = _normalize(log_tail)
    for req in packages:
        if req.startswith("-"):
            continue
        name = _normalize(_requirement_name(req))
        if name and re.search(rf"(?<![a-z0-9-]){re.escape(name)}(?![a-z0-9])", text):
            return req
    return None


async def _run(argv: Sequence[str], log: Any, progress: Progress, env: Mapping[str, str]) -> int:
    """Run a command, copying its output to ``log`` and the last line to ``progress``."""
    log.write(f"$ {shlex.join(argv)}\n".encode())
    log.flush()
    p = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=dict(env),
        start_new_session=True,
    )
    assert p.stdout is not None
    try:
        async for line in p.stdout:
            log.write(line)
            text = line.decode(errors="replace").strip()
            if text:
                progress("install", text[:200])
        return await p.wait()
    finally:
        if p.returncode is None:  # cancelled (setup timeout): end the installer's group
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, 9)
            with contextlib.suppress(Exception):
                await p.wait()


async def build(
    spec: Mapping[str, Any],
    env_dir: Path,
    log_path: Path,
    installer: str,
    progress: Progress,
) -> str:
    """Create the environment in ``env_dir`` and install ``spec`` into it; return its python.

    ``spec`` is the normalized form (``packages``, ``install_options``, ``check``). The
    caller holds the per-spec lock; anything left in ``env_dir`` without a ready marker
    is removed first. On any failure the directory is removed again.
    """
    python = env_dir / "bin" / "python"
    if (env_dir / READY).exists():
        return str(python)
    shutil.rmtree(env_dir, ignore_errors=True)
    uv = find_uv() if installer in ("auto", "uv") else None
    if installer == "uv" and uv is None:
        raise PipInstallError(
            "NBCLUSTER_RUNTIME_ENV_INSTALLER=uv but no uv executable was found; install uv "
            "(pip install uv) or set NBCLUSTER_RUNTIME_ENV_INSTALLER=pip"
        )
    packages = list(spec["packages"])
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    ok = False
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        try:
            log.write(f"# runtime_env pip: {packages}\n".encode())
            progress("install", f"creating a virtual environment ({'uv' if uv else 'venv'})")
            if uv:
                venv_cmd = [uv, "venv", "--quiet", "--python", sys.executable, str(env_dir)]
            else:
                venv_cmd = [sys.executable, "-m", "venv", "--without-pip", str(env_dir)]
            if await _run(venv_cmd, log, progress, env) != 0:
                raise PipInstallError(
                    f"creating the virtual environment failed; see the install log {log_path}"
                )
            site_dir = _site_packages(python)
            site_dir.mkdir(parents=True, exist_ok=True)
            (site_dir / "_nbcluster_base.pth").write_text(
                "".join(f"import site; site.addsitedir({d!r})\n" for d in base_site_dirs())
            )
            reqs = env_dir / "requirements.txt"
            reqs.write_text("".join(p + "\n" for p in packages))
            options = list(spec.get("install_options", []))
            progress("install", f"installing {', '.join(packages)} with {'uv' if uv else 'pip'}")
            if uv:
                cmd = [uv, "pip", "install", "--python", str(python), "-r", str(reqs)]
                cmd += pip_config_flags() + options
            else:
                cmd = [str(python), "-m", "pip", "install", "--no-input", "-r", str(reqs), *options]
            code = await _run(cmd, log, progress, env)
            if code == 0 and spec.get("check"):
                check = (
                    [uv, "pip", "check", "--python", str(python)]
                    if uv
                    else [str(python), "-m", "pip", "check"]
                )
                code = await _run(check, log, progress, env)
            if code != 0:
                log.flush()
                tail = _tail(log_path, 30)
                culprit = _failed_package(packages, tail)
                which = (
                    f"the package {culprit!r} could not be installed"
                    if culprit
                    else (f"installing {packages} failed")
                )
                raise PipInstallError(
                    f"runtime_env pip: {which} (exit code {code}). Last lines of the install "
                    f"log:\n{tail}\nFull install log: {log_path}"
                )
            (env_dir / READY).write_text("ok\n")
            ok = True
            progress("install", f"installed {', '.join(packages)}")
            return str(python)
        finally:
            if not ok:
                shutil.rmtree(env_dir, ignore_errors=True)


def _site_packages(python: Path) -> Path:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return python.parent.parent / "lib" / version / "site-packages"


def _tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
