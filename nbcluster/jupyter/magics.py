"""The ``%cluster`` line magic: parse arguments, delegate to nbcluster, return a view.

Load with ``%load_ext nbcluster``. Subcommands::

    %cluster start [--num-cpus N] [--num-gpus N] [--nodes K] [--object-store-memory SIZE]
                   [--max-nodes N [--idle-timeout SECONDS]] [--runtime-env JSON]
                   [--on-interrupt cancel|keep] [--ignore-metadata]
    %cluster connect ADDRESS|auto [--session NAME] [--on-interrupt cancel|keep]
    %cluster keep VAR [VAR ...]
    %cluster status
    %cluster scale N
    %cluster stop
    %cluster widgets
    %cluster output [log|stream]
    %cluster out-refs [keep|clear|last N]
    %cluster rerun [cancel|keep]
    %cluster restart-actors

``%cluster SUBCOMMAND --help`` shows each one's usage. Arguments are parsed with
``argparse`` and typed converters; nothing typed after ``%cluster`` is ever evaluated.

``%cluster start`` records the cluster it starts in the notebook's metadata (through the
JupyterLab extension); ``%cluster start`` without arguments in a notebook that has such a
record starts that cluster again and says so (:mod:`nbcluster.jupyter.notebook_spec`).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import json
import math
import re
import shlex
from typing import Any, NoReturn

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class

from nbcluster import _api, state
from nbcluster._sizing import choose_cluster_size, detect_container_limits
from nbcluster.config import Config
from nbcluster.jupyter import notebook_spec, session
from nbcluster.jupyter.display import ClusterView
from nbcluster.jupyter.hooks import ON_INTERRUPT_CHOICES, KernelHooks
from nbcluster.jupyter.job_magics import load_job_magics, unload_job_magics
from nbcluster.jupyter.memory import parse_out_policy
from nbcluster.jupyter.notebook_spec import ClusterSpec, NotebookMetadataError

__all__ = [
    "ClusterMagics",
    "build_parser",
    "load_ipython_extension",
    "parse_size",
    "unload_ipython_extension",
]

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """``"512MB"`` → 512·10⁶, ``"2GiB"`` → 2·2³⁰, ``"1000"`` → 1000 (bytes).

    Decimal units (kB, MB, GB, TB) are powers of 1000, binary ones (KiB, MiB, GiB, TiB)
    powers of 1024; case does not matter.
    """
    match = _SIZE_RE.match(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _SIZE_UNITS:
        raise argparse.ArgumentTypeError(
            f"invalid size {text!r}: use bytes (1000000) or a number with a unit "
            "(512MB, 2GiB; units: kB MB GB TB KiB MiB GiB TiB)"
        )
    return int(float(match.group(1)) * _SIZE_UNITS[unit])


def _amount(text: str) -> float:
    """A finite, non-negative number of CPUs or GPUs (``2``, ``0.5``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return int(value) if value.is_integer() else value


def _runtime_env(text: str) -> dict[str, Any]:
    """A JSON object: Ray's ``runtime_env`` (``{"env_vars": {...}, "pip": [...]}``)."""
    try:
        value = json.loads(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"not JSON ({err}): {text!r:.60}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(
            'expected a JSON object like \'{"env_vars": {"NAME": "value"}}\''
        )
    return value


def _positive_int(text: str) -> int:
    """A whole number >= 1 (nodes)."""
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1, got {value}")
    return value


class _HelpShown(Exception):
    """``--help`` printed the usage: the magic returns without doing anything."""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser that raises instead of exiting the kernel."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}\n{self.format_usage().strip()}")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if message:
            print(message)
        raise _HelpShown


