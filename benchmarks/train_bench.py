"""Distributed training: nbcluster.train beside plain torch.distributed and Ray Train, in one run
(issue 15, item 7).

    python benchmarks/train_bench.py                 # every installed system, full sizes
    python benchmarks/train_bench.py --quick         # small sizes: a smoke run
    python benchmarks/train_bench.py --only nbcluster,torch --json train.json

Each system runs in its own fresh subprocess with 2 workers on one node (2 CPUs, one per
worker; every worker uses one torch thread, as Ray Train and nbcluster set it). Workloads:

- **epoch**: the FashionMNIST-style program (an MLP over 1x28x28 images, 10 classes;
  generated images through a ``Dataset``/``DataLoader`` with a ``DistributedSampler``, a
  ``DistributedDataParallel`` model, SGD) for a few epochs; the per-epoch time is measured
  by rank 0 inside the loop (from the start of an epoch to the end of its ``report``), the
  median over the epochs after the first. ``torch`` is the same loop body in 2 processes
  started with ``torch.multiprocessing.spawn`` and a gloo process group, reporting nothing:
  the overhead of a trainer is its per-epoch time over this one (target <= 2 %; Ray
  publishes <= 2.5 %).
- **first report**: ``fit()`` of a function whose first statement is a ``report``; the
  time from ``fit()`` to that report (written by the loop with the wall clock) and to the
  end of ``fit()``. ``cold``: the first ``fit()`` after ``init()`` (the worker group is
  started); ``warm``: the next ``fit()`` with the same scaling config (nbcluster reuses the
  group; Ray starts a new one each time). nbcluster's targets: <= 2 s cold, <= 0.3 s warm,
  >= 3x faster than Ray to the first report and to the end. The cluster has exactly the 2
  CPUs the workers reserve; nbcluster is also measured on a cluster with 4 CPUs (rows "room
  for 2 groups"), where the warm run's placement group need not wait for the CPUs the
  previous run just gave back (the head places a group only after the node's next report,
  up to 1 s later: a core matter, see the report of issue 15).
- **checkpoint**: rank 0 saves a tensor of ``--checkpoint-mb`` MB and reports it as a
  checkpoint (copied into the run's storage before ``report`` returns); the driver then
  restores it (``to_directory`` + ``torch.load``). MB/s of the save, the restore and both;
  ``copy`` is a plain ``shutil.copy`` of the same file, for scale.

The machine this runs on is often shared: only figures from the same run compare.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import _harness

NUM_WORKERS = 2
SYSTEMS = ("nbcluster", "torch", "ray")
LABELS = {"nbcluster": "nbcluster", "torch": "torch.distributed", "ray": "Ray Train"}


@dataclass
class Sizes:
    images: int = 8192
    batch_size: int = 64
    epochs: int = 6
    hidden: int = 512
    checkpoint_mb: int = 200
    system_timeout_s: int = 900

    @classmethod
    def quick(cls) -> Sizes:
        return cls(images=2048, epochs=3, hidden=128, checkpoint_mb=20, system_timeout_s=300)


# --------------------------------------------------------------------------- the program


def make_loader(images: int, batch_size: int, distributed: bool, rank: int = 0, world: int = 1):
    """FashionMNIST's shape, generated (class ``c``: a bright band at rows 2c..2c+3)."""
    import torch
    from torch.utils.data import DataLoader, Dataset

    class FakeFashion(Dataset):
        def __init__(self, n: int) -> None:
            g = torch.Generator().manual_seed(0)
            self.labels = torch.randint(0, 10, (n,), generator=g)
            self.noise = torch.rand(n, 1, 28, 28, generator=g) * 0.5

        def __len__(self) -> int:
            return len(self.labels)

        def __getitem__(self, i: int):
            x = self.noise[i].clone()
            c = int(self.labels[i])
            x[0, 2 * c : 2 * c + 4, :] += 1.0
            return x, self.labels[i]

    loader = DataLoader(FakeFashion(images), batch_size=batch_size, shuffle=True)
    if distributed:
        from torch.utils.data import DistributedSampler

        sampler = DistributedSampler(loader.dataset, num_replicas=world, rank=rank, shuffle=True)
        loader = DataLoader(loader.dataset, batch_size=batch_size, sampler=sampler)
    return loader


def make_model(hidden: int):
    from torch import nn

    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(28 * 28, hidden),
        nn.ReLU(),
        nn.Dropout(0.25),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Dropout(0.25),
        nn.Linear(hidden, 10),
    )


