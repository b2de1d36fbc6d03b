"""``%%job``: run a cell as a job on the cluster; ``%job attach ID`` follows one again.

::

    %%job [--address A] [--submission-id ID] [--runtime-env-json JSON]
          [--entrypoint-num-cpus N] [--no-working-dir] [--wait]
    <python code>

    %job attach ID [--address A] [--wait]      %job stop ID      %job list

The cell's code runs as ``python -m <module>`` under the cluster's job supervisor, with
the kernel's working directory as ``working_dir`` (so files next to the notebook import),
as a driver of the cluster (``nbcluster.init()`` inside it joins). The cell shows the job's
status and its log live (a widget, updated from a thread, that keeps working after the cell
finished); ``--wait`` prints the log in the cell and returns when the job ends instead.
After a kernel restart, ``%job attach ID`` shows a job again. Arguments are parsed with
argparse; nothing typed after ``%job`` is evaluated.
"""

from __future__ import annotations

import argparse
import hashlib
import html
import json
import os
import shlex
import tempfile
import threading
from pathlib import Path
from typing import Any, NoReturn

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class

from nbcluster.job_submission import JobDetails, JobStatus, JobSubmissionClient

__all__ = ["JobMagics", "JobView", "build_job_parser", "load_job_magics", "unload_job_magics"]

_COLOURS = {
    "PENDING": "#9e9e9e",
    "RUNNING": "#1976d2",
    "SUCCEEDED": "#2e7d32",
    "FAILED": "#c62828",
    "STOPPED": "#ef6c00",
}
_CELL_EXCLUDES = [".ipynb_checkpoints/", ".git/", "__pycache__/"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"%job: {message}\n{self.format_usage()}")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise UsageError(message or self.format_usage())


def build_job_parser() -> argparse.ArgumentParser:
    """The argument parser of ``%%job`` (cell) and ``%job`` (line)."""
    p = _Parser(prog="%job", add_help=True)
    p.add_argument("command", nargs="?", default="", help="attach | stop | list (line magic)")
    p.add_argument("submission_id_arg", nargs="?", default="", metavar="ID")
    p.add_argument("--address", default=None, help="HOST:PORT of the cluster's head")
    p.add_argument("--submission-id", default="", help="id of the new job")
    p.add_argument("--runtime-env-json", default="", help="runtime_env as JSON")
    p.add_argument("--entrypoint-num-cpus", type=float, default=None)
    p.add_argument("--no-working-dir", action="store_true", help="do not ship the kernel's cwd")
    p.add_argument("--wait", action="store_true", help="print the log and return at the end")
    return p


def _status_line(info: JobDetails) -> str:
    dur = info.duration_s
    text = f"job {info.submission_id}: {info.status.value}"
    if dur is not None:
        text += f" ({dur:.1f}s)"
    if info.status == JobStatus.FAILED and info.message:
        text += f" — {info.message.splitlines()[0]}"
    return text


class JobView:
    """A job shown in a cell: its status and log, live, with a stop button."""

    def __init__(self, client: JobSubmissionClient, submission_id: str) -> None:
        self.client = client
        self.submission_id = submission_id
        self.log = ""
        self.info: JobDetails = client.get_job_info(submission_id)
        self._widget: Any = None
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()

    # -- text ------------------------------------------------------------------------------
    def __repr__(self) -> str:
        return _status_line(self.info)

    def _repr_html_(self) -> str:
        colour = _COLOURS.get(self.info.status.value, "#000")
        return (
            f"<div><b>job {html.escape(self.submission_id)}</b> "
            f"<span style='color:{colour}'>{self.info.status.value}</span>"
            f"<pre style='max-height:20em;overflow:auto'>{html.escape(self.log[-20000:])}</pre></div>"
        )

    def wait(self, echo: bool = True) -> JobDetails:
        """Follow the log until the job ends (printing it when ``echo``); return its info."""
        for text in self.client.iter_job_logs(self.submission_id, offset=len(self.log.encode())):
            self.log += text
            if echo:
                print(text, end="", flush=True)
        self.info = self.client.get_job_info(self.submission_id)
        if not self.info.status.is_terminal():
            self.client.wait_until_finished(self.submission_id, timeout=30)
            self.info = self.client.get_job_info(self.submission_id)
        if echo:
            print(_status_line(self.info), flush=True)
        return self.info

    # -- widget ------------------------------------------------------------------------------
    def _ipython_display_(self) -> None:
        from IPython.display import display

        try:
            import ipywidgets as widgets
        except ImportError:  # pragma: no cover - ipywidgets is a dependency
            display({"text/plain": repr(self), "text/html": self._repr_html_()}, raw=True)
            return
        status = widgets.HTML(self._status_html())
        out = widgets.Output(
            layout={"max_height": "24em", "overflow": "auto", "border": "1px solid #ddd"}
        )
        stop = widgets.Button(description="Stop", button_style="warning", icon="stop")
        stop.on_click(lambda _: self.client.stop_job(self.submission_id))
        self._widget = (status, out, stop)
        display(widgets.VBox([widgets.HBox([status, stop]), out]))
        self._thread = threading.Thread(target=self._follow, name="nbcluster-job-view", daemon=True)
        self._thread.start()

    def _status_html(self) -> str:
        colour = _COLOURS.get(self.info.status.value, "#000")
        dur = self.info.duration_s
        extra = f" · {dur:.1f}s" if dur is not None else ""
        return (
            f"<b>job {html.escape(self.submission_id)}</b> "
            f"<span style='color:{colour};font-weight:bold'>{self.info.status.value}</span>{extra}"
        )

    def _follow(self) -> None:
        status, out, stop = self._widget
        ticker = threading.Thread(target=self._tick, daemon=True)
        ticker.start()
        try:
            for text in self.client.iter_job_logs(
                self.submission_id, offset=len(self.log.encode())
            ):
                self.log += text
                out.append_stdout(text)
        except Exception as err:  # noqa: BLE001 - shown in the view, never raised in a thread
            out.append_stderr(f"(stopped following: {err})\n")
        self._stopped.set()
        ticker.join(2)
        self.info = self.client.get_job_info(self.submission_id)
        status.value = self._status_html()
        stop.disabled = True

    def _tick(self) -> None:
        status = self._widget[0]
        while not self._stopped.wait(0.5):
            try:
                self.info = self.client.get_job_info(self.submission_id)
            except Exception:  # noqa: BLE001 - keep the last known status
                continue
            status.value = self._status_html()


