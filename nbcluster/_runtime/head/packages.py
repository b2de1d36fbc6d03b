"""The head's store of runtime_env packages: ``<session>/runtime_env/packages/<hash>.zip``.

Packages arrive in chunks (``UploadPackage``) and leave in chunks (``DownloadPackage``, to
the node managers that unpack them). A package is visible only once complete (written to
a temporary name, then renamed). The head never opens the zip: it is opaque bytes here.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from nbcluster._runtime.runtime_env import spec

__all__ = ["PackageStore", "UploadRejected"]

CHUNK = 1 << 20


class UploadRejected(ValueError):
    """An upload that the store refuses (the message says why)."""


class PackageStore:
    """Complete packages on disk, by URI."""

    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, uri: str) -> Path:
        """Where the package with this URI lives (ValueError for a malformed URI)."""
        return self.root / f"{spec.uri_hash(uri)}.zip"

    def size(self, uri: str) -> int | None:
        """The package's size, or None when the store does not have it."""
        try:
            return self.path(uri).stat().st_size
        except FileNotFoundError:
            return None

    async def receive(self, chunks: AsyncIterator[object]) -> tuple[str, int]:
        """Write an upload; return (uri, size). :class:`UploadRejected` on a bad upload."""
        uri = ""
        tmp: Path | None = None
        f = None
        written = 0
        try:
            async for chunk in chunks:
                if f is None:
                    uri = chunk.uri  # type: ignore[attr-defined]
                    try:
                        final = self.path(uri)
                    except ValueError as err:
                        raise UploadRejected(str(err)) from None
                    total = chunk.total_size  # type: ignore[attr-defined]
                    if total > self.max_bytes:
                        raise UploadRejected(
                            f"package {uri} is {total / 2**20:.1f} MiB, over the head's "
                            f"{self.max_bytes / 2**20:.0f} MiB limit "
                            "(NBCLUSTER_RUNTIME_ENV_MAX_PACKAGE_BYTES); exclude large files "
                            "with runtime_env['excludes']"
                        )
                    tmp = final.with_name(f"{final.name}.{os.getpid()}.{id(chunks)}.part")
                    f = open(tmp, "wb")  # noqa: SIM115 - closed below
                if chunk.uri != uri or chunk.offset != written:  # type: ignore[attr-defined]
                    raise UploadRejected("package chunks arrived out of order")
                written += len(chunk.data)  # type: ignore[attr-defined]
                if written > self.max_bytes:
                    raise UploadRejected(f"package {uri} exceeds the size limit")
                f.write(chunk.data)  # type: ignore[attr-defined]
            if f is None or tmp is None:
                raise UploadRejected("an upload without any chunk")
            f.close()
            f = None
            os.replace(tmp, self.path(uri))
            tmp = None
            return uri, written
        finally:
            if f is not None:
                f.close()
            if tmp is not None:
                with contextlib.suppress(FileNotFoundError):
                    tmp.unlink()

    def read(self, uri: str) -> Iterator[tuple[int, int, bytes]]:
        """(offset, total size, bytes) chunks of a stored package (FileNotFoundError if absent)."""
        path = self.path(uri)
        total = path.stat().st_size
        with open(path, "rb") as f:
            offset = 0
            while True:
                data = f.read(CHUNK)
                yield offset, total, data
                offset += len(data)
                if not data or offset >= total:
                    return
