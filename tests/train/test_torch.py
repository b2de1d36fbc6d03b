"""TorchTrainer on a real cluster: the FashionMNIST-style program, the worker group's
environment, warm reuse, interrupt and resume, a worker killed mid-epoch.

The tests of this module share one 4-CPU cluster and, where the semantics allow, one warm
worker group (torch is imported once per worker process): the order of the tests matters
(the ones that end the group come last).
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time

import cloudpickle
import psutil
import pytest

import nbcluster
from nbcluster import train
from nbcluster.testing import poll_for
from nbcluster.train import (
    Checkpoint,
    CheckpointConfig,
    DataConfig,
    FailureConfig,
    RunConfig,
    ScalingConfig,
)
from nbcluster.train.torch import TorchTrainer, get_device, prepare_data_loader, prepare_model

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = [pytest.mark.integration, pytest.mark.slow]


class FakeFashion(Dataset):
    """FashionMNIST's shape (1x28x28 images, 10 classes), generated: class ``c`` has a
    bright band at rows ``2c..2c+3`` over noise, so a small MLP can learn it."""

    def __init__(self, n: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, 10, (n,), generator=g)
        self.noise = torch.rand(n, 1, 28, 28, generator=g) * 0.5

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        x = self.noise[i].clone()
        c = int(self.labels[i])
        x[0, 2 * c : 2 * c + 4, :] += 1.0
        return x, self.labels[i]


class NeuralNetwork(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.flatten = nn.Flatten()
        self.linear_relu_stack = nn.Sequential(
            nn.Linear(28 * 28, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 10)
        )

    def forward(self, x):
        return self.linear_relu_stack(self.flatten(x))


def train_func_per_worker(config: dict):
    """The FashionMNIST example of Ray Train's docs, with generated images."""
    lr = config["lr"]
    epochs = config["epochs"]
    batch_size = config["batch_size_per_worker"]

    train_dataloader = DataLoader(FakeFashion(1024), batch_size=batch_size, shuffle=True)
    test_dataloader = DataLoader(FakeFashion(256, seed=1), batch_size=batch_size)
    train_dataloader = prepare_data_loader(train_dataloader)
    test_dataloader = prepare_data_loader(test_dataloader)

    model = prepare_model(NeuralNetwork())
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)

    seen: list[list[int]] = []
    for epoch in range(epochs):
        if train.get_context().get_world_size() > 1:
            train_dataloader.sampler.set_epoch(epoch)
        seen.append(list(iter(train_dataloader.sampler)))
        model.train()
        for X, y in train_dataloader:
            pred = model(X)
            loss = loss_fn(pred, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        model.eval()
        test_loss, num_correct, num_total = 0.0, 0, 0
        with torch.no_grad():
            for X, y in test_dataloader:
                pred = model(X)
                test_loss += loss_fn(pred, y).item()
                num_total += y.shape[0]
                num_correct += (pred.argmax(1) == y).sum().item()
        test_loss /= len(test_dataloader)
        accuracy = num_correct / num_total

        metrics = {"loss": test_loss, "accuracy": accuracy, "epoch": epoch}
        if config.get("check"):
            metrics.update(_checks(model, seen))
        with tempfile.TemporaryDirectory() as tmp:
            ckpt = None
            if train.get_context().get_world_rank() == 0:
                torch.save(model.state_dict(), os.path.join(tmp, "model.pt"))
                ckpt = Checkpoint.from_directory(tmp)
            train.report(metrics=metrics, checkpoint=ckpt)
    return {"pid": os.getpid(), "epochs": epochs}


def _checks(model, seen):
    """What only the ranks together can tell: shards, reshuffles, parameters, environment."""
    import torch.distributed as dist

    ctx = train.get_context()
    world = ctx.get_world_size()
    shards = [None] * world
    dist.all_gather_object(shards, seen)
    epoch_now = [set(s[-1]) for s in shards]
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    sums = [None] * world
    dist.all_gather_object(sums, float(flat.sum()))
    env = {
        k: os.environ[k]
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK")
    }
    return {
        "world_size": world,
        "shards_disjoint": all(
            not (a & b) for i, a in enumerate(epoch_now) for b in epoch_now[i + 1 :]
        ),
        "shards_cover": len(set().union(*epoch_now)) == 1024,
        "reshuffled": len(shards[0]) < 2 or shards[0][-1] != shards[0][-2],
        "params_in_sync": max(sums) - min(sums) < 1e-4,
        "env": ",".join(f"{k}={v}" for k, v in env.items()),
        "master": f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
        "backend": dist.get_backend(),
        "ctx": f"{ctx.get_world_rank()}/{ctx.get_local_rank()}/{ctx.get_local_world_size()}/{ctx.get_node_rank()}",
        "device": str(get_device()),
        "pid": os.getpid(),
    }


def _trainer(tmp_path, epochs=3, check=False, **run):
    return TorchTrainer(
        train_func_per_worker,
        train_loop_config={
            "lr": 0.05,
            "epochs": epochs,
            "batch_size_per_worker": 64,
            "check": check,
        },
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=str(tmp_path), **run),
    )


