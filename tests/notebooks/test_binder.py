"""Binder runs the tutorials: ``binder/`` is what repo2docker builds from (issue 8, item 3).

No Docker here, so the image is not built. Instead:

- ``repo2docker --no-build --debug .`` renders the Dockerfile, and the test checks that it
  picks the Python build pack with Python 3.11 and installs ``binder/requirements.txt``
  after the whole repository is copied (so its ``.`` line installs this package);
- the files in ``binder/`` are checked (the package, JupyterLab >= 4.6, everything the
  tutorials import; nothing that would make repo2docker ignore ``requirements.txt``);
- the wheel that ``pip install .`` builds is checked to ship the JupyterLab extension and
  the server extension's config, which is how the extension gets installed on Binder.

The repo2docker test is skipped only when ``jupyter-repo2docker`` is not installed.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[2]
BINDER = REPO / "binder"
NOTEBOOKS = REPO / "notebooks"

#: Files that make repo2docker use another build pack, or ignore requirements.txt.
SHADOWING = ["environment.yml", "Pipfile", "Pipfile.lock", "Dockerfile", "default.nix"]


def _requirements() -> list[str]:
    lines = (BINDER / "requirements.txt").read_text().splitlines()
    return [ln.split("#", 1)[0].strip() for ln in lines if ln.split("#", 1)[0].strip()]


def _dist_name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_binder_requirements_install_the_package_and_jupyterlab_4_6():
    reqs = _requirements()
    assert "." in reqs, "without '.', repo2docker does not install this package (binder/ exists)"
    assert "jupyterlab>=4.6,<5" in reqs  # the lab extension is built against JupyterLab 4.6
    names = {_dist_name(r) for r in reqs if r != "."}
    assert {"jupyterlab", "ipywidgets", "anywidget", "plotly", "numpy", "pyarrow"} <= names
    assert (BINDER / "runtime.txt").read_text().strip() == "python-3.11"


def test_nothing_makes_repo2docker_ignore_the_requirements():
    present = [name for name in SHADOWING if (BINDER / name).exists()]
    assert not present, f"repo2docker would use {present} instead of binder/requirements.txt"
    assert not (REPO / ".binder").exists(), "binder/ and .binder/ together are an error"
    post_build = BINDER / "postBuild"
    if post_build.exists():  # not needed today; if one is added it must be runnable
        assert post_build.read_text().startswith("#!"), "postBuild needs a shebang"


def _imports(source: str) -> set[str]:
    code = "\n".join(ln for ln in source.splitlines() if not ln.lstrip().startswith(("%", "!")))
    names: set[str] = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


#: Import names whose distribution is called something else.
IMPORT_TO_DIST = {"sklearn": "scikit-learn", "yaml": "pyyaml", "IPython": "ipython"}


def test_everything_the_tutorials_import_is_installed_on_binder():
    imported: set[str] = set()
    written: set[str] = set()  # modules a tutorial writes itself (e.g. a job's project folder)
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                imported |= _imports(cell.source)
                written |= set(re.findall(r"[\"'/](\w+)\.py[\"']", cell.source))
    third_party = {m for m in imported if m not in sys.stdlib_module_names}
    third_party -= {"nbcluster"} | written
    third_party = {IMPORT_TO_DIST.get(m, m) for m in third_party}
    assert {"numpy", "pyarrow"} <= third_party  # the parse found the imports
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    installed = {_dist_name(r) for r in _requirements() if r != "."}
    installed |= {_dist_name(d) for d in project["dependencies"]}
    missing = sorted(m for m in third_party if m.replace("_", "-") not in installed)
    assert not missing, f"the tutorials import {missing}, which Binder would not install"


def test_readme_has_the_binder_badge_and_launch_link():
    readme = (REPO / "README.md").read_text()
    link = re.search(
        r"https://mybinder\.org/v2/gh/[\w.-]+/[\w.-]+/HEAD\?urlpath=lab/tree/notebooks", readme
    )
    assert link, "README.md has no Binder launch link to notebooks/"
    assert "https://mybinder.org/badge_logo.svg" in readme


@pytest.mark.slow
def test_repo2docker_renders_a_python_3_11_build_that_installs_binder_requirements(tmp_path):
    if importlib.util.find_spec("repo2docker") is None:
        pytest.skip("jupyter-repo2docker is not installed (it is in the test extras)")
    proc = subprocess.run(
        [sys.executable, "-m", "repo2docker", "--no-build", "--debug", str(REPO)],
        cwd=tmp_path,  # repo2docker reads a repo2docker_config from its working directory
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "Building conda environment for python=3.11" in out, out[:2000]
    dockerfile = out[out.index("FROM ") :]
    lines = [ln.strip() for ln in dockerfile.splitlines()]
    # Build script paths are escaped ("." is "-2e", "-" is "-2d", "/" is "-2f").
    unescaped = re.sub(r"-([0-9a-f]{2})", lambda m: chr(int(m[1], 16)), dockerfile)
    assert "environment.py-3.11-linux-64.lock" in unescaped, "not the Python 3.11 environment"
    copy_repo = lines.index("COPY --chown=0:0 src/ ${REPO_DIR}/")
    install = next(
        i
        for i, ln in enumerate(lines)
        if 'pip install --no-cache-dir -r "binder/requirements.txt"' in ln
    )
    # The local reference '.' in the requirements is only resolvable once the repo is copied.
    assert copy_repo < install, "requirements.txt would be installed before the repo is copied"
    assert lines[install].startswith("RUN ${KERNEL_PYTHON_PREFIX}/bin/pip install")
    assert "environment.yml" not in dockerfile and "Pipfile" not in dockerfile


@pytest.mark.slow
def test_the_wheel_ships_the_lab_extension_and_the_server_config(tmp_path):
    # What the '.' line of binder/requirements.txt installs. The wheel build runs the lab
    # extension's build (hatch-jupyter-builder) unless `make labext` already built it.
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(REPO)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    (wheel,) = tmp_path.glob("nbcluster-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    data = f"nbcluster-{version}.data/data/"
    ext = data + "share/jupyter/labextensions/nbcluster/"
    for required in ("package.json", "install.json", "schemas/nbcluster/plugin.json"):
        assert ext + required in names, f"{required} is not in the wheel: {names}"
    assert any(re.fullmatch(re.escape(ext) + r"static/remoteEntry\.\w+\.js", n) for n in names)
    assert data + "etc/jupyter/jupyter_server_config.d/nbcluster.json" in names
