"""The lazy DAG API on a real cluster (issue 5, acceptance 1).

Executions are counted with append-only files under ``tmp_path`` (workers share this host's
filesystem); remote functions and classes are defined inside the tests so that cloudpickle
sends them by value, as from a notebook.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

import nbcluster
from nbcluster.dag import ClassMethodNode, InputNode, MultiOutputNode
from nbcluster.exceptions import TaskError

pytestmark = pytest.mark.integration


def _marks(path: Path) -> list[str]:
    """Lines appended to ``path`` by tasks (one per execution)."""
    try:
        return path.read_text().split()
    except FileNotFoundError:
        return []


def _counter_class():
    @nbcluster.remote
    class Counter:
        def __init__(self, start=0):
            self.n = start
            self.token = uuid.uuid4().hex

        def inc(self, by=1):
            self.n += by
            return self.n

        def get(self):
            return self.n

        def whoami(self):
            return self.token

    return Counter


def test_diamond_runs_each_node_once_per_execute(shared_cluster, tmp_path):
    log = str(tmp_path / "runs")

    @nbcluster.remote
    def step(name, value, log):
        with open(log, "a") as f:
            f.write(name + "\n")
        return value

    @nbcluster.remote
    def join(a, b, log):
        with open(log, "a") as f:
            f.write("join\n")
        return a + b

    with InputNode() as inp:
        source = step.bind("source", inp, log)
        left = step.bind("left", source, log)
        right = step.bind("right", source, log)
        dag = join.bind(left, right, log)

    ref = dag.execute(21)
    assert isinstance(ref, nbcluster.ObjectRef)
    assert nbcluster.get(ref) == 42
    assert sorted(_marks(tmp_path / "runs")) == ["join", "left", "right", "source"]

    # Another execute, with another input, runs every node once more.
    assert nbcluster.get(dag.execute(5)) == 10
    assert sorted(_marks(tmp_path / "runs")) == sorted(["join", "left", "right", "source"] * 2)


def test_upstream_results_are_passed_as_refs(shared_cluster):
    @nbcluster.remote
    def make(n):
        return list(range(n))

    @nbcluster.remote
    def total(xs, nested):
        # a top-level ref is resolved; a ref inside a list stays a ref (as with .remote)
        return sum(xs), type(nested[0]).__name__

    with InputNode() as inp:
        xs = make.bind(inp)
        dag = total.bind(xs, [xs])

    assert nbcluster.get(dag.execute(4)) == (6, "ObjectRef")


def test_input_node_args_kwargs_and_attributes(shared_cluster):
    @nbcluster.remote
    def combine(a, b, scale, offset):
        return (a + b) * scale + offset

    with InputNode() as inp:
        dag = combine.bind(inp[0], inp[1], inp.scale, offset=inp["offset"])

    assert nbcluster.get(dag.execute(2, 3, scale=10, offset=1)) == 51
    assert nbcluster.get(dag.execute(1, 1, scale=1, offset=0)) == 2

    # One value: indexed, keyed, or its attributes.
    with InputNode() as one:
        by_index = combine.bind(one[0], one[1], one[2], one[3])
        by_attr = combine.bind(one.a, one.b, one.scale, one.offset)
        by_key = combine.bind(one["a"], one["b"], one["scale"], one["offset"])
    assert nbcluster.get(by_index.execute([1, 2, 3, 4])) == 13
    assert nbcluster.get(by_attr.execute(SimpleNamespace(a=1, b=2, scale=3, offset=4))) == 13
    assert nbcluster.get(by_key.execute({"a": 1, "b": 2, "scale": 3, "offset": 4})) == 13


def test_multi_output_node_returns_a_list_of_refs(shared_cluster):
    @nbcluster.remote
    def square(x):
        return x * x

    @nbcluster.remote(num_returns=2)
    def split(x):
        return x, -x

    with InputNode() as inp:
        sq = square.bind(inp)
        dag = MultiOutputNode([sq, square.bind(sq), split.bind(inp)])

    out = dag.execute(3)
    assert isinstance(out, list) and len(out) == 3
    assert all(isinstance(r, nbcluster.ObjectRef) for r in out[:2])
    assert nbcluster.get(out[:2]) == [9, 81]
    assert nbcluster.get(out[2]) == [3, -3]  # num_returns=2: a list of refs


def test_options_apply_when_the_dag_executes(shared_cluster):
    Counter = _counter_class()

    @nbcluster.remote
    def pair(x):
        return x, x + 1

    name = f"dag-counter-{uuid.uuid4().hex[:8]}"
    counter = Counter.options(name=name).bind(7)
    refs = pair.options(num_returns=2).bind(1).execute()

    assert nbcluster.get(refs) == [1, 2]
    handle = counter.execute()
    assert nbcluster.get(nbcluster.get_actor(name).get.remote()) == 7
    del handle


def test_calls_bound_on_a_class_node_run_in_bind_order_even_when_unused(shared_cluster):
    Counter = _counter_class()

    counter = Counter.bind()
    first = counter.inc.bind()
    counter.inc.bind(10)  # nothing uses its result: it still runs, in its place
    last = counter.get.bind()
    dag = MultiOutputNode([first, last])

    assert nbcluster.get(dag.execute()) == [1, 11]
    # Each execute creates a new actor, which starts from scratch.
    assert nbcluster.get(dag.execute()) == [1, 11]
    # Executing one call runs the calls bound before it on the same actor...
    assert nbcluster.get(last.execute()) == 11
    # ...and executing the ClassNode creates the actor and runs all its calls.
    handle = counter.execute()
    assert nbcluster.get(handle.get.remote()) == 11


def test_each_execute_creates_its_own_actor_once(shared_cluster):
    Counter = _counter_class()

    with InputNode() as inp:
        counter = Counter.bind(inp)
        who_a = counter.whoami.bind()
        who_b = counter.whoami.bind()
        dag = MultiOutputNode([who_a, who_b, counter.get.bind()])

    a1, b1, start1 = nbcluster.get(dag.execute(1))
    a2, b2, start2 = nbcluster.get(dag.execute(2))
    assert a1 == b1 and a2 == b2  # one actor per execute, shared by its calls
    assert a1 != a2  # a new actor for each execute
    assert (start1, start2) == (1, 2)

    h1, h2 = counter.execute(0), counter.execute(0)
    assert isinstance(h1, nbcluster.ActorHandle)
    assert h1.actor_id != h2.actor_id


def test_class_node_constructor_takes_upstream_results(shared_cluster):
    Counter = _counter_class()

    @nbcluster.remote
    def base(x):
        return x * 100

    with InputNode() as inp:
        counter = Counter.bind(base.bind(inp))
        dag = counter.inc.bind(inp)

    assert nbcluster.get(dag.execute(2)) == 202


def test_calls_on_a_live_handle(shared_cluster):
    Counter = _counter_class()
    handle = Counter.remote()

    with InputNode() as inp:
        inc = handle.inc.bind(inp)
        dag = MultiOutputNode([inc, handle.get.bind()])

    assert isinstance(inc, ClassMethodNode)
    graph = dag.to_dict()
    assert [n["actor"] for n in graph["nodes"] if "actor" in n] == [handle.actor_id] * 2
    assert [e["kind"] for e in graph["edges"]].count("order") == 1
    assert f"actor({handle.actor_id[:8]}).inc({inp.get_id()})" in str(dag._repr_mimebundle_())
    assert nbcluster.get(dag.execute(2)) == [2, 2]
    assert nbcluster.get(dag.execute(3)) == [5, 5]  # the same actor, every execute
    assert nbcluster.get(handle.get.remote()) == 5


def test_an_error_in_a_node_reaches_the_output_as_task_error(shared_cluster, tmp_path):
    @nbcluster.remote(max_retries=0)
    def fail(x):
        raise ValueError(f"bad input {x}")

    @nbcluster.remote
    def after(x, log):
        Path(log).write_text("ran")
        return x

    with InputNode() as inp:
        dag = MultiOutputNode([after.bind(fail.bind(inp), str(tmp_path / "after")), fail.bind(0)])

    out = dag.execute(7)
    # try/except rather than pytest.raises(...) as info: Python unbinds ``e`` at the end of
    # the block, so no frame <-> traceback cycle keeps refs alive until a GC pass.
    try:
        nbcluster.get(out[0])
    except TaskError as e:
        assert isinstance(e, ValueError)  # also an instance of the cause's class
        assert isinstance(e.cause, ValueError) and str(e.cause) == "bad input 7"
    else:
        pytest.fail("the output of a failed node did not raise")
    assert not (tmp_path / "after").exists()  # the downstream task never ran its body
    with pytest.raises(TaskError, match=r"bad input 0"):
        nbcluster.get(out[1])


def test_a_call_waiting_for_an_upstream_task_still_runs_before_later_calls(shared_cluster):
    @nbcluster.remote
    def slow(value):
        time.sleep(0.5)  # long enough for the later call to overtake it if it can
        return value

    @nbcluster.remote
    class Log:
        def __init__(self):
            self.items = []

        def add(self, item):
            self.items.append(item)

        def get(self):
            return list(self.items)

    log = Log.bind()
    log.add.bind(slow.bind("first"))
    log.add.bind("second")
    items = nbcluster.get(log.get.bind().execute())
    assert items == ["first", "second"]