def test_fashion_mnist_style_program(train_cluster, tmp_path, capfd):
    result = _trainer(
        tmp_path,
        epochs=3,
        check=True,
        name="fmnist",
        checkpoint_config=CheckpointConfig(num_to_keep=1, checkpoint_score_attribute="accuracy"),
    ).fit()
    m = result.metrics
    assert m["training_iteration"] == 3 and m["epoch"] == 2
    assert 0.0 <= m["accuracy"] <= 1.0 and m["loss"] > 0
    history = result.metrics_dataframe
    assert list(history["epoch"]) == [0, 1, 2]
    assert history["accuracy"].iloc[-1] > 0.5, history  # it learns the generated classes
    # The group: 2 ranks in a gloo process group, sharded data, DDP keeps them in sync.
    assert m["world_size"] == 2 and m["backend"] == "gloo" and m["device"] == "cpu"
    assert m["env"] == "RANK=0,WORLD_SIZE=2,LOCAL_RANK=0,LOCAL_WORLD_SIZE=2,NODE_RANK=0"
    assert m["ctx"] == "0/0/2/0"
    assert m["master"].startswith("127.0.0.1:")
    assert all(history["shards_disjoint"]) and all(history["shards_cover"])
    assert history["reshuffled"].iloc[-1] and all(history["params_in_sync"])
    assert result.return_value == {"pid": m["pid"], "epochs": 3}
    # Checkpoints: the best by accuracy and the latest are kept, nothing else.
    names = sorted(p for p in os.listdir(result.path) if p.startswith("checkpoint_"))
    kept = sorted(os.path.basename(c.path) for c, _ in result.best_checkpoints)
    assert names == kept and "checkpoint_000002" in names and 1 <= len(names) <= 2
    assert result.checkpoint.path == os.path.join(result.path, "checkpoint_000002")
    assert os.path.exists(os.path.join(result.checkpoint.path, "model.pt"))
    assert result.path == str(tmp_path / "fmnist") and result.error is None
    # Outside a notebook the run shows itself as lines of text.
    out = capfd.readouterr().out
    assert "[train] started 2 worker(s) in " in out
    assert "[train] TorchTrainer fmnist: FINISHED, iteration 3" in out


def test_second_fit_reuses_the_warm_group_and_frees_the_cpus(train_cluster, tmp_path, capfd):
    first = _trainer(tmp_path, epochs=1, check=True).fit()
    # While the group is idle its CPUs are back: a task that needs all 4 runs.
    poll_for(lambda: nbcluster.available_resources().get("CPU") == 4.0, timeout=60)

    @nbcluster.remote(num_cpus=4)
    def everything() -> int:
        return 4

    assert nbcluster.get(everything.remote(), timeout=60) == 4
    capfd.readouterr()
    seen = []
    start = time.monotonic()
    second = _trainer(tmp_path, epochs=1, check=True, callbacks=[_FirstReport(seen)]).fit()
    out = capfd.readouterr().out
    print(f"warm fit: first report after {(seen[0] - start) * 1000:.0f} ms")  # shown, not asserted
    assert second.metrics["pid"] == first.metrics["pid"]  # the same rank-0 process
    assert "[train] reusing the warm worker group (2 worker(s))" in out
    assert "started 2 worker(s)" not in out


