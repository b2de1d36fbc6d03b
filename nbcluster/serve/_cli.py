"""``nbcluster serve run|status|deploy|shutdown``: Serve from a shell (Ray's ``serve`` CLI).

    nbcluster serve run module:app [--name N] [--route-prefix P] [--port N] [--non-blocking]
    nbcluster serve deploy config.yaml
    nbcluster serve status [--json]
    nbcluster serve shutdown [-y]

Every command joins the newest local cluster (``--address HOST:PORT`` for another one).
``serve run`` starts a private cluster when there is none and, blocking (the default),
shuts it down again on Ctrl-C; ``--non-blocking`` needs a running cluster (``nbcluster
start --head``) since the app must outlive the command.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import nbcluster
from nbcluster.serve import _api as serve
from nbcluster.serve._config_file import ConfigError, apply_overrides, load_target, parse_config

__all__ = ["add_subcommands", "main"]


def add_subcommands(subparsers: Any) -> None:
    """Register ``nbcluster serve ...`` on the ``nbcluster`` command's subparsers."""
    serve_p = subparsers.add_parser("serve", help="deploy and manage Serve applications")
    sub = serve_p.add_subparsers(dest="serve_command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--address", default="", help="HOST:PORT of the head (default: newest local cluster)"
        )

    p = sub.add_parser("run", help="deploy an application (module:attribute) and serve it")
    common(p)
    p.add_argument("import_path", help="module:app, where app is Deployment.bind(...) or a builder")
    p.add_argument("args", nargs="*", help="key=value arguments for an application builder")
    p.add_argument("--name", default="default", help="application name (default 'default')")
    p.add_argument("--route-prefix", default="/", help="HTTP route prefix (default '/')")
    p.add_argument("--host", default=None, help="proxy host when Serve starts (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="proxy port when Serve starts (8000)")
    p.add_argument("--app-dir", default=".", help="directory to import the module from")
    p.add_argument(
        "--non-blocking", action="store_true", help="return once deployed (needs a running cluster)"
    )
    p.set_defaults(fn=cmd_run)
    p = sub.add_parser("deploy", help="deploy the applications of a config file (declarative)")
    common(p)
    p.add_argument("config_file", help="YAML file in Ray Serve's config schema")
    p.add_argument("--app-dir", default=".", help="directory to import modules from")
    p.set_defaults(fn=cmd_deploy)
    p = sub.add_parser("status", help="applications, deployments and replicas")
    common(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(fn=cmd_status)
    p = sub.add_parser("shutdown", help="delete every application and stop Serve")
    common(p)
    p.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    p.set_defaults(fn=cmd_shutdown)


def _connect(address: str, *, start: bool = False) -> bool:
    """Join a cluster; with ``start``, start a private one when none runs. True if started."""
    try:
        nbcluster.init(address=address or "auto")
        return False
    except ConnectionError:
        if address or not start:
            raise
    nbcluster.init()
    return True


def _parse_args(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"nbcluster serve run: arguments must be key=value, got {pair!r}")
        out[key] = value
    return out


def cmd_run(args: argparse.Namespace) -> int:
    """``nbcluster serve run``."""
    try:
        started = _connect(args.address, start=not args.non_blocking)
    except ConnectionError as e:
        print(f"nbcluster serve run: {e}", file=sys.stderr)
        return 1
    try:
        try:
            app = load_target(args.import_path, _parse_args(args.args), args.app_dir)
        except ConfigError as e:
            print(f"nbcluster serve run: {e}", file=sys.stderr)
            return 1
        http: dict[str, Any] = {}
        if args.host is not None:
            http["host"] = args.host
        if args.port is not None:
            http["port"] = args.port
        serve.start(http_options=http or None)
        prefix = None if args.route_prefix.lower() in ("none", "null", "") else args.route_prefix
        serve.run(app, name=args.name, route_prefix=prefix, _display=False)
        if args.non_blocking:
            return 0
        print("Serving; press Ctrl-C to stop.", flush=True)
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            print("\nShutting down.", flush=True)
        if started:
            serve.shutdown()
        else:
            serve.delete(args.name)
        return 0
    finally:
        nbcluster.shutdown()


def cmd_deploy(args: argparse.Namespace) -> int:
    """``nbcluster serve deploy``: apply a config file; apps not in it are deleted."""
    import yaml

    try:
        with open(args.config_file) as f:
            config = parse_config(yaml.safe_load(f))
        apps = [
            (a, apply_overrides(load_target(a.import_path, a.args, args.app_dir), a.deployments))
            for a in config.applications
        ]
    except (OSError, yaml.YAMLError, ConfigError) as e:
        print(f"nbcluster serve deploy: {e}", file=sys.stderr)
        return 1
    try:
        _connect(args.address)
    except ConnectionError as e:
        print(f"nbcluster serve deploy: {e}", file=sys.stderr)
        return 1
    try:
        serve.start(http_options=config.http_options, proxy_location=config.proxy_location)
        wanted = {a.name for a, _ in apps}
        for name in serve.status().applications:
            if name not in wanted:
                serve.delete(name)
        for a, app in apps:
            serve.run(app, name=a.name, route_prefix=a.route_prefix, _display=False)
        print(f"Deployed {len(apps)} application(s): {', '.join(sorted(wanted))}")
        return 0
    except (RuntimeError, ValueError, TypeError) as e:
        print(f"nbcluster serve deploy: {e}", file=sys.stderr)
        return 1
    finally:
        nbcluster.shutdown()


def format_status(st: Any) -> str:
    """``serve.status()`` as text."""
    lines = []
    if st.proxy_urls:
        lines.append("proxies: " + ", ".join(sorted(st.proxy_urls.values())))
    if not st.applications:
        lines.append("no applications")
    for name, app in st.applications.items():
        route = app.route_prefix if app.route_prefix is not None else "(no route)"
        lines.append(f"{name}: {app.status.value}  route {route}")
        if app.message:
            lines.append("  " + app.message.replace("\n", "\n  "))
        for dname, d in app.deployments.items():
            states = ", ".join(f"{n} {s.value}" for s, n in d.replica_states.items()) or "none"
            stats = f"{d.requests_per_s:.1f} req/s"
            if d.p50_ms is not None:
                stats += f", p50 {d.p50_ms:.1f} ms, p99 {d.p99_ms:.1f} ms"
            lines.append(
                f"  {dname}: {d.status.value}  replicas: {states}  ({stats}, {d.errors} errors)"
            )
    return "\n".join(lines)


def cmd_status(args: argparse.Namespace) -> int:
    """``nbcluster serve status``."""
    try:
        _connect(args.address)
    except ConnectionError as e:
        print(f"nbcluster serve status: {e}", file=sys.stderr)
        return 1
    try:
        st = serve.status()
        print(json.dumps(st.to_dict(), indent=2) if args.json else format_status(st))
        return 0
    finally:
        nbcluster.shutdown()


def cmd_shutdown(args: argparse.Namespace) -> int:
    """``nbcluster serve shutdown``."""
    if not args.yes and sys.stdin.isatty():
        answer = input("This deletes every Serve application on the cluster. Continue? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            return 1
    try:
        _connect(args.address)
    except ConnectionError as e:
        print(f"nbcluster serve shutdown: {e}", file=sys.stderr)
        return 1
    try:
        serve.shutdown()
        print("Serve is shut down.")
        return 0
    finally:
        nbcluster.shutdown()


def main(argv: list[str] | None = None) -> int:
    """``python -m nbcluster.serve._cli ...`` (the same as ``nbcluster serve ...``)."""
    parser = argparse.ArgumentParser(prog="nbcluster")
    add_subcommands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.fn(args))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
