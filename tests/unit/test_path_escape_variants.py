"""RELIABILITY S06 without processes: every way a client-given name could leave its root.

The three checks that turn a client's string into a file: a log name (``logfiles.safe_path``,
behind ``state.get_log`` / ``StreamLog`` on the head and the node agents), the notebook or
script path of the Jobs route (``job_handlers._submit``, relative to the server's root), and
the members of an uploaded ``working_dir`` package (``pack.unpack``). Each is tried with
``../``, URL-encoded and double-encoded traversal, an absolute path, a sibling directory
whose name starts with the root's (what a ``startswith()`` check would let through),
backslashes and a UNC path, a NUL byte, and symlinks that point out of the root.
"""

from __future__ import annotations

import itertools
import os
import zipfile
from pathlib import Path

import pytest
from tornado import web

from nbcluster._runtime.jobs import logfiles
from nbcluster._runtime.jobs.state import BadJobRequest, JobTable
from nbcluster._runtime.runtime_env import pack
from nbcluster.jupyter.server.job_handlers import _submit
from nbcluster.jupyter.server.job_models import parse_submit_request, valid_submission_id
from nbcluster.jupyter.server.models import BadRequest

SECRET = "secret-outside-the-root"


@pytest.fixture
def session(tmp_path: Path) -> Path:
    """``session/logs`` (the root) beside a token, a ``logs-evil`` sibling and escaping links."""
    (tmp_path / "token").write_text(SECRET)
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "head.log").write_text("head log\n")
    evil = tmp_path / "logs-evil"
    evil.mkdir()
    (evil / "x.log").write_text(SECRET)
    (logs / "escape.log").symlink_to(tmp_path / "token")
    (logs / "sibling.log").symlink_to(evil / "x.log")
    (logs / "up").symlink_to(tmp_path)
    (logs / "inside.log").symlink_to(logs / "head.log")  # a link inside the root is fine
    return tmp_path


REFUSED_LOG_NAMES = [
    "../token",
    "..",
    ".",
    "",
    "/etc/passwd",
    "{session}/token",  # absolute, into the session
    "../logs-evil/x.log",  # sibling prefix: startswith('.../logs') would accept it
    "{session}/logs-evil/x.log",
    "..\\token",
    "\\\\host\\share\\x.log",  # UNC
    "head.log\0",
    "head.log\0/../../token",
    "~/.ssh/id_rsa",
    "escape.log",  # symlink to the token
    "sibling.log",  # symlink into logs-evil
    "up",  # symlink to the session directory
]


@pytest.mark.parametrize("name", REFUSED_LOG_NAMES)
def test_log_name_variants_are_refused(session: Path, name: str) -> None:
    with pytest.raises(logfiles.BadLogName, match=r"not a log file name"):
        logfiles.safe_path(session / "logs", name.format(session=session))


@pytest.mark.parametrize(
    "name", ["..%2ftoken", "%2e%2e%2ftoken", "%252e%252e%252ftoken", "..%5ctoken", "%00"]
)
def test_encoded_log_names_are_not_decoded(session: Path, name: str) -> None:
    """Nothing decodes a name: an encoded one is a plain (missing) file in the root."""
    path = logfiles.safe_path(session / "logs", name)
    assert path.parent == Path(os.path.realpath(session / "logs"))
    assert not path.exists()


def test_plain_names_and_links_inside_the_root_are_served(session: Path) -> None:
    assert logfiles.safe_path(session / "logs", "head.log").read_text() == "head log\n"
    assert logfiles.safe_path(session / "logs", "inside.log").read_text() == "head log\n"


# -- the Jobs route: a notebook or script path relative to the server's root ------------------


class _Submitted(Exception):
    pass