class _FirstReport:
    def __init__(self, seen):
        self.seen = seen

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.seen.append(time.monotonic())


def printing_loop(config):
    rank = train.get_context().get_world_rank()
    for i in range(2):
        print(f"hello {i} from rank {rank}")
        train.report({"i": i})


def test_worker_output_is_prefixed_by_rank(train_cluster, tmp_path, capfd):
    TorchTrainer(
        printing_loop,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=str(tmp_path), verbose=0),
    ).fit()
    out = capfd.readouterr().out  # printed by the time fit() returns: no wait for it
    for rank in (0, 1):
        lines = [f"[rank {rank}] hello {i} from rank {rank}\n" for i in range(2)]
        assert [out.count(line) for line in lines] == [1, 1], out  # once each
        assert out.index(lines[0]) < out.index(lines[1])
    assert "[train]" not in out  # verbose=0: no display


def linear_train_func():
    """Ray Train's data-loading example: a linear model fed by a dataset shard."""
    import torch.distributed as dist

    model = prepare_model(nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=2e-5)
    shard = train.get_dataset_shard("train")
    for _epoch in range(3):
        xs, total = [], 0.0
        for batch in shard.iter_torch_batches(batch_size=16, dtypes=torch.float32):
            inputs, labels = batch["x"], batch["y"]
            assert type(inputs) is torch.Tensor and inputs.shape[1:] == (1,)
            loss = nn.functional.mse_loss(model(inputs), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            xs.extend(int(v) for v in inputs.flatten().tolist())
            total += loss.item() * len(inputs)
        everyone = [None] * train.get_context().get_world_size()
        dist.all_gather_object(everyone, xs)
        valid = sum(
            len(b["v"]) for b in train.get_dataset_shard("valid").iter_batches(batch_size=4)
        )
        train.report(
            {
                "valid_rows": valid,
                "loss": total / len(xs),
                "rows": len(xs),
                "rows_all": sum(len(e) for e in everyone),
                "distinct_all": len(set().union(*map(set, everyone))),
            }
        )


def test_datasets_are_split_across_ranks(train_cluster, tmp_path):
    from nbcluster import data

    train_dataset = data.from_items([{"x": [x], "y": [2 * x]} for x in range(200)])

    def increment(batch):
        batch["y"] = batch["y"] + 1
        return batch

    train_dataset = train_dataset.map_batches(increment)
    trainer = TorchTrainer(
        linear_train_func,
        datasets={"train": train_dataset, "valid": data.from_items([{"v": i} for i in range(10)])},
        dataset_config=DataConfig(datasets_to_split=["train"]),
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=str(tmp_path)),
    )
    result = trainer.fit()
    df = result.metrics_dataframe
    assert list(df["rows"]) == [100, 100, 100]  # an equal share per rank, every epoch
    assert list(df["rows_all"]) == [200] * 3 and list(df["distinct_all"]) == [200] * 3
    assert df["loss"].iloc[-1] < df["loss"].iloc[0]
    assert list(df["valid_rows"]) == [10, 10, 10]  # not split: every rank reads all of it


def slow_loop(config):
    start = 0
    ckpt = train.get_checkpoint()
    if ckpt is not None:
        start = ckpt.get_metadata()["epoch"] + 1
    for epoch in range(start, config["epochs"]):
        time.sleep(0.15)
        with tempfile.TemporaryDirectory() as tmp:
            c = Checkpoint.from_directory(tmp)
            c.set_metadata({"epoch": epoch})
            train.report({"epoch": epoch}, checkpoint=c)


class _InterruptAt:
    """Sends SIGINT to this process at a report, as the kernel's interrupt button does."""

    def __init__(self, iteration):
        self.iteration = iteration

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if result["training_iteration"] == self.iteration:
            os.kill(os.getpid(), signal.SIGINT)


