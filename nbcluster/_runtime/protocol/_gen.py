"""Regenerate (or check) the committed protobuf/gRPC modules.

    python -m nbcluster._runtime.protocol._gen          # rewrite the generated modules
    python -m nbcluster._runtime.protocol._gen --check  # exit 1 when they are stale

The generated modules live beside the ``.proto`` file in ``protos/`` and import each
other by absolute module path, because protoc is run from the repository root.
"""

from __future__ import annotations

import argparse
import difflib
import shutil
import sys
import tempfile
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent / "protos"
REPO_ROOT = PROTO_DIR.parents[3]
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def _protos() -> list[Path]:
    return sorted(PROTO_DIR.glob("*.proto"))


def generate(out_root: Path) -> list[Path]:
    """Run protoc for every ``.proto`` file, writing under ``out_root``; return written files."""
    from grpc_tools import protoc  # build-time dependency only

    rel = [str(p.relative_to(REPO_ROOT)) for p in _protos()]
    args = [
        "grpc_tools.protoc",
        f"-I{REPO_ROOT}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *rel,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    out_dir = out_root / PROTO_DIR.relative_to(REPO_ROOT)
    return sorted(p for p in out_dir.iterdir() if p.name.endswith(GENERATED_SUFFIXES))


def main(argv: list[str] | None = None) -> int:
    """Entry point: regenerate, or with ``--check`` compare against the committed files."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if committed modules are stale")
    ns = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        stale = []
        for path in fresh:
            committed = PROTO_DIR / path.name
            new = path.read_text()
            old = committed.read_text() if committed.exists() else ""
            if new != old:
                stale.append(committed)
                if ns.check:
                    diff = difflib.unified_diff(
                        old.splitlines(),
                        new.splitlines(),
                        str(committed),
                        "fresh",
                        lineterm="",
                        n=1,
                    )
                    print("\n".join(list(diff)[:40]), file=sys.stderr)
                else:
                    shutil.copyfile(path, committed)
        if ns.check and stale:
            names = ", ".join(p.name for p in stale)
            print(
                f"stale generated modules: {names}\n"
                "run: python -m nbcluster._runtime.protocol._gen",
                file=sys.stderr,
            )
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