class _RecordingClient:
    """Stands in for JobSubmissionClient: reaching ``submit_job`` is the failure we look for."""

    def __init__(self) -> None:
        self.calls: list[dict[str, object]] = []

    def submit_job(self, **kwargs: object) -> str:
        self.calls.append(kwargs)
        raise _Submitted


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """``tmp/root`` with ``ok.py``; outside it ``outside.py`` and ``root-evil/x.py``; links out."""
    base = tmp_path / "root"
    (base / "sub").mkdir(parents=True)
    (base / "ok.py").write_text("print('ok')\n")
    (tmp_path / "outside.py").write_text(SECRET)
    (tmp_path / "root-evil").mkdir()
    (tmp_path / "root-evil" / "x.py").write_text(SECRET)
    (base / "link.py").symlink_to(tmp_path / "outside.py")
    (base / "evil").symlink_to(tmp_path / "root-evil")
    return base


SUBMIT_VARIANTS = [
    ("../outside.py", 400),
    ("sub/../../outside.py", 400),
    ("../root-evil/x.py", 400),  # sibling prefix
    ("/../root-evil/x.py", 400),
    ("link.py", 400),  # symlink to a file outside
    ("evil/x.py", 400),  # symlink to the sibling directory
    ("%2e%2e%2foutside.py", 404),  # not decoded: a missing file inside the root
    ("%252e%252e%252foutside.py", 404),
    ("..\\outside.py", 404),  # a backslash is a plain character on POSIX
    ("\\\\host\\share\\x.py", 404),
    ("{tmp}/outside.py", 404),  # absolute: taken relative to the root, so not found
    ("/etc/passwd.py", 404),
]


@pytest.mark.parametrize(("rel", "status"), SUBMIT_VARIANTS)
def test_job_path_variants_are_refused_and_submit_nothing(
    root: Path, rel: str, status: int
) -> None:
    client = _RecordingClient()
    with pytest.raises(web.HTTPError) as err:
        _submit(client, str(root), rel.format(tmp=root.parent))  # type: ignore[arg-type]
    assert err.value.status_code == status
    assert "inside the server's root" in str(err.value) or "no file" in str(err.value)
    assert client.calls == []


def test_job_path_with_a_nul_byte_is_refused_before_any_path_call() -> None:
    with pytest.raises(BadRequest, match=r"not a valid path"):
        parse_submit_request({"path": "ok.py\0/../../outside.py"})


@pytest.mark.parametrize("rel", ["ok.py", "sub/../ok.py", "/ok.py"])
def test_job_paths_inside_the_root_are_submitted(root: Path, rel: str) -> None:
    client = _RecordingClient()
    with pytest.raises(_Submitted):
        _submit(client, str(root), rel)  # type: ignore[arg-type]
    assert client.calls[0]["runtime_env"]["working_dir"] == str(root)  # type: ignore[index]


# -- submission ids (they name the job's log file) --------------------------------------------

BAD_SIDS = ["../x", "..", "/etc/passwd", "a/../../token", "a\\b", "a\0", "abc\n", "%2e%2e"]


@pytest.mark.parametrize("sid", BAD_SIDS)
def test_submission_id_variants_are_refused(sid: str) -> None:
    ids = (f"gen{i}" for i in itertools.count())
    with pytest.raises(BadJobRequest, match=r"is not valid"):
        JobTable().submit(
            entrypoint="python x.py",
            submission_id=sid,
            runtime_env="",
            metadata={},
            num_cpus=0.0,
            num_gpus=0.0,
            resources={},
            now=1.0,
            new_id=lambda: next(ids),
        )
    assert not valid_submission_id(sid)


# -- working_dir packages ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "member", ["../escape.txt", "/tmp/escape.txt", "../dest-evil/escape.txt", "a/../../escape.txt"]
)
def test_package_members_outside_the_destination_are_refused(tmp_path: Path, member: str) -> None:
    with zipfile.ZipFile(tmp_path / "evil.zip", "w") as zf:
        zf.writestr("fine.txt", "x")
        zf.writestr(member, "x")
    with pytest.raises(ValueError, match=r"would land outside"):
        pack.unpack(tmp_path / "evil.zip", tmp_path / "dest")
    assert not (tmp_path / "dest").exists()
    assert not (tmp_path / "escape.txt").exists() and not (tmp_path / "dest-evil").exists()