def build_parser() -> argparse.ArgumentParser:
    """The ``%cluster`` argument parser (one subparser per subcommand)."""
    parser = _Parser(prog="%cluster", description="Start, join, inspect and stop an nbcluster.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    start = sub.add_parser(
        "start",
        help="start a cluster on this machine (re-attaches if one is already connected)",
        description="Start a cluster that ends with this kernel. Re-running it returns the "
        "cluster already connected.",
    )
    start.add_argument("--num-cpus", type=_amount, metavar="N", help="CPUs per node")
    start.add_argument("--num-gpus", type=_amount, metavar="N", help="GPUs per node")
    start.add_argument("--nodes", type=_positive_int, metavar="K", help="node managers (1)")
    start.add_argument(
        "--max-nodes",
        type=_positive_int,
        metavar="N",
        help="let the cluster grow to N nodes under load (autoscaling; idle nodes leave)",
    )
    start.add_argument(
        "--idle-timeout",
        type=_amount,
        metavar="SECONDS",
        help="with --max-nodes: seconds an added node may stay idle (default 60)",
    )
    start.add_argument(
        "--object-store-memory",
        type=parse_size,
        metavar="SIZE",
        help="object store size per node: bytes, or 512MB, 2GiB, ...",
    )
    start.add_argument(
        "--runtime-env",
        type=_runtime_env,
        metavar="JSON",
        help="the job's runtime environment, as Ray's runtime_env (a JSON object)",
    )
    start.add_argument(
        "--ignore-metadata",
        action="store_true",
        help="without arguments: do not start the cluster recorded in the notebook",
    )
    _add_on_interrupt(start)

    connect = sub.add_parser(
        "connect",
        help="join a running cluster",
        description="Join the cluster whose head listens at ADDRESS (host:port), or the newest "
        "cluster on this host with 'auto'.",
    )
    connect.add_argument("address", metavar="ADDRESS", help="host:port of the head, or 'auto'")
    connect.add_argument(
        "--session",
        metavar="NAME",
        help="name this notebook's session: its named actors and named results "
        "(nbcluster.put(value, name=...), %%cluster keep) come back when it connects again "
        "with the same name (after a kernel restart)",
    )
    _add_on_interrupt(connect)

    sub.add_parser("status", help="show the connected cluster", description="Show the cluster.")
    scale = sub.add_parser(
        "scale",
        help="set the number of nodes of the cluster this kernel started",
        description="Add or remove node managers until the cluster has N of them.",
    )
    scale.add_argument("nodes", type=_positive_int, metavar="N", help="number of nodes")
    sub.add_parser(
        "stop",
        help="disconnect, and stop the cluster if this kernel started it",
        description="Disconnect; a cluster this kernel started is stopped.",
    )
    sub.add_parser(
        "widgets", help="show the live dashboard", description="Show the live dashboard."
    )
    output = sub.add_parser(
        "output",
        help="where task output goes: each cell's log area, or plain stream output",
        description="log: one collapsible log area per cell, with filters (the default where "
        "widgets work); stream: task output printed under the cell as plain text. Without "
        "an argument, show the current choice.",
    )
    output.add_argument("mode", nargs="?", choices=("log", "stream"), help="log or stream")
    out_refs = sub.add_parser(
        "out-refs",
        help="what happens to refs kept in Out[n] after each cell",
        description="keep: Out[n] keeps refs (their objects stay in the cluster); clear: "
        "refs in outputs are dropped after every cell; last N: the N most recent outputs "
        "keep theirs (the default is last 10). Without arguments, show the policy.",
    )
    out_refs.add_argument("policy", nargs="*", metavar="keep|clear|last N")
    rerun = sub.add_parser(
        "rerun",
        help="what re-running a cell does to the pending work of its previous run",
        description="cancel (the default): re-running a cell cancels the tasks of its previous "
        "run that are still pending and whose results nothing refers to any more; keep: "
        "leave them. Without an argument, show the choice.",
    )
    rerun.add_argument("policy", nargs="?", choices=("cancel", "keep"))
    keep = sub.add_parser(
        "keep",
        help="keep variables' values in this notebook's session (they come back on connect)",
        description="Copy the values of these variables (or the values their refs point to) "
        "into the session's store on the cluster; %cluster connect ADDRESS --session NAME "
        "puts them back after a kernel restart.",
    )
    keep.add_argument("names", nargs="+", metavar="VAR")
    sub.add_parser(
        "restart-actors",
        help="restart the actors that run an older version of a redefined class",
        description="Kill every actor (held by a notebook variable) made from an older "
        "version of an actor class this notebook redefined, and make it again from the new "
        "class with the same arguments, name and lifetime.",
    )
    return parser


