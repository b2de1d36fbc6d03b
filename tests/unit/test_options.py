"""One table of task and actor options: defaults, validation messages, merging."""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import cloudpickle
import pytest

from nbcluster.options import (
    ACTOR_OPTION_NAMES,
    TASK_OPTION_NAMES,
    ActorOptions,
    FrozenResources,
    TaskOptions,
    actor_options,
    task_options,
)

TASK_VALID_IN_OPTIONS = (
    "max_retries, memory, name, num_cpus, num_gpus, num_returns, resources, retry_exceptions, runtime_env, "
    "scheduling_strategy"
)


class Strategy:
    """Stands in for a strategy class (node affinity, placement group)."""

    _nbcluster_strategy = "NODE_AFFINITY"

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id


# --------------------------------------------------------------------------- defaults


def test_task_defaults_follow_ray() -> None:
    opts = task_options({}, where="decorator")
    assert opts == TaskOptions()
    assert (opts.num_cpus, opts.num_gpus, opts.memory) == (1, 0, 0)
    assert dict(opts.resources) == {}
    assert (opts.num_returns, opts.max_retries, opts.retry_exceptions) == (1, 3, False)
    assert (opts.max_calls, opts.name, opts.scheduling_strategy) == (0, None, "DEFAULT")
    assert opts.resource_shape() == {"CPU": 1.0}


def test_actor_defaults_follow_ray() -> None:
    opts = actor_options({}, where="decorator")
    assert opts == ActorOptions()
    assert opts.num_cpus is None
    assert (opts.max_restarts, opts.max_task_retries, opts.max_pending_calls) == (0, 0, -1)
    assert (opts.lifetime, opts.get_if_exists, opts.max_concurrency) == (None, False, None)
    assert (opts.name, opts.namespace, opts.scheduling_strategy) == (None, None, "DEFAULT")


def test_option_name_tables_match_the_fields() -> None:
    assert {f.name for f in dataclasses.fields(TaskOptions)} == TASK_OPTION_NAMES
    assert {f.name for f in dataclasses.fields(ActorOptions)} == ACTOR_OPTION_NAMES
    assert "max_calls" in TASK_OPTION_NAMES
    assert "max_restarts" in ACTOR_OPTION_NAMES


# --------------------------------------------------------------------------- B04 messages


def test_unknown_task_option_lists_the_valid_ones() -> None:
    with pytest.raises(
        ValueError,
        match=r"^Invalid option 'foo' for a remote function\. Valid options: max_calls, "
        r"max_retries, memory, name, num_cpus, num_gpus, num_returns, resources, "
        r"retry_exceptions, runtime_env, scheduling_strategy\.$",
    ):
        task_options({"foo": 1}, where="decorator")


def test_unknown_option_suggests_a_close_name() -> None:
    with pytest.raises(
        ValueError,
        match=rf"^Invalid option 'num_cpu' for a remote function\. Valid options: "
        rf"{TASK_VALID_IN_OPTIONS}\. Did you mean 'num_cpus'\?$",
    ):
        TaskOptions().merge(num_cpu=2)


def test_unknown_actor_option() -> None:
    with pytest.raises(ValueError, match=r"^Invalid option 'max_calls' for an actor class\."):
        actor_options({"max_calls": 1}, where="decorator")


def test_num_cpus_of_the_wrong_type() -> None:
    with pytest.raises(
        TypeError, match=r"^num_cpus must be a non-negative number, got 'a' \(str\)$"
    ):
        task_options({"num_cpus": "a"}, where="decorator")


@pytest.mark.parametrize("value", [-1, float("nan"), float("inf")])
def test_num_cpus_out_of_range(value: float) -> None:
    with pytest.raises(ValueError, match=r"^num_cpus must be a non-negative number, got "):
        TaskOptions().merge(num_cpus=value)


def test_bools_are_not_numbers() -> None:
    with pytest.raises(TypeError, match=r"^num_gpus must be a non-negative number, got True"):
        TaskOptions().merge(num_gpus=True)
    with pytest.raises(TypeError, match=r"^max_retries must be an integer >= -1"):
        TaskOptions().merge(max_retries=False)


def test_negative_max_retries() -> None:
    with pytest.raises(
        ValueError,
        match=r"^max_retries must be an integer >= -1 \(-1 means retry forever\), got -5$",
    ):
        TaskOptions().merge(max_retries=-5)
    assert TaskOptions().merge(max_retries=-1).max_retries == -1


def test_max_calls_only_in_the_decorator() -> None:
    assert task_options({"max_calls": 5}, where="decorator").max_calls == 5
    with pytest.raises(
        ValueError,
        match=r"^max_calls can only be set in @remote\(\.\.\.\), not in \.options\(\)",
    ):
        TaskOptions().merge(max_calls=5)
    with pytest.raises(ValueError, match=r"^max_calls can only be set in @remote"):
        task_options({"max_calls": 5}, where="options")


