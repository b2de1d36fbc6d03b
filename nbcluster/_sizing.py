"""Size a cluster to the container it runs in: CPU quota, memory limit and ``/dev/shm``.

Binder, Docker and Kubernetes give a notebook a slice of a larger machine. The host's numbers
(``os.cpu_count()``, ``/proc/meminfo``) say 64 CPUs and 256 GB while the container's
cgroup allows 2 CPUs and 2 GB, and Docker and Binder mount a ``/dev/shm`` of 64 MB. A
cluster sized from the host numbers starts 64 workers and plans an object store that cannot
fit. ``%cluster start`` calls the two functions here instead:

- :func:`detect_container_limits` reads the limits: the CPU quota (cgroup v2 ``cpu.max``,
  v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``), the memory limit (v2 ``memory.max``,
  v1 ``memory.limit_in_bytes``), lowered by every ancestor cgroup's limit, and the free
  space of the shared-memory directory. Every file access goes through the ``read`` and
  ``free_bytes`` arguments, so tests give it fake files.
- :func:`choose_cluster_size` turns them into ``num_cpus`` and ``object_store_memory`` per
  node, and a sentence saying what it chose and why.

The rules (:func:`choose_cluster_size`):

- **CPUs**: the CPUs this process may use: the smaller of its affinity mask and the cgroup
  quota, rounded down, at least 1; with several nodes on this host they share them
  (``cpus // nodes`` each, at least 1).
- **Object store**: 30% of the memory this process may use (the smaller of the physical
  RAM and the cgroup limit; the rest is for the kernel and the workers), split across the
  nodes, at least 64 MiB per node. A shared-memory file counts against the container's
  memory limit like any other memory, so the store is never sized from ``/dev/shm`` alone.
- **Where it lives**: in ``/dev/shm`` when 90% of its free space holds the stores of all
  the nodes. When it holds at least half of that, the stores are made smaller to fit there,
  because shared memory is several times faster to write than files. When it holds less
  (Docker's and Binder's 64 MB), the store keeps its size and lives in ordinary files: each
  node manager falls back to files by itself when its store is larger than the free
  ``/dev/shm`` (``prepare_store_dir``), so the store is also shrunk when each node's store
  would fit on its own, lest several nodes overcommit the same ``/dev/shm``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable
from typing import Any

__all__ = [
    "ContainerLimits",
    "choose_cluster_size",
    "detect_container_limits",
    "format_bytes",
]

#: Share of the usable memory given to the object store (all nodes together).
STORE_FRACTION = 0.3
#: Smallest object store per node (the runtime's own minimum, ``store.MIN_CAPACITY``).
MIN_STORE_BYTES = 64 << 20
#: Share of the free shared memory the store may take (the rest is headroom).
SHM_USABLE_FRACTION = 0.9
#: Shrink the store to fit in shared memory if that keeps at least this share of it.
SHM_MIN_SHARE = 0.5
#: cgroup v1 says "no limit" with a huge number (PAGE_COUNTER_MAX × page size).
_UNLIMITED = 1 << 60

Reader = Callable[[str], str]
FreeBytes = Callable[[str], "int | None"]


@dataclasses.dataclass(frozen=True)
class ContainerLimits:
    """What this process may use, as :func:`detect_container_limits` found it.

    ``cpus`` and ``memory`` are the effective amounts (host numbers lowered by the cgroup
    limits); ``cpu_quota`` and ``memory_limit`` are the cgroup limits themselves (``None``:
    no limit). ``shm_free`` is the free space of ``shm_dir`` in bytes (``None``: missing or
    not writable).
    """

    cpus: float
    memory: int
    shm_free: int | None
    host_cpus: int
    host_memory: int
    cpu_quota: float | None = None
    memory_limit: int | None = None
    shm_dir: str = "/dev/shm"


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _free_bytes(path: str) -> int | None:
    """Free bytes of the file system holding ``path``; ``None`` if unusable by this user."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    if not os.access(path, os.W_OK | os.X_OK):
        return None
    return st.f_bavail * st.f_frsize


def _host_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _host_memory() -> int:
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def _cgroup_paths(read: Reader, proc_cgroup: str) -> dict[str, str]:
    """``{controller: path}`` from ``/proc/self/cgroup`` (``""`` is the v2 hierarchy)."""
    try:
        text = read(proc_cgroup)
    except OSError:
        return {}
    paths: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for name in controllers.split(",") if controllers else [""]:
            paths[name] = path
    return paths