_OUTPUT_TEXT = {
    "log": "each cell's log area (log)",
    "stream": "the cell as plain text (stream)",
}

#: The ``%cluster start`` arguments that shape the cluster (and go into the notebook).
_SHAPE = (
    "num_cpus",
    "num_gpus",
    "nodes",
    "object_store_memory",
    "max_nodes",
    "idle_timeout",
    "runtime_env",
)


def _autoscale_config(spec: ClusterSpec) -> dict[str, Any]:
    """``--max-nodes``/``--idle-timeout`` as config overrides for ``init()``."""
    if spec.max_nodes is None:
        if spec.idle_timeout is not None:
            raise UsageError("%cluster start: --idle-timeout needs --max-nodes N (autoscaling)")
        return {}
    if spec.max_nodes < (spec.nodes or 1):
        raise UsageError(
            f"%cluster start: --max-nodes ({spec.max_nodes}) must be at least --nodes ({spec.nodes})"
        )
    idle = spec.idle_timeout if spec.idle_timeout is not None else 60.0
    return {"autoscale_max_nodes": spec.max_nodes, "autoscale_idle_timeout_s": float(idle)}


def _check_runtime_env_support() -> None:
    if "runtime_env" not in inspect.signature(_api.init).parameters:
        raise UsageError(
            "%cluster start: this nbcluster's init() takes no runtime_env; start without "
            "--runtime-env (or upgrade nbcluster)"
        )


def _add_on_interrupt(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--on-interrupt",
        choices=ON_INTERRUPT_CHOICES,
        default=None,
        help="what interrupting a cell does to the tasks it submitted (default: cancel)",
    )