def test_where_selects_the_rules() -> None:
    assert TaskOptions().merge(where="decorator", max_calls=2).max_calls == 2
    with pytest.raises(ValueError, match=r"^max_calls can only be set in @remote"):
        TaskOptions().merge(where="options", max_calls=2)
    with pytest.raises(ValueError, match=r"^where must be 'decorator' or 'options'"):
        task_options({}, where="elsewhere")  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [True, False, [ValueError], (KeyError, OSError), []])
def test_retry_exceptions_accepts_bools_and_exception_classes(value: Any) -> None:
    opts = TaskOptions().merge(retry_exceptions=value)
    expected = value if isinstance(value, bool) else tuple(value)
    assert opts.retry_exceptions == expected


@pytest.mark.parametrize("value", ["ValueError", [ValueError("x")], [int], 1])
def test_retry_exceptions_rejects_other_values(value: Any) -> None:
    with pytest.raises(
        TypeError, match=r"^retry_exceptions must be True, False or a list of exception classes"
    ):
        TaskOptions().merge(retry_exceptions=value)


@pytest.mark.parametrize(
    ("key", "option"), [("CPU", "num_cpus"), ("GPU", "num_gpus"), ("memory", "memory")]
)
def test_resources_must_not_hold_builtin_resources(key: str, option: str) -> None:
    with pytest.raises(
        ValueError,
        match=rf"^Use the {option} option instead of resources=\{{'{key}': \.\.\.\}}: "
        rf"write {option}=2$",
    ):
        TaskOptions().merge(resources={key: 2})


def test_resources_must_be_a_dict_of_amounts() -> None:
    with pytest.raises(TypeError, match=r"^resources must be a dict of resource name to amount"):
        TaskOptions().merge(resources=["TPU"])
    with pytest.raises(TypeError, match=r"^resources keys must be non-empty strings, got 1$"):
        TaskOptions().merge(resources={1: 1})
    with pytest.raises(
        ValueError, match=r"^resources\['TPU'\] must be a non-negative number, got -1$"
    ):
        TaskOptions().merge(resources={"TPU": -1})


def test_num_returns() -> None:
    assert TaskOptions().merge(num_returns=0).num_returns == 0
    with pytest.raises(
        ValueError,
        match=r'^num_returns must be an integer >= 0 \(or "streaming" / "dynamic" for '
        r"generators\), got -1$",
    ):
        TaskOptions().merge(num_returns=-1)
    # generator tasks (issue 20)
    assert TaskOptions().merge(num_returns="dynamic").num_returns == "dynamic"
    assert TaskOptions().merge(num_returns="streaming").num_returns == "streaming"
    with pytest.raises(ValueError, match=r'"streaming" or "dynamic", got \'stream\'$'):
        TaskOptions().merge(num_returns="stream")
    with pytest.raises(TypeError, match=r"^num_returns must be an integer"):
        TaskOptions().merge(num_returns=1.5)


def test_generator_backpressure_option() -> None:
    opts = TaskOptions().merge(_generator_backpressure_num_objects=2)
    assert opts._generator_backpressure_num_objects == 2
    assert TaskOptions()._generator_backpressure_num_objects == -1  # off by default, as Ray
    with pytest.raises(ValueError, match=r"-1 \(no backpressure\) or >= 1, got 0$"):
        TaskOptions().merge(_generator_backpressure_num_objects=0)
    with pytest.raises(ValueError, match=r"-1 means no backpressure"):
        TaskOptions().merge(_generator_backpressure_num_objects=-2)


def test_scheduling_strategy() -> None:
    assert TaskOptions().merge(scheduling_strategy="SPREAD").scheduling_strategy == "SPREAD"
    assert TaskOptions().merge(scheduling_strategy=None).scheduling_strategy == "DEFAULT"
    strategy = Strategy("n1")
    assert TaskOptions().merge(scheduling_strategy=strategy).scheduling_strategy is strategy
    with pytest.raises(
        ValueError,
        match=r"^scheduling_strategy must be 'DEFAULT', 'SPREAD' or a strategy object, "
        r"got 'spread' \(did you mean 'SPREAD'\?\)$",
    ):
        TaskOptions().merge(scheduling_strategy="spread")
    with pytest.raises(TypeError, match=r"^scheduling_strategy must be 'DEFAULT', 'SPREAD' or a"):
        ActorOptions().merge(scheduling_strategy=object())


def test_name_must_be_a_string() -> None:
    with pytest.raises(TypeError, match=r"^name must be a string or None, got 3 \(int\)$"):
        TaskOptions().merge(name=3)


# --------------------------------------------------------------------------- actors


