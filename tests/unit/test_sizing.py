"""``nbcluster._sizing``: container limits from (fake) cgroup files, and the sizes chosen."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from nbcluster._sizing import (
    MIN_STORE_BYTES,
    ContainerLimits,
    choose_cluster_size,
    detect_container_limits,
    format_bytes,
)

GiB = 1 << 30
MiB = 1 << 20
HOST_CPUS = 16
HOST_MEMORY = 64 * GiB


def fake_files(files: dict[str, str]) -> Callable[[str], str]:
    """A ``read`` that serves ``files`` and raises FileNotFoundError for anything else."""

    def read(path: str) -> str:
        try:
            return files[path]
        except KeyError:
            raise FileNotFoundError(path) from None

    return read


def detect(files: dict[str, str], shm: int | None = 64 * MiB, **kwargs: object) -> ContainerLimits:
    seen: list[str] = []

    def free_bytes(path: str) -> int | None:
        seen.append(path)
        return shm

    limits = detect_container_limits(
        fake_files(files),
        free_bytes=free_bytes,
        host_cpus=kwargs.pop("host_cpus", HOST_CPUS),  # type: ignore[arg-type]
        host_memory=kwargs.pop("host_memory", HOST_MEMORY),  # type: ignore[arg-type]
        **kwargs,  # type: ignore[arg-type]
    )
    assert seen == [limits.shm_dir]
    return limits


def limits(
    cpus: float = 2,
    memory: int = 2 * GiB,
    shm: int | None = 64 * MiB,
    quota: float | None = 2,
    limit: int | None = 2 * GiB,
) -> ContainerLimits:
    return ContainerLimits(
        cpus=cpus,
        memory=memory,
        shm_free=shm,
        host_cpus=HOST_CPUS,
        host_memory=HOST_MEMORY,
        cpu_quota=quota,
        memory_limit=limit,
    )


# -- detect_container_limits -----------------------------------------------------------------


def test_no_cgroup_files_means_the_host_numbers():
    got = detect({}, shm=None)
    assert got == ContainerLimits(
        cpus=HOST_CPUS,
        memory=HOST_MEMORY,
        shm_free=None,
        host_cpus=HOST_CPUS,
        host_memory=HOST_MEMORY,
    )


def test_cgroup_v2_binder_like_container():
    got = detect(
        {
            "/proc/self/cgroup": "0::/\n",
            "/sys/fs/cgroup/cpu.max": "200000 100000\n",
            "/sys/fs/cgroup/memory.max": f"{2 * GiB}\n",
        }
    )
    assert got.cpus == 2 and got.cpu_quota == 2
    assert got.memory == 2 * GiB and got.memory_limit == 2 * GiB
    assert got.shm_free == 64 * MiB
    assert (got.host_cpus, got.host_memory) == (HOST_CPUS, HOST_MEMORY)


def test_cgroup_v2_max_means_no_limit():
    got = detect(
        {
            "/proc/self/cgroup": "0::/\n",
            "/sys/fs/cgroup/cpu.max": "max 100000\n",
            "/sys/fs/cgroup/memory.max": "max\n",
        }
    )
    assert got.cpu_quota is None and got.memory_limit is None
    assert (got.cpus, got.memory) == (HOST_CPUS, HOST_MEMORY)


def test_cgroup_v2_nested_takes_the_smallest_limit_of_the_cgroup_and_its_ancestors():
    got = detect(
        {
            "/proc/self/cgroup": "0::/kubepods/pod1/c1\n",
            "/sys/fs/cgroup/kubepods/pod1/c1/cpu.max": "50000 100000",
            "/sys/fs/cgroup/kubepods/pod1/c1/memory.max": str(4 * GiB),
            "/sys/fs/cgroup/kubepods/pod1/memory.max": str(1 * GiB),
            "/sys/fs/cgroup/kubepods/cpu.max": "400000 100000",
            "/sys/fs/cgroup/memory.max": "max",
        }
    )
    assert got.cpu_quota == 0.5 and got.cpus == 0.5
    assert got.memory_limit == 1 * GiB and got.memory == 1 * GiB


def test_cgroup_v1_limits():
    got = detect(
        {
            "/proc/self/cgroup": "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/\n",
            "/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "150000\n",
            "/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
            "/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes": str(3 * GiB),
        }
    )
    assert got.cpu_quota == 1.5 and got.cpus == 1.5
    assert got.memory == 3 * GiB


def test_cgroup_v1_seen_from_inside_a_cgroup_namespace_and_unlimited():
    # The process's path (/docker/abc) is not under the mount; the mount root is the cgroup.
    # v1 says "unlimited" with a huge number and a quota of -1.
    got = detect(
        {
            "/proc/self/cgroup": "4:memory:/docker/abc\n2:cpu:/docker/abc\n",
            "/sys/fs/cgroup/cpu/cpu.cfs_quota_us": "-1",
            "/sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000",
            "/sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712",
        }
    )
    assert got.cpu_quota is None and got.memory_limit is None
    assert (got.cpus, got.memory) == (HOST_CPUS, HOST_MEMORY)


def test_cgroup_v1_root_limit_applies_without_proc_self_cgroup():
    got = detect(
        {
            "/sys/fs/cgroup/cpu/cpu.cfs_quota_us": "100000",
            "/sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000",
            "/sys/fs/cgroup/memory/memory.limit_in_bytes": str(512 * MiB),
        }
    )
    assert got.cpu_quota == 1 and got.memory == 512 * MiB


def test_a_quota_above_the_host_and_a_limit_above_ram_change_nothing():
    got = detect(
        {
            "/proc/self/cgroup": "0::/\n",
            "/sys/fs/cgroup/cpu.max": "6400000 100000",
            "/sys/fs/cgroup/memory.max": str(HOST_MEMORY * 2),
        },
        host_cpus=4,
    )
    assert got.cpus == 4 and got.cpu_quota == 64
    assert got.memory == HOST_MEMORY


@pytest.mark.parametrize("cpu_max", ["", "garbage", "0 100000", "100000 0", "x y"])
@pytest.mark.parametrize("memory_max", ["", "-1", "lots", "0"])
def test_unreadable_values_mean_no_limit(cpu_max, memory_max):
    got = detect(
        {
            "/proc/self/cgroup": "0::/\nnot a cgroup line\n",
            "/sys/fs/cgroup/cpu.max": cpu_max,
            "/sys/fs/cgroup/memory.max": memory_max,
        }
    )
    assert got.cpu_quota is None and got.memory_limit is None


def test_shm_dir_and_cgroup_root_are_configurable():
    got = detect(
        {"/proc/self/cgroup": "0::/\n", "/cg/memory.max": str(GiB)},
        shm_dir="/run/shm",
        cgroup_root="/cg",
    )
    assert got.shm_dir == "/run/shm" and got.memory == GiB


def test_on_this_machine_it_reads_something_sensible():
    got = detect_container_limits()
    assert 1 <= got.cpus <= got.host_cpus
    assert 0 < got.memory <= got.host_memory
    assert got.shm_free is None or got.shm_free >= 0


# -- choose_cluster_size -------------------------------------------------------------------


def test_binder_two_cpus_two_gib_and_a_64_mib_shm_gets_a_file_backed_store():
    size = choose_cluster_size(limits())
    assert size["num_cpus"] == 2
    assert size["object_store_memory"] == int(2 * GiB * 0.3)
    assert size["file_backed"] is True
    msg = size["message"]
    assert msg.startswith("nbcluster: 2 CPUs (the container's CPU quota is 2 of the host's 16)")
    assert "614 MiB" in msg and "2 GiB memory limit" in msg
    assert "files on disk" in msg and "/dev/shm has only 64 MiB free" in msg


def test_a_big_shm_holds_the_store_in_shared_memory():
    size = choose_cluster_size(limits(memory=8 * GiB, limit=8 * GiB, shm=8 * GiB))
    assert size["object_store_memory"] == int(8 * GiB * 0.3)
    assert size["file_backed"] is False
    assert "in shared memory (/dev/shm)" in size["message"]


def test_a_shm_holding_more_than_half_shrinks_the_store_to_fit():
    size = choose_cluster_size(limits(memory=4 * GiB, limit=4 * GiB, shm=1 * GiB))
    assert size["object_store_memory"] == int(1 * GiB * 0.9)
    assert size["file_backed"] is False
    assert "made smaller to fit in /dev/shm" in size["message"]


def test_a_missing_shm_means_files():
    size = choose_cluster_size(limits(shm=None))
    assert size["file_backed"] is True
    assert "/dev/shm is missing or not writable" in size["message"]


@pytest.mark.parametrize(("cpus", "expected"), [(0.5, 1), (1.5, 1), (2.0, 2), (7.99999999999, 8)])
def test_cpus_round_down_to_at_least_one(cpus, expected):
    assert choose_cluster_size(limits(cpus=cpus, quota=cpus))["num_cpus"] == expected


def test_no_quota_says_how_many_cpus_the_machine_has():
    size = choose_cluster_size(limits(cpus=HOST_CPUS, quota=None, limit=None, memory=HOST_MEMORY))
    assert size["num_cpus"] == HOST_CPUS
    assert "no CPU quota; this machine has 16" in size["message"]
    assert "of the 64 GiB of memory" in size["message"]


def test_several_nodes_share_the_cpus_and_the_store():
    size = choose_cluster_size(limits(shm=8 * GiB), nodes=3)
    assert size["num_cpus"] == 1
    assert size["object_store_memory"] == int(2 * GiB * 0.3) // 3
    assert size["file_backed"] is False
    assert size["message"].startswith("nbcluster: 3 nodes, each with 1 CPU (")
    assert "shared by 3 nodes" in size["message"] and "split across 3 nodes" in size["message"]


def test_several_nodes_whose_stores_each_fit_are_shrunk_so_together_they_fit():
    # 3 x 205 MiB do not fit in 300 MiB, though each one does: each node would pick shm.
    size = choose_cluster_size(limits(shm=300 * MiB), nodes=3)
    assert size["object_store_memory"] == int(300 * MiB * 0.9) // 3
    assert size["file_backed"] is False


def test_what_the_user_asked_for_wins_and_is_named():
    size = choose_cluster_size(limits(shm=8 * GiB), num_cpus=3, object_store_memory=100 * MiB)
    assert size["num_cpus"] == 3 and size["object_store_memory"] == 100 * MiB
    assert "3 CPUs (--num-cpus)" in size["message"]
    assert "100 MiB (--object-store-memory) in shared memory" in size["message"]
    asked_big = choose_cluster_size(limits(), object_store_memory=GiB)
    assert asked_big["object_store_memory"] == GiB and asked_big["file_backed"] is True


def test_a_tiny_container_still_gets_the_minimum_store():
    size = choose_cluster_size(limits(memory=100 * MiB, limit=100 * MiB, shm=None))
    assert size["object_store_memory"] == MIN_STORE_BYTES


def test_nodes_must_be_positive():
    with pytest.raises(ValueError, match="nodes must be >= 1"):
        choose_cluster_size(limits(), nodes=0)


def test_the_result_carries_the_limits():
    lim = limits()
    assert choose_cluster_size(lim)["limits"] is lim


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (64 * MiB, "64 MiB"),
        (int(1.5 * GiB), "1.5 GiB"),
        (614 * MiB + 1, "614 MiB"),
        (2 * (1 << 40), "2 TiB"),
    ],
)
def test_format_bytes(n, text):
    assert format_bytes(n) == text