def _candidate_dirs(mount: str, rel: str) -> list[str]:
    """The cgroup's directory and its ancestors' under ``mount`` (limits nest), then the mount."""
    out: list[str] = []
    parts = [p for p in rel.strip("/").split("/") if p and p != ".."]
    while parts:
        out.append(os.path.join(mount, *parts))
        parts.pop()
    out.append(mount)
    return out


def _read_all(read: Reader, dirs: list[str], name: str) -> list[str]:
    values = []
    for d in dirs:
        try:
            values.append(read(os.path.join(d, name)).strip())
        except (OSError, UnicodeDecodeError):
            continue
    return values


def _v2_cpu(value: str) -> float | None:
    """``cpu.max``: ``"max 100000"`` (no quota) or ``"200000 100000"`` (2 CPUs)."""
    parts = value.split()
    if not parts or parts[0] == "max":
        return None
    try:
        quota = int(parts[0])
        period = int(parts[1]) if len(parts) > 1 else 100_000
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _memory_value(value: str) -> int | None:
    """``memory.max`` (``"max"`` or bytes) or v1 ``memory.limit_in_bytes``."""
    if not value.isdigit():
        return None
    n = int(value)
    return n if 0 < n < _UNLIMITED else None


def _min(values: list[Any]) -> Any:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _cpu_quota(read: Reader, paths: dict[str, str], root: str) -> float | None:
    quotas: list[float | None] = []
    if "" in paths:  # cgroup v2
        dirs = _candidate_dirs(root, paths[""])
        quotas += [_v2_cpu(v) for v in _read_all(read, dirs, "cpu.max")]
    rel = paths.get("cpu", paths.get("cpuacct", "/"))
    for mount in ("cpu,cpuacct", "cpu"):  # cgroup v1 (either mount name)
        dirs = _candidate_dirs(os.path.join(root, mount), rel)
        for d in dirs:
            q = _read_all(read, [d], "cpu.cfs_quota_us")
            p = _read_all(read, [d], "cpu.cfs_period_us")
            try:
                quota, period = int(q[0]), int(p[0]) if p else 100_000
            except (IndexError, ValueError):
                continue
            quotas.append(quota / period if quota > 0 and period > 0 else None)
    return _min(quotas)


def _memory_limit(read: Reader, paths: dict[str, str], root: str) -> int | None:
    limits: list[int | None] = []
    if "" in paths:  # cgroup v2
        dirs = _candidate_dirs(root, paths[""])
        limits += [_memory_value(v) for v in _read_all(read, dirs, "memory.max")]
    dirs = _candidate_dirs(os.path.join(root, "memory"), paths.get("memory", "/"))
    limits += [_memory_value(v) for v in _read_all(read, dirs, "memory.limit_in_bytes")]
    return _min(limits)


def detect_container_limits(
    read: Reader = _read_text,
    *,
    free_bytes: FreeBytes = _free_bytes,
    host_cpus: int | None = None,
    host_memory: int | None = None,
    shm_dir: str = "/dev/shm",
    proc_cgroup: str = "/proc/self/cgroup",
    cgroup_root: str = "/sys/fs/cgroup",
) -> ContainerLimits:
    """Read the CPU quota, the memory limit and the free shared memory of this process.

    ``read(path)`` returns a file's text and raises ``OSError`` when it is missing;
    ``free_bytes(path)`` returns a directory's free bytes, or ``None`` if it is missing or
    not writable. ``host_cpus`` (default: the affinity mask) and ``host_memory`` (default:
    physical RAM) are the numbers without a container. Missing or unreadable cgroup files
    mean "no limit", so this never fails on a machine without cgroups.
    """
    cpus_host = host_cpus if host_cpus is not None else _host_cpus()
    memory_host = host_memory if host_memory is not None else _host_memory()
    paths = _cgroup_paths(read, proc_cgroup)
    quota = _cpu_quota(read, paths, cgroup_root)
    limit = _memory_limit(read, paths, cgroup_root)
    return ContainerLimits(
        cpus=min(float(cpus_host), quota) if quota is not None else float(cpus_host),
        memory=min(memory_host, limit) if limit is not None else memory_host,
        shm_free=free_bytes(shm_dir),
        host_cpus=cpus_host,
        host_memory=memory_host,
        cpu_quota=quota,
        memory_limit=limit,
        shm_dir=shm_dir,
    )


