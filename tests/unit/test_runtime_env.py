"""runtime_env without processes: validation, inheritance, hashing, packing, pip config."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest

from nbcluster._runtime.runtime_env import pack, pip_env, resolve, spec
from nbcluster._runtime.runtime_env.options import FrozenRuntimeEnv, normalize_runtime_env
from nbcluster._runtime.runtime_env.settings import RuntimeEnvSettings
from nbcluster._runtime.runtime_env.worker import entrypoint_environ
from nbcluster.options import ActorOptions, TaskOptions

# -- validation ---------------------------------------------------------------------------------


def test_validate_keeps_known_keys_and_normalizes_pip() -> None:
    env = spec.validate(
        {
            "env_vars": {"A": "1"},
            "pip": ["requests==2.32.3", "--index-url file:///x"],
            "config": {"setup_timeout_seconds": 30},
            "excludes": ["*.csv"],
        }
    )
    assert env["env_vars"] == {"A": "1"}
    assert env["pip"] == {
        "packages": ["requests==2.32.3", "--index-url file:///x"],
        "install_options": [],
        "check": False,
    }
    assert env["config"] == {"setup_timeout_seconds": 30, "eager_install": True}
    assert spec.validate(None) == {}


@pytest.mark.parametrize(
    ("env", "error", "match"),
    [
        ("x", TypeError, r"runtime_env must be a dict"),
        ({"conda": "env"}, ValueError, r"runtime_env\['conda'\] is not supported.*use 'pip'"),
        ({"colour": 1}, ValueError, r"unknown runtime_env key 'colour'; valid keys: "),
        ({"env_vars": {"A": 1}}, TypeError, r"must be a dict of str to str \(convert numbers"),
        ({"pip": []}, ValueError, r"empty list"),
        ({"pip": ["foo==>1"]}, ValueError, r"'foo==>1' is not a valid requirement"),
        ({"pip": ["a"], "uv": ["b"]}, ValueError, r"both 'pip' and 'uv'"),
        ({"working_dir": "s3://bucket/x.zip"}, ValueError, r"remote URIs are not supported"),
        ({"config": {"setup_timeout_seconds": 0}}, ValueError, r"positive integer"),
        ({"config": {"timeout": 1}}, ValueError, r"unknown key\(s\) \['timeout'\]"),
    ],
)
def test_bad_runtime_envs_name_the_key(env: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        spec.validate(env)


def test_options_check_runtime_env_when_given(tmp_path: Path) -> None:
    opts = TaskOptions().merge(runtime_env={"env_vars": {"A": "1"}})
    assert isinstance(opts.runtime_env, FrozenRuntimeEnv)
    assert hash(opts) == hash(TaskOptions().merge(runtime_env={"env_vars": {"A": "1"}}))
    with pytest.raises(ValueError, match=r"does not exist.*give an existing directory"):
        ActorOptions().merge(runtime_env={"working_dir": str(tmp_path / "missing")})
    assert normalize_runtime_env({}) is None


# -- inheritance ----------------------------------------------------------------------------------


def test_inherit_merges_env_vars_and_replaces_the_rest() -> None:
    parent = {"env_vars": {"A": "a", "B": "b"}, "pip": {"packages": ["x"]}, "working_dir": "p"}
    child = {"env_vars": {"B": "new", "C": "c"}, "working_dir": "c"}
    assert spec.inherit(parent, child) == {
        "env_vars": {"A": "a", "B": "new", "C": "c"},
        "pip": {"packages": ["x"]},
        "working_dir": "c",
    }


def test_job_and_init_envs_conflict_unless_overridden() -> None:
    job = {"env_vars": {"A": "1"}, "working_dir": "pkg://" + "a" * 32 + ".zip"}
    assert spec.merge_job_env(job, {"env_vars": {"B": "2"}}, False)["env_vars"] == {
        "A": "1",
        "B": "2",
    }
    with pytest.raises(ValueError, match=r"conflicts with the job's on env_vars\['A'\]"):
        spec.merge_job_env(job, {"env_vars": {"A": "9"}}, False)
    assert spec.merge_job_env(job, {"env_vars": {"A": "9"}}, True)["env_vars"] == {"A": "9"}


def test_env_hash_ignores_config_and_order() -> None:
    a = {"env_vars": {"A": "1", "B": "2"}, "config": {"setup_timeout_seconds": 5}}
    b = {"env_vars": {"B": "2", "A": "1"}}
    assert spec.env_hash(a) == spec.env_hash(b) != spec.env_hash({"env_vars": {"A": "2"}})
    assert spec.env_hash({}) == "" and spec.env_hash("") == ""


# -- packing ---------------------------------------------------------------------------------------


def _tree(root: Path) -> None:
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("X = 1\n")
    (root / "data").mkdir()
    (root / "data" / "big.csv").write_text("a,b\n" * 100)
    (root / "notes.csv").write_text("x\n")
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "m.pyc").write_bytes(b"\0")
    (root / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(root / "run.sh", 0o755)


def test_scan_honours_excludes_gitignore_and_pycache(tmp_path: Path) -> None:
    _tree(tmp_path)
    (tmp_path / ".gitignore").write_text("notes.csv\n")
    names = [e.arcname for e in pack.scan(tmp_path, ["data/"])]
    assert names == [".gitignore", "pkg/__init__.py", "run.sh"]
    names = [e.arcname for e in pack.scan(tmp_path, ["*.csv", "/pkg"])]
    assert names == [".gitignore", "run.sh"]


def test_exclude_patterns_follow_gitignore_rules() -> None:
    pats = [pack._compile(p) for p in ["*.log", "/top", "build/", "**/tmp/*.bin"]]
    assert pack.matches(pats, "a/b/x.log", False)
    assert pack.matches(pats, "top", True) and not pack.matches(pats, "a/top", True)
    assert pack.matches(pats, "a/build", True) and not pack.matches(pats, "a/build", False)
    assert pack.matches(pats, "x/tmp/y.bin", False) and pack.matches(pats, "tmp/y.bin", False)


def test_content_hash_is_stable_and_sees_changes(tmp_path: Path) -> None:
    _tree(tmp_path)
    h1 = pack.content_hash(pack.scan(tmp_path))
    assert h1 == pack.content_hash(pack.scan(tmp_path))
    os.chmod(tmp_path / "run.sh", 0o644)
    h2 = pack.content_hash(pack.scan(tmp_path))
    (tmp_path / "pkg" / "__init__.py").write_text("X = 2\n")
    h3 = pack.content_hash(pack.scan(tmp_path))
    assert len({h1, h2, h3}) == 3 and len(h1) == 32


def test_zip_round_trip_keeps_modes_and_equal_trees_give_equal_bytes(tmp_path: Path) -> None:
    _tree(tmp_path / "src")
    entries = pack.scan(tmp_path / "src")
    pack.build_zip(entries, tmp_path / "a.zip")
    pack.build_zip(entries, tmp_path / "b.zip")
    assert (tmp_path / "a.zip").read_bytes() == (tmp_path / "b.zip").read_bytes()
    pack.unpack(tmp_path / "a.zip", tmp_path / "out")
    assert (tmp_path / "out" / "pkg" / "__init__.py").read_text() == "X = 1\n"
    assert os.stat(tmp_path / "out" / "run.sh").st_mode & 0o111


def test_unpack_refuses_members_outside_the_destination(tmp_path: Path) -> None:
    with zipfile.ZipFile(tmp_path / "evil.zip", "w") as zf:
        zf.writestr("../escape.txt", "x")
    with pytest.raises(ValueError, match=r"would land outside"):
        pack.unpack(tmp_path / "evil.zip", tmp_path / "dest")
    assert not (tmp_path / "escape.txt").exists() and not (tmp_path / "dest").exists()


def test_oversize_directory_error_names_the_largest_entries(tmp_path: Path) -> None:
    _tree(tmp_path)
    entries = pack.scan(tmp_path)
    with pytest.raises(pack.PackageTooLarge, match=r"over the 0 MiB limit.*data/ \(.*excludes"):
        pack.check_size(entries, 100, "working_dir", str(tmp_path))


def test_uploader_uploads_once_and_again_after_a_change(tmp_path: Path) -> None:
    _tree(tmp_path)
    stored: dict[str, bytes] = {}

    def upload(uri: str, path: str) -> None:
        stored[uri] = Path(path).read_bytes()

    up = resolve.Uploader(lambda uri: uri in stored, upload, 10**6)
    env = resolve.resolve(spec.validate({"working_dir": str(tmp_path)}), up)
    again = resolve.resolve(spec.validate({"working_dir": str(tmp_path)}), up)
    assert env == again and spec.is_package_uri(env["working_dir"]) and up.uploads == 1
    (tmp_path / "pkg" / "__init__.py").write_text("X = 3\n")
    changed = resolve.resolve(spec.validate({"working_dir": str(tmp_path)}), up)
    assert changed != env and up.uploads == 2


def test_requirements_file_is_read_into_packages(tmp_path: Path) -> None:
    req = tmp_path / "requirements.txt"
    req.write_text("# pinned\ntermcolor==3.3.0  # colour\n\ntabulate\n")
    env = resolve.resolve(spec.validate({"pip": str(req)}), None)
    assert env["pip"]["packages"] == ["termcolor==3.3.0", "tabulate"]


# -- pip / uv ---------------------------------------------------------------------------------------


def test_pip_config_becomes_uv_flags(tmp_path: Path) -> None:
    conf = tmp_path / "pip.conf"
    constraints = tmp_path / "c.txt"
    constraints.write_text("x<2\n")
    conf.write_text(
        "[global]\nindex-url = file:///a/simple\nextra-index-url = file:///b file:///c\n"
        f"find-links = /wheels\nconstraint = {constraints}\n"
    )
    flags = pip_env.pip_config_flags({"PIP_CONFIG_FILE": str(conf), "HOME": str(tmp_path)})
    assert flags[flags.index("--index-url") + 1] == "file:///a/simple"
    assert [flags[i + 1] for i, f in enumerate(flags) if f == "--extra-index-url"][-2:] == [
        "file:///b",
        "file:///c",
    ]
    assert "--find-links" in flags and str(constraints) in flags
    env_flags = pip_env.pip_config_flags({"PIP_NO_INDEX": "1", "PIP_CONFIG_FILE": str(conf)})
    assert "--no-index" in env_flags


def test_failed_package_is_named_from_the_installer_output() -> None:
    tail = "× No solution found\n  ╰─▶ Because nonexistent-pkg-xyz was not found in the registry"
    assert pip_env._failed_package(["termcolor", "nonexistent_pkg_xyz==1.0"], tail) == (
        "nonexistent_pkg_xyz==1.0"
    )
    assert pip_env._failed_package(["termcolor"], "network is down") is None


def test_settings_read_and_check_the_variables(tmp_path: Path) -> None:
    s = RuntimeEnvSettings.from_env(str(tmp_path), {"NBCLUSTER_RUNTIME_ENV_INSTALLER": "pip"})
    assert s.installer == "pip" and s.cache_dir == str(tmp_path / "runtime_resources")
    with pytest.raises(ValueError, match=r"INSTALLER must be one of auto, uv, pip"):
        RuntimeEnvSettings.from_env("/t", {"NBCLUSTER_RUNTIME_ENV_INSTALLER": "conda"})
    with pytest.raises(ValueError, match=r"MAX_PACKAGE_BYTES must be a number of bytes"):
        RuntimeEnvSettings.from_env("/t", {"NBCLUSTER_RUNTIME_ENV_MAX_PACKAGE_BYTES": "1MB"})


def test_entrypoint_environment_puts_paths_and_venv_first() -> None:
    worker_json = (
        '{"env_vars": {"A": "1"}, "working_dir": "/wd", "py_paths": ["/m"], '
        '"python": "/venv/bin/python", "runtime_env": "{}"}'
    )
    env, cwd = entrypoint_environ(worker_json, {"PATH": "/usr/bin", "PYTHONPATH": "/old"})
    assert cwd == "/wd" and env["A"] == "1"
    assert env["PYTHONPATH"] == os.pathsep.join(["/wd", "/m", "/old"])
    assert env["PATH"].split(os.pathsep)[0] == "/venv/bin" and env["VIRTUAL_ENV"] == "/venv"


# --------------------------------------------------------------------------- driver state


class _Client:
    """Stands for a core client: the driver keeps one environment state per client."""


def test_each_client_keeps_its_own_environment_state_when_they_alternate() -> None:
    from nbcluster._runtime.runtime_env import driver as env_driver

    a, b = _Client(), _Client()
    env_driver.set_job_env(a, '{"env_vars": {"A": "1"}}')
    for _ in range(2):  # (the last client's state is found without the lock: alternate)
        assert env_driver.for_submit(a, None) == '{"env_vars": {"A": "1"}}'
        assert env_driver.for_submit(b, None) == ""
    assert env_driver.process_env(a) == '{"env_vars": {"A": "1"}}'


def test_a_new_client_never_gets_a_gone_clients_environment() -> None:
    import gc

    from nbcluster._runtime.runtime_env import driver as env_driver

    old = _Client()
    env_driver.set_job_env(old, '{"env_vars": {"OLD": "1"}}')
    assert env_driver.for_submit(old, None) == '{"env_vars": {"OLD": "1"}}'
    del old
    gc.collect()
    assert env_driver.for_submit(_Client(), None) == ""