@magics_class
class JobMagics(Magics):
    """``%%job`` and ``%job``."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.parser = build_job_parser()
        self._clients: dict[str | None, JobSubmissionClient] = {}

    def _client(self, address: str | None) -> JobSubmissionClient:
        client = self._clients.get(address)
        if client is None:
            try:
                client = self._clients[address] = JobSubmissionClient(address)
            except (ConnectionError, ValueError) as err:
                raise UsageError(f"%job: {err}") from None
        return client

    def _parse(self, line: str) -> argparse.Namespace:
        try:
            return self.parser.parse_args(shlex.split(line))
        except ValueError as err:
            raise UsageError(f"%job: {err}") from None

    @line_cell_magic
    def job(self, line: str, cell: str | None = None) -> Any:
        """Run the cell as a job (``%%job``), or ``%job attach|stop|list``."""
        args = self._parse(line)
        if cell is None:
            return self._line(args)
        if args.command:
            raise UsageError("%%job takes options only; the cell is the code to run")
        return self._submit(args, cell)

    def _submit(self, args: argparse.Namespace, cell: str) -> Any:
        runtime_env: dict[str, Any] = {}
        if args.runtime_env_json:
            try:
                runtime_env = json.loads(args.runtime_env_json)
            except ValueError as err:
                raise UsageError(f"%%job: --runtime-env-json is not JSON: {err}") from None
        digest = hashlib.sha256(cell.encode()).hexdigest()[:12]
        module = f"nbcluster_cell_{digest}"
        folder = Path(tempfile.mkdtemp(prefix="nbcluster-cell-"))
        (folder / f"{module}.py").write_text(cell)
        runtime_env.setdefault("py_modules", []).append(str(folder / f"{module}.py"))
        if not args.no_working_dir:
            runtime_env.setdefault("working_dir", os.getcwd())
            runtime_env.setdefault("excludes", []).extend(_CELL_EXCLUDES)
        client = self._client(args.address)
        try:
            sid = client.submit_job(
                entrypoint=f"python -m {module}",
                runtime_env=runtime_env,
                submission_id=args.submission_id or None,
                entrypoint_num_cpus=args.entrypoint_num_cpus,
                metadata={"source": "%%job", "cwd": os.getcwd()},
            )
        except (ValueError, TypeError, RuntimeError) as err:
            raise UsageError(f"%%job: {err}") from None
        view = JobView(client, sid)
        if args.wait:
            view.wait()
            return None
        return view

    def _line(self, args: argparse.Namespace) -> Any:
        client = self._client(args.address)
        sid = args.submission_id_arg
        if args.command == "list":
            rows = [
                f"{j.submission_id or j.job_id:<28} {j.status.value:<10} {j.entrypoint[:50]}"
                for j in client.list_jobs()
            ]
            print("\n".join(rows) or "(no jobs)")
            return None
        if args.command not in ("attach", "stop"):
            raise UsageError("%job: use %%job (cell) to submit, or %job attach|stop ID, %job list")
        if not sid:
            raise UsageError(f"%job {args.command}: give the job's submission id")
        try:
            if args.command == "stop":
                stopped = client.stop_job(sid)
                print(f"job {sid}: {'stop requested' if stopped else 'already ended'}")
                return None
            view = JobView(client, sid)
        except RuntimeError as err:
            raise UsageError(f"%job: {err}") from None
        if args.wait:
            view.wait()
            return None
        return view


def load_job_magics(ip: Any) -> None:
    """Register ``%%job`` / ``%job`` (called by ``%load_ext nbcluster``)."""
    ip.register_magics(JobMagics(ip))


def unload_job_magics(ip: Any) -> None:
    """Remove ``%%job`` / ``%job`` (``%unload_ext nbcluster``)."""
    ip.magics_manager.registry.pop("JobMagics", None)
    ip.magics_manager.magics["line"].pop("job", None)
    ip.magics_manager.magics["cell"].pop("job", None)