def test_actor_option_validation() -> None:
    with pytest.raises(ValueError, match=r"^lifetime must be None or 'detached', got 'forever'$"):
        ActorOptions().merge(lifetime="forever")
    assert ActorOptions().merge(lifetime="non_detached").lifetime is None
    with pytest.raises(
        ValueError,
        match=r"^max_restarts must be an integer >= -1 \(-1 means restart forever\), got -2$",
    ):
        ActorOptions().merge(max_restarts=-2)
    with pytest.raises(ValueError, match=r"^max_task_retries must be an integer >= -1"):
        ActorOptions().merge(max_task_retries=-3)
    with pytest.raises(ValueError, match=r"^max_concurrency must be an integer >= 1, got 0$"):
        ActorOptions().merge(max_concurrency=0)
    with pytest.raises(
        ValueError,
        match=r"^max_pending_calls must be -1 \(unlimited\) or a positive integer, got 0$",
    ):
        ActorOptions().merge(max_pending_calls=0)
    with pytest.raises(TypeError, match=r"^max_pending_calls must be -1 .* got '3' \(str\)$"):
        ActorOptions().merge(max_pending_calls="3")
    with pytest.raises(TypeError, match=r"^get_if_exists must be True or False, got 1 \(int\)$"):
        ActorOptions().merge(get_if_exists=1)
    with pytest.raises(TypeError, match=r"^namespace must be a string or None"):
        ActorOptions().merge(namespace=1)
    with pytest.raises(ValueError, match=r"^name must be a non-empty string or None"):
        ActorOptions().merge(name="")
    with pytest.raises(TypeError, match=r"^num_cpus must be a non-negative number"):
        ActorOptions().merge(num_cpus="1")


def test_get_if_exists_needs_a_name_at_creation() -> None:
    opts = actor_options({"get_if_exists": True}, where="decorator")
    with pytest.raises(ValueError, match=r"^get_if_exists=True needs a name"):
        opts.check_creatable()
    opts.merge(name="counter").check_creatable()


def test_actor_cpu_defaults_schedule_with_one_and_run_with_zero() -> None:
    opts = ActorOptions()
    assert opts.scheduling_resource_shape() == {"CPU": 1.0}
    assert opts.resource_shape() == {}
    gpu = opts.merge(num_gpus=1)
    assert gpu.scheduling_resource_shape() == {"GPU": 1.0}
    assert gpu.resource_shape() == {"GPU": 1.0}
    two = opts.merge(num_cpus=2, resources={"TPU": 1})
    assert two.scheduling_resource_shape() == two.resource_shape() == {"CPU": 2.0, "TPU": 1.0}
    zero = opts.merge(num_cpus=0)
    assert zero.scheduling_resource_shape() == zero.resource_shape() == {}


# --------------------------------------------------------------------------- merging


def test_merge_replaces_and_leaves_the_original_alone() -> None:
    base = task_options({"num_cpus": 2, "max_calls": 1}, where="decorator")
    merged = base.merge(num_gpus=0.5, resources={"TPU": 1})
    assert (base.num_gpus, dict(base.resources)) == (0, {})
    assert (merged.num_cpus, merged.num_gpus, merged.max_calls) == (2, 0.5, 1)
    assert merged.resource_shape() == {"CPU": 2.0, "GPU": 0.5, "TPU": 1.0}
    assert base.merge() is base


def test_merge_validates_values() -> None:
    with pytest.raises(TypeError, match=r"^num_gpus must be a non-negative number"):
        TaskOptions().merge(num_gpus="x")
    with pytest.raises(TypeError, match=r"^num_gpus must be a non-negative number"):
        dataclasses.replace(TaskOptions(), num_gpus="x")


def test_resource_shape_drops_zero_entries() -> None:
    opts = TaskOptions(num_cpus=0, memory=2**30, resources={"TPU": 0, "accel": 0.25})
    assert opts.resource_shape() == {"memory": float(2**30), "accel": 0.25}


def test_options_are_frozen_hashable_and_picklable() -> None:
    opts = TaskOptions(resources={"TPU": 1}, retry_exceptions=[ValueError])
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.num_cpus = 3  # type: ignore[misc]
    assert isinstance(opts.resources, FrozenResources)
    with pytest.raises(TypeError):
        opts.resources["TPU"] = 2  # type: ignore[index]
    assert hash(opts) == hash(TaskOptions(resources={"TPU": 1}, retry_exceptions=(ValueError,)))
    assert {opts: 1}[TaskOptions(resources={"TPU": 1}, retry_exceptions=(ValueError,))] == 1
    for dumps in (pickle.dumps, cloudpickle.dumps):
        assert pickle.loads(dumps(opts)) == opts
        actor = ActorOptions(name="a", resources={"X": 2})
        assert pickle.loads(dumps(actor)) == actor
        assert hash(pickle.loads(dumps(actor))) == hash(actor)


def test_frozen_resources_behaves_like_a_mapping() -> None:
    res = FrozenResources({"TPU": 1.0})
    assert res == {"TPU": 1.0}
    assert dict(res) == {"TPU": 1.0}
    assert repr(res) == "{'TPU': 1.0}"
    assert len(res) == 1
    assert "TPU" in res