def run_epochs(model, loader, epochs: int, report, world: int) -> list[float]:
    """The training loop shared by every system; returns rank-local epoch times."""
    import torch
    from torch import nn

    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    times = []
    for epoch in range(epochs):
        t = time.perf_counter()
        if world > 1:
            loader.sampler.set_epoch(epoch)
        model.train()
        total, correct, n = 0.0, 0, 0
        for X, y in loader:
            pred = model(X)
            loss = loss_fn(pred, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(y)
            correct += (pred.argmax(1) == y).sum().item()
            n += len(y)
        report({"loss": total / n, "accuracy": correct / n, "epoch": epoch})
        times.append(time.perf_counter() - t)
    return times


def trainer_epoch_loop(config: dict) -> Any:
    """For TorchTrainer (nbcluster or Ray): the module name of the API is in config."""
    import importlib

    import torch

    torch.set_num_threads(1)
    api = importlib.import_module(config["api"])
    ttorch = importlib.import_module(config["api"] + ".torch")
    ctx = api.get_context()
    loader = ttorch.prepare_data_loader(
        make_loader(config["images"], config["batch_size"], distributed=False)
    )
    model = ttorch.prepare_model(make_model(config["hidden"]))
    times = run_epochs(model, loader, config["epochs"], api.report, ctx.get_world_size())
    if ctx.get_world_rank() == 0:
        Path(config["out"]).write_text(json.dumps(times))


def _torch_worker(rank: int, world: int, port: int, config: dict) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    dist.init_process_group("gloo", rank=rank, world_size=world)
    loader = make_loader(config["images"], config["batch_size"], True, rank, world)
    model = DistributedDataParallel(make_model(config["hidden"]))
    times = run_epochs(model, loader, config["epochs"], lambda metrics: None, world)
    if rank == 0:
        Path(config["out"]).write_text(json.dumps(times))
    dist.destroy_process_group()


def first_report_loop(config: dict) -> None:
    import importlib

    api = importlib.import_module(config["api"])
    if api.get_context().get_world_rank() == 0:
        with open(config["out"], "a") as f:
            f.write(f"{time.time()}\n")
    api.report({"ok": 1})


def checkpoint_loop(config: dict) -> None:
    import importlib

    import torch

    api = importlib.import_module(config["api"])
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = None
        if api.get_context().get_world_rank() == 0:
            data = torch.randint(0, 255, (config["mb"] * 1024 * 1024,), dtype=torch.uint8)
            torch.save(data, os.path.join(tmp, "weights.pt"))
            ckpt = api.Checkpoint.from_directory(tmp)
        t = time.perf_counter()
        api.report({"ok": 1}, checkpoint=ckpt)
        if ckpt is not None:
            Path(config["out"]).write_text(json.dumps(time.perf_counter() - t))


# --------------------------------------------------------------------------- systems


class Trainers:
    """nbcluster and Ray Train: the same calls, another package."""

    def __init__(self, system: str, num_cpus: int = NUM_WORKERS) -> None:
        self.system = system
        self.storage = tempfile.mkdtemp(prefix=f"train-bench-{system}-")
        if system == "nbcluster":
            import nbcluster
            from nbcluster import train
            from nbcluster.train.torch import TorchTrainer

            nbcluster.init(num_cpus=num_cpus)
            self.api, self.mod, self.Trainer = "nbcluster.train", train, TorchTrainer
            self.shutdown = nbcluster.shutdown
        else:
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            from ray import train
            from ray.train.torch import TorchTrainer

            # Its own session directory (no clash with other Rays on a shared machine), and
            # a few attempts: Ray's start-up times out on a loaded machine.
            ray = _harness.init_ray(
                num_cpus=num_cpus,
                include_dashboard=False,
                logging_level=logging.WARNING,
                _temp_dir=tempfile.mkdtemp(prefix="ray-"),
                _node_ip_address="127.0.0.1",  # loopback, as nbcluster's traffic
            )
            self.api, self.mod, self.Trainer = "ray.train", train, TorchTrainer
            self.shutdown = ray.shutdown

    def fit(self, loop: Any, config: dict) -> Any:
        run = {"storage_path": self.storage}
        if self.system == "nbcluster":
            run["verbose"] = 0
        return self.Trainer(
            loop,
            train_loop_config={**config, "api": self.api},
            scaling_config=self.mod.ScalingConfig(num_workers=NUM_WORKERS),
            run_config=self.mod.RunConfig(**run),
        ).fit()


def bench_trainer(system: str, s: Sizes, out: Path) -> dict[str, Any]:
    res: dict[str, Any] = {}
    t = Trainers(system)
    try:
        for kind in ("cold", "warm"):
            f = out.with_suffix(f".first-{kind}")
            start = time.time()
            t.fit(first_report_loop, {"out": str(f)})
            end = time.time()
            res[f"first_report_{kind}_s"] = float(f.read_text().split()[0]) - start
            res[f"fit_{kind}_s"] = end - start
        f = out.with_suffix(".epochs")
        cfg = asdict(s)
        t.fit(trainer_epoch_loop, {**cfg, "out": str(f)})
        res["epoch_times_s"] = json.loads(f.read_text())
        f = out.with_suffix(".ckpt")
        result = t.fit(checkpoint_loop, {"mb": s.checkpoint_mb, "out": str(f)})
        save_s = json.loads(f.read_text())
        import torch

        r0 = time.perf_counter()
        dest = result.checkpoint.to_directory(tempfile.mkdtemp(prefix="restore-"))
        torch.load(os.path.join(dest, "weights.pt"))
        restore_s = time.perf_counter() - r0
        src = os.path.join(result.checkpoint.path, "weights.pt")
        size_mb = os.path.getsize(src) / 2**20
        c0 = time.perf_counter()
        shutil.copy(src, os.path.join(dest, "copy.pt"))
        copy_s = time.perf_counter() - c0
        res.update(
            checkpoint_mb=size_mb,
            save_mb_s=size_mb / save_s,
            restore_mb_s=size_mb / restore_s,
            save_restore_mb_s=size_mb / (save_s + restore_s),
            copy_mb_s=size_mb / copy_s,
        )
        shutil.rmtree(dest, ignore_errors=True)
    finally:
        t.shutdown()
        shutil.rmtree(t.storage, ignore_errors=True)
    if system == "nbcluster":
        # The same two fits on a cluster with room for two groups: a new run's placement
        # group does not wait for the CPUs the previous run just gave back.
        t = Trainers(system, num_cpus=2 * NUM_WORKERS)
        try:
            for kind in ("cold", "warm"):
                f = out.with_suffix(f".spare-{kind}")
                start = time.time()
                t.fit(first_report_loop, {"out": str(f)})
                res[f"first_report_{kind}_spare_s"] = float(f.read_text().split()[0]) - start
        finally:
            t.shutdown()
            shutil.rmtree(t.storage, ignore_errors=True)
    return res


def bench_torch(s: Sizes, out: Path) -> dict[str, Any]:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    f = out.with_suffix(".epochs")
    mp.spawn(
        _torch_worker, args=(NUM_WORKERS, port, {**asdict(s), "out": str(f)}), nprocs=NUM_WORKERS
    )
    return {"epoch_times_s": json.loads(f.read_text())}


def run_child(system: str, s: Sizes, out: Path) -> None:
    res = bench_torch(s, out) if system == "torch" else bench_trainer(system, s, out)
    out.write_text(json.dumps(res))


# --------------------------------------------------------------------------- parent


def installed(system: str) -> bool:
    module = {"nbcluster": "nbcluster", "torch": "torch", "ray": "ray"}[system]
    if importlib.util.find_spec("torch") is None:
        return False
    if system == "ray":
        return importlib.util.find_spec("ray") is not None and (
            importlib.util.find_spec("ray.train") is not None
        )
    return importlib.util.find_spec(module) is not None


def spawn(system: str, args: argparse.Namespace, s: Sizes, tmp: Path) -> dict[str, Any] | str:
    out = tmp / f"{system}.json"
    log_path = tmp / f"{system}.log"
    flags = ["--_system", system, "--_out", str(out)]
    if args.quick:
        flags.append("--quick")
    if args.checkpoint_mb:
        flags += ["--checkpoint-mb", str(args.checkpoint_mb)]
    run = _harness.run_child(__file__, flags, timeout_s=s.system_timeout_s, logfile=log_path)
    if run.returncode is None:
        return f"timed out after {s.system_timeout_s} s (log: {log_path})"
    if run.returncode != 0 or not out.exists():
        tail = log_path.read_text()[-800:]
        return f"failed (exit {run.returncode}; log: {log_path}):\n{tail}"
    return json.loads(out.read_text())


def median_epoch(res: dict[str, Any]) -> float | None:
    times = res.get("epoch_times_s") or []
    rest = times[1:] or times
    return statistics.median(rest) if rest else None


def fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "s":
        return f"{v:.3f} s" if v < 10 else f"{v:.1f} s"
    return f"{v:,.0f} {unit}"


def table(results: dict[str, dict[str, Any] | str]) -> str:
    ok = {k: v for k, v in results.items() if isinstance(v, dict)}
    nb = ok.get("nbcluster", {})
    base = median_epoch(ok["torch"]) if "torch" in ok else None
    lines = [
        f"{'workload':<34}"
        + "".join(f"{LABELS[sy]:>20}" for sy in SYSTEMS)
        + f"{'nbcluster vs':>24}",
        "-" * (34 + 20 * len(SYSTEMS) + 24),
    ]

    def row(label: str, key: str, unit: str, compare: str = "") -> None:
        vals = {}
        for sy in SYSTEMS:
            r = ok.get(sy)
            vals[sy] = (median_epoch(r) if key == "epoch" else r.get(key)) if r else None
        cmp = ""
        if compare == "torch" and vals["nbcluster"] and base:
            cmp = f"{(vals['nbcluster'] / base - 1) * 100:+.1f} % vs torch"
        elif compare == "ray" and vals["nbcluster"] and vals["ray"]:
            cmp = f"{vals['ray'] / vals['nbcluster']:.1f}x faster than Ray"
        elif compare == "mb" and vals["nbcluster"] and vals["ray"]:
            cmp = f"{vals['nbcluster'] / vals['ray']:.1f}x Ray's rate"
        lines.append(
            f"{label:<34}" + "".join(f"{fmt(vals[sy], unit):>20}" for sy in SYSTEMS) + f"{cmp:>24}"
        )

    row("time per epoch (median)", "epoch", "s", "torch")
    if ok.get("ray") and base and median_epoch(ok["ray"]):
        lines.append(
            f"{'':<34}Ray Train vs torch: {(median_epoch(ok['ray']) / base - 1) * 100:+.1f} %"
        )
    row("fit() to first report, cold", "first_report_cold_s", "s", "ray")
    row("fit() to first report, warm", "first_report_warm_s", "s", "ray")
    row("  (room for 2 groups) cold", "first_report_cold_spare_s", "s")
    row("  (room for 2 groups) warm", "first_report_warm_spare_s", "s")
    row("fit() to the end, cold", "fit_cold_s", "s", "ray")
    row("fit() to the end, warm", "fit_warm_s", "s", "ray")
    row("checkpoint save", "save_mb_s", "MB/s", "mb")
    row("checkpoint restore", "restore_mb_s", "MB/s", "mb")
    row("checkpoint save+restore", "save_restore_mb_s", "MB/s", "mb")
    row("plain file copy (for scale)", "copy_mb_s", "MB/s")
    if nb:
        targets = []
        if base and median_epoch(nb):
            over = (median_epoch(nb) / base - 1) * 100
            targets.append(f"epoch overhead {over:+.1f} % (target <= 2 %)")
        if "first_report_cold_s" in nb:
            targets.append(f"first report cold {nb['first_report_cold_s']:.2f} s (target <= 2 s)")
            targets.append(f"warm {nb['first_report_warm_s']:.3f} s (target <= 0.3 s)")
        lines.append("")
        lines.append("nbcluster: " + "; ".join(targets))
    for sy, v in results.items():
        if isinstance(v, str):
            lines.append(f"{LABELS[sy]}: {v}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--only", help="comma-separated: nbcluster,torch,ray")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--checkpoint-mb", type=int, default=0, help="checkpoint size (MB)")
    parser.add_argument("--_system", help=argparse.SUPPRESS)
    parser.add_argument("--_out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    s = Sizes.quick() if args.quick else Sizes()
    if args.checkpoint_mb:
        s.checkpoint_mb = args.checkpoint_mb
    if args._system:
        run_child(args._system, s, Path(args._out))
        return 0
    chosen = args.only.split(",") if args.only else list(SYSTEMS)
    unknown = [c for c in chosen if c not in SYSTEMS]
    if unknown:
        parser.error(f"unknown system(s): {', '.join(unknown)}; choose from {', '.join(SYSTEMS)}")
    tmp = Path(tempfile.mkdtemp(prefix="train-bench-"))
    results: dict[str, dict[str, Any] | str] = {}
    for system in chosen:
        if not installed(system):
            results[system] = "not installed"
            continue
        print(f"running {LABELS[system]} ...", flush=True)
        t = time.monotonic()
        results[system] = spawn(system, args, s, tmp)
        print(f"  done in {time.monotonic() - t:.0f} s", flush=True)
    print()
    print(
        f"2 workers, {s.images} images of 1x28x28, batch {s.batch_size}/worker, MLP {s.hidden} hidden, "
        f"{s.epochs} epochs; checkpoint {s.checkpoint_mb} MB"
    )
    print(table(results))
    print(f"\nlogs: {tmp}")
    if args.json:
        Path(args.json).write_text(json.dumps({"sizes": asdict(s), "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