def test_interrupt_stops_keeps_checkpoints_and_resume_carries_on(train_cluster, tmp_path):
    def trainer(**kw):
        return TorchTrainer(
            slow_loop,
            train_loop_config={"epochs": 8},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(storage_path=str(tmp_path), name="resumable", **kw.pop("run", {})),
            **kw,
        )

    result = trainer(run={"callbacks": [_InterruptAt(3)]}).fit()
    assert result.interrupted and result.error is None
    done = result.metrics["epoch"]
    assert 2 <= done < 7  # stopped at a report soon after the interrupt, not run to the end
    assert os.path.isdir(result.checkpoint.path)
    assert result.checkpoint.get_metadata() == {"epoch": done}
    assert "interrupted=True" in repr(result)
    # Started again with the same name: it carries on from its latest checkpoint.
    again = trainer().fit()
    assert again.resumed_from == result.checkpoint
    assert list(again.metrics_dataframe["epoch"]) == list(range(8))
    assert again.metrics["training_iteration"] == 8 and not again.interrupted
    # A new run told where to resume from starts its loop from that checkpoint.
    other = TorchTrainer(
        slow_loop,
        train_loop_config={"epochs": done + 3},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=str(tmp_path)),
        resume_from_checkpoint=result.checkpoint,
    ).fit()
    assert other.resumed_from == result.checkpoint
    assert list(other.metrics_dataframe["epoch"]) == [done + 1, done + 2]


def killing_loop(config):
    """Trains with DDP; rank 1 kills its own process in the middle of epoch 2, once."""
    start = 0
    ckpt = train.get_checkpoint()
    model = prepare_model(NeuralNetwork())
    if ckpt is not None:
        start = ckpt.get_metadata()["epoch"] + 1
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = prepare_data_loader(DataLoader(FakeFashion(256), batch_size=32, shuffle=True))
    for epoch in range(start, 4):
        for step, (X, y) in enumerate(loader):
            rank = train.get_context().get_world_rank()
            if epoch == 2 and step == 2 and rank == 1 and not os.path.exists(config["marker"]):
                open(config["marker"], "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
            loss = nn.functional.cross_entropy(model(X), y)
            opt.zero_grad()
            loss.backward()  # an allreduce: rank 0 waits here for the dead rank
            opt.step()
        with tempfile.TemporaryDirectory() as tmp:
            c = Checkpoint.from_directory(tmp)
            c.set_metadata({"epoch": epoch})
            train.report({"epoch": epoch, "pid": os.getpid()}, checkpoint=c)


def test_a_worker_killed_mid_epoch_resumes_from_the_checkpoint(train_cluster, tmp_path):
    marker = tmp_path / "killed"
    result = TorchTrainer(
        killing_loop,
        train_loop_config={"marker": str(marker)},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            storage_path=str(tmp_path), failure_config=FailureConfig(max_failures=1)
        ),
    ).fit()
    assert marker.exists()
    assert result.num_failures == 1 and result.error is None
    df = result.metrics_dataframe
    assert list(df["epoch"]) == [0, 1, 2, 3]  # each epoch reported once
    assert list(df["training_iteration"]) == [1, 2, 3, 4]
    assert df["pid"].iloc[1] != df["pid"].iloc[2]  # a new group after the failure
    old = int(df["pid"].iloc[1])
    poll_for(lambda: not psutil.pid_exists(old), timeout=60)


def test_a_second_death_beyond_max_failures_fails(train_cluster, tmp_path):
    def dies(config):
        if train.get_context().get_world_rank() == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)

    with pytest.raises(train.TrainingFailedError) as info:
        TorchTrainer(
            dies,
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(storage_path=str(tmp_path)),
        ).fit()
    text = str(info.value)
    assert text.startswith("Training failed due to worker errors:\n[Rank 1] (pid ")
    assert "the worker process died" in text
    assert isinstance(info.value, train.WorkerGroupError) and list(info.value.worker_failures) == [
        1
    ]