def format_bytes(n: float) -> str:
    """``64 MiB``, ``1.5 GiB``: binary units, as ``free -h`` and cgroup limits read."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            value = n / size
            digits = 0 if value >= 100 or value.is_integer() else 1
            return f"{value:.{digits}f} {unit}"
    return f"{int(n)} B"


def _fmt_cpus(x: float) -> str:
    return f"{x:g}"


def choose_cluster_size(
    limits: ContainerLimits,
    *,
    nodes: int = 1,
    num_cpus: float | None = None,
    object_store_memory: int | None = None,
) -> dict[str, Any]:
    """Per-node ``num_cpus`` and ``object_store_memory`` for a cluster of ``nodes`` here.

    ``num_cpus`` and ``object_store_memory`` are what the user asked for (``--num-cpus``,
    ``--object-store-memory``); they win over the limits, and the sentence says so.
    Returns ``{"num_cpus", "object_store_memory", "file_backed", "message", "limits"}``:
    ``file_backed`` is True when the store will not fit in shared memory and its node
    will keep it in ordinary files; ``message`` is one sentence for the notebook. See the
    module docstring for the rules.
    """
    if nodes < 1:
        raise ValueError(f"nodes must be >= 1, got {nodes}")
    # -- CPUs -----------------------------------------------------------------------------
    if num_cpus is not None:
        cpus: float = num_cpus
        cpu_why = "--num-cpus"
    else:
        cpus = max(1, math.floor(limits.cpus / nodes + 1e-9))
        if limits.cpu_quota is not None and limits.cpu_quota < limits.host_cpus:
            cpu_why = (
                f"the container's CPU quota is {_fmt_cpus(limits.cpu_quota)} of the host's "
                f"{limits.host_cpus}"
            )
        else:
            cpu_why = f"no CPU quota; this machine has {limits.host_cpus}"
        if nodes > 1:
            cpu_why += f", shared by {nodes} nodes"

    # -- object store ---------------------------------------------------------------------
    shm = limits.shm_free
    usable_shm = int(shm * SHM_USABLE_FRACTION) if shm is not None else 0
    if limits.memory_limit is not None and limits.memory_limit < limits.host_memory:
        mem_why = f"{format_bytes(limits.memory)} memory limit"
    else:
        mem_why = f"{format_bytes(limits.memory)} of memory"
    if object_store_memory is not None:
        store = int(object_store_memory)
        store_why = "--object-store-memory"
    else:
        store = max(MIN_STORE_BYTES, int(limits.memory * STORE_FRACTION) // nodes)
        store_why = f"30% of the {mem_why}"
        if nodes > 1:
            store_why += f", split across {nodes} nodes"
        fits = usable_shm // nodes
        # Shrink to fit in shared memory when that keeps most of the store, and also when
        # each node would pick shared memory anyway (a node checks only its own store).
        if shm is not None and store > fits and (fits >= SHM_MIN_SHARE * store or store <= shm):
            store = max(MIN_STORE_BYTES, fits)
            store_why += f", made smaller to fit in {limits.shm_dir}"
    # What the node manager does: files when its store is larger than the free shm.
    file_backed = shm is None or store > shm
    if file_backed:
        if shm is None:
            where = f"in files on disk, since {limits.shm_dir} is missing or not writable"
        else:
            where = (
                f"in files on disk, since {limits.shm_dir} has only {format_bytes(shm)} free "
                "(slower than shared memory; give the container more, e.g. docker run "
                "--shm-size=1g)"
            )
    else:
        where = f"in shared memory ({limits.shm_dir})"
    cpu_text = f"{_fmt_cpus(cpus)} CPU{'s' if cpus != 1 else ''} ({cpu_why})"
    store_text = f"an object store of {format_bytes(store)} ({store_why}) {where}"
    if nodes > 1:
        message = f"nbcluster: {nodes} nodes, each with {cpu_text} and {store_text}."
    else:
        message = f"nbcluster: {cpu_text} and {store_text}."
    return {
        "num_cpus": cpus,
        "object_store_memory": store,
        "file_backed": file_backed,
        "message": message,
        "limits": limits,
    }