@magics_class
class ClusterMagics(Magics):
    """``%cluster``: see the module docstring."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.hooks = KernelHooks(shell)
        self._view: ClusterView | None = None
        self._parser = build_parser()

    @line_magic
    def cluster(self, line: str) -> Any:
        """Start, join, inspect, scale or stop a cluster (``%cluster --help``)."""
        try:
            argv = shlex.split(line)
        except ValueError as err:
            raise UsageError(f"%cluster: {err}") from None
        try:
            args = self._parser.parse_args(argv)
        except _HelpShown:
            return None
        return getattr(self, f"_{args.command.replace('-', '_')}")(args)

    # -- subcommands ---------------------------------------------------------------------
    def _start(self, args: argparse.Namespace) -> ClusterView:
        given = [name for name in _SHAPE if getattr(args, name) is not None]
        if state.is_connected():
            view = self._attach(args.on_interrupt)
            if given:
                print(
                    f"nbcluster: already connected to {view.address}; ignored "
                    f"{', '.join('--' + n.replace('_', '-') for n in given)}. "
                    "Run %cluster stop first to start a different cluster."
                )
            return view
        spec = ClusterSpec(**{n: getattr(args, n) for n in given})
        if not given and not args.ignore_metadata:
            spec = self._saved_spec() or spec
        autoscale = _autoscale_config(spec)
        if spec.runtime_env:
            _check_runtime_env_support()
        config = Config.from_env()
        size = choose_cluster_size(
            detect_container_limits(shm_dir=config.store_base_dir),
            nodes=spec.nodes,
            num_cpus=spec.num_cpus,
            object_store_memory=spec.object_store_memory or config.object_store_memory,
        )
        extra: dict[str, Any] = {"runtime_env": spec.runtime_env} if spec.runtime_env else {}
        _api.init(
            num_cpus=size["num_cpus"],
            num_gpus=spec.num_gpus,
            object_store_memory=size["object_store_memory"],
            _nodes=spec.nodes,
            _system_config=autoscale or None,
            **extra,
        )
        print(size["message"])
        if autoscale:
            print(
                f"nbcluster: autoscaling up to {spec.max_nodes} nodes; a node added under load "
                f"leaves after {autoscale['autoscale_idle_timeout_s']:g}s idle"
            )
        # The notebook remembers the CPUs it ran with; the store size only when asked for
        # (memory depends on the machine, and is chosen again where the notebook runs).
        notebook_spec.publish(dataclasses.replace(spec, num_cpus=size["num_cpus"]))
        return self._attach(args.on_interrupt)

    def _saved_spec(self) -> ClusterSpec | None:
        """The cluster recorded in this notebook (said aloud), or None."""
        try:
            found = notebook_spec.find_saved_metadata(self.shell.user_ns)
            if found is None:
                return None
            record, where = found
            spec = notebook_spec.spec_from_metadata(record)
        except NotebookMetadataError as err:
            raise UsageError(
                f"%cluster start: the notebook's nbcluster metadata cannot be used: {err}. "
                "Start with arguments to replace it, or with --ignore-metadata."
            ) from None
        print(f"nbcluster: starting the cluster recorded in {where}: {spec.arguments()}")
        then = record.get("recorded_with") if isinstance(record, dict) else None
        now = notebook_spec.recorded_with()
        if isinstance(then, dict) and then != now:
            was = ", ".join(f"{k} {then.get(k, '?')}" for k in now)
            print(
                f"nbcluster: (recorded with {was}; this kernel has {', '.join(f'{k} {v}' for k, v in now.items())})"
            )
        return spec

    def _connect(self, args: argparse.Namespace) -> ClusterView:
        if state.is_connected():
            current = state.session_info()["address"]
            if args.address not in ("auto", current):
                raise UsageError(
                    f"already connected to {current}; run %cluster stop first to join "
                    f"{args.address}"
                )
            return self._attach(args.on_interrupt)
        if args.session is not None:
            try:
                session.use(args.session)
            except ValueError as err:
                raise UsageError(f"%cluster connect: {err}") from None
            _api.init(address=args.address, namespace=args.session)
            view = self._attach(args.on_interrupt)
            self._resume()
            return view
        _api.init(address=args.address)
        return self._attach(args.on_interrupt)

    def _resume(self) -> None:
        back = session.resume(self.shell.user_ns)
        name = session.current()
        parts = []
        if back["actors"]:
            parts.append(f"actors {', '.join(back['actors'])}")
        if back["results"]:
            parts.append(f"kept results {', '.join(back['results'])}")
        got = "; ".join(parts) if parts else "nothing yet (a new session)"
        print(f"nbcluster: session {name!r}: got back {got}")
        if back["skipped"]:
            print(f"nbcluster: left alone (already defined here): {', '.join(back['skipped'])}")
        if back.get("unbound"):
            named = ", ".join(repr(n) for n in back["unbound"])
            print(f"nbcluster: named results {named}: get them with nbcluster.get_named(NAME)")

    def _keep(self, args: argparse.Namespace) -> None:
        if not state.is_connected() or session.current() is None:
            raise UsageError(
                "%cluster keep needs a session: %cluster connect ADDRESS --session NAME"
            )
        ns = self.shell.user_ns
        missing = [n for n in args.names if n not in ns]
        if missing:
            raise UsageError(f"%cluster keep: no variable {', '.join(missing)}")
        for n in args.names:
            session.keep(n, ns[n])
        print(f"nbcluster: session {session.current()!r} keeps {', '.join(args.names)}")

    def _status(self, args: argparse.Namespace) -> ClusterView | None:
        if not state.is_connected():
            print("nbcluster: not connected; run %cluster start or %cluster connect ADDRESS")
            return None
        return self._attach(None)

    def _scale(self, args: argparse.Namespace) -> ClusterView:
        if not state.is_connected():
            raise UsageError("no cluster: run %cluster start first")
        cluster = state.local_cluster()
        if cluster is None:
            raise UsageError(
                f"this kernel joined the cluster at {state.session_info()['address']} but did "
                "not start it, so it cannot scale it; scale it from the process that started it"
            )
        cluster.scale(args.nodes)
        return self._attach(None)

    def _stop(self, args: argparse.Namespace) -> None:
        if not state.is_connected():
            print("nbcluster: no cluster to stop")
            return
        info = state.session_info()
        session.use(None)
        self.hooks.uninstall()
        self._view = None
        _api.shutdown()
        what = "stopped the cluster" if info["started_here"] else "disconnected from the cluster"
        print(f"nbcluster: {what} at {info['address']}")

    def _widgets(self, args: argparse.Namespace) -> Any:
        try:
            widgets = importlib.import_module("nbcluster.jupyter.widgets")
        except ImportError as err:
            raise UsageError(
                f"the live dashboard is not available ({err}); %cluster status shows the "
                "cluster as text"
            ) from None
        dashboard = getattr(widgets, "dashboard", None)
        if dashboard is None:
            raise UsageError(
                "the live dashboard is not available in this build; "
                "%cluster status shows the cluster as text"
            )
        return dashboard()

    def _rerun(self, args: argparse.Namespace) -> None:
        if args.policy is not None:
            self.hooks.cells.on_rerun = args.policy
        what = {
            "cancel": "cancels the unreferenced pending tasks of its previous run",
            "keep": "leaves the tasks of its previous run alone",
        }[self.hooks.cells.on_rerun]
        print(f"nbcluster: re-running a cell {what} ({self.hooks.cells.on_rerun})")

    def _restart_actors(self, args: argparse.Namespace) -> None:
        if not state.is_connected():
            raise UsageError("no cluster: run %cluster start first")
        if not self.hooks.versions.stale:
            print("nbcluster: no actor runs an older version of a redefined class")
            return
        done = self.hooks.versions.restart()
        if done:
            print(f"nbcluster: restarted {', '.join(done)} on the new code")

    def _out_refs(self, args: argparse.Namespace) -> None:
        if args.policy:
            try:
                self.hooks.out_policy = parse_out_policy(args.policy)
            except ValueError as err:
                raise UsageError(f"%cluster out-refs: {err}") from None
        print(f"nbcluster: {self.hooks.out_policy.describe()} ({self.hooks.out_policy})")

    def _output(self, args: argparse.Namespace) -> None:
        if args.mode is not None:
            self.hooks.output_mode = args.mode
        print(f"nbcluster: task output goes to {_OUTPUT_TEXT[self.hooks.output_mode]}")

    # -- helpers -------------------------------------------------------------------------
    def _attach(self, on_interrupt: str | None) -> ClusterView:
        """The view of the current connection (the same object while it lasts), hooks on."""
        if on_interrupt is not None:
            self.hooks.on_interrupt = on_interrupt  # type: ignore[assignment]
        self.hooks.ensure_installed()
        if self._view is None or not self._view.is_current():
            self._view = ClusterView(_api.ClusterInfo(**state.session_info()))
        return self._view

    def _pre_cell(self, *args: Any) -> None:
        """Before each cell: name it; hook into a connection made with ``nbcluster.init()``."""
        self.hooks.cell_started(args[0] if args else None)
        self.hooks.ensure_installed()

    def _post_cell(self, *args: Any) -> None:
        """After each cell: the cell is over; hook into a connection it made."""
        self.hooks.cell_finished(args[0] if args else None)
        self.hooks.ensure_installed()


def load_ipython_extension(ip: Any) -> None:
    """Register ``%cluster`` (``%load_ext nbcluster``); hook into a connection if one exists."""
    magics = ClusterMagics(ip)
    ip.register_magics(magics)
    load_job_magics(ip)  # %%job / %job (issue 17)
    ip.events.register("pre_run_cell", magics._pre_cell)
    ip.events.register("post_run_cell", magics._post_cell)
    magics.hooks.ensure_installed()


def unload_ipython_extension(ip: Any) -> None:
    """Remove the hooks this extension installed (``%unload_ext nbcluster``)."""
    magics = ip.magics_manager.registry.get("ClusterMagics")
    if magics is None:
        return
    ip.events.unregister("pre_run_cell", magics._pre_cell)
    ip.events.unregister("post_run_cell", magics._post_cell)
    magics.hooks.uninstall()
    ip.magics_manager.registry.pop("ClusterMagics", None)
    ip.magics_manager.magics["line"].pop("cluster", None)
    unload_job_magics(ip)
