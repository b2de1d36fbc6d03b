"""The lazy DAG API without a cluster: what bind() builds, how a DAG prints, misuse errors.

Nothing here starts a cluster: binding never submits, and the checks of ``execute()``'s
arguments run before anything is submitted (each test that could start one asserts that
it did not). DAGs made of input nodes only run locally, which tests InputNode's rules.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import nbcluster
import nbcluster.dag
from nbcluster.dag import (
    ClassMethodNode,
    ClassNode,
    DAGNode,
    FunctionNode,
    InputAttributeNode,
    InputNode,
    MultiOutputNode,
)


@pytest.fixture(autouse=True)
def _no_cluster():
    """Every test here runs, and ends, without a cluster."""
    if nbcluster.is_initialized():
        nbcluster.shutdown()
    yield
    assert not nbcluster.is_initialized(), "a DAG test started a cluster"


@nbcluster.remote
def add(a, b=0):
    return a + b


@nbcluster.remote
def double(x):
    return 2 * x


@nbcluster.remote
class Counter:
    def __init__(self, start=0):
        self.n = start

    def inc(self, by=1):
        self.n += by
        return self.n

    def get(self):
        return self.n

    @staticmethod
    def version(tag):
        return tag


def _ids(nodes):
    return [n.get_id() for n in nodes]


# ------------------------------------------------------------------------ what bind builds


def test_bind_on_function_class_and_method_builds_the_right_nodes():
    with InputNode() as inp:
        counter = Counter.bind(5)
        inc = counter.inc.bind(inp[0])
        dbl = double.bind(inc)
        out = add.bind(dbl, b=inp.extra)

    assert isinstance(counter, ClassNode) and isinstance(counter, DAGNode)
    assert isinstance(inc, ClassMethodNode)
    assert isinstance(dbl, FunctionNode)
    assert isinstance(out, FunctionNode)
    assert out.get_args() == (dbl,)
    assert out.get_kwargs() == {"b": inp.extra}
    assert inc.get_args() == (inp[0],)
    assert counter.get_args() == (5,)
    assert _ids(out.get_nodes()) == _ids([inp, counter, inp[0], inc, dbl, inp.extra, out])


def test_options_are_kept_and_shown():
    f = add.options(num_cpus=2, name="adder").bind(1, 2)
    c = Counter.options(name="counter", max_restarts=1).bind()
    m = c.inc.options(num_returns=0).bind()

    assert isinstance(f, FunctionNode) and isinstance(c, ClassNode)
    assert f.get_options() == {"num_cpus": 2, "name": "adder"}
    assert c.get_options() == {"name": "counter", "max_restarts": 1}
    assert m.get_options() == {"num_returns": 0}
    assert add.bind(1).get_options() == {}
    # the decorator's options count too
    assert nbcluster.remote(num_gpus=1)(lambda: 1).bind().get_options() == {"num_gpus": 1}


def test_nothing_runs_at_bind_time(tmp_path: Path):
    marker = tmp_path / "ran"

    @nbcluster.remote
    def side_effect(path):
        Path(path).write_text("ran")
        return 1

    @nbcluster.remote
    class Writer:
        def __init__(self, path):
            Path(path).write_text("init")

        def write(self, path):
            Path(path).write_text("method")

    with InputNode() as inp:
        node = side_effect.bind(str(marker))
        w = Writer.bind(str(marker))
        dag = MultiOutputNode([node, w.write.bind(str(marker)), side_effect.bind(inp)])
    str(dag), dag.to_dict(), dag._repr_mimebundle_()

    assert not marker.exists()


def test_a_node_bound_in_several_places_is_one_node():
    with InputNode() as inp:
        src = double.bind(inp)
        dag = add.bind(double.bind(src), double.bind(src))

    nodes = dag.get_nodes()
    assert len(nodes) == 5  # inp, src, two doubles, add
    assert sum(1 for n in nodes if n is src) == 1
    assert [e[2] for e in dag.get_edges() if e[0] is src] == ["arg", "arg"]


def test_calls_bound_on_a_class_node_are_part_of_its_dag_in_bind_order():
    c = Counter.bind()
    first = c.inc.bind()
    unused = c.inc.bind(10)
    last = c.get.bind()
    dag = MultiOutputNode([first, last])

    assert _ids(dag.get_nodes()) == _ids([c, first, unused, last, dag])
    assert _ids(c.get_nodes()) == _ids([c, first, unused, last])
    order = [(a.get_id(), b.get_id()) for a, b, kind in dag.get_edges() if kind == "order"]
    assert order == [(first.get_id(), unused.get_id()), (unused.get_id(), last.get_id())]


# ------------------------------------------------------------------------------ InputNode


def test_input_node_access_forms():
    with InputNode() as inp:
        by_index, by_key, by_attr = inp[0], inp["k"], inp.attr

    assert all(isinstance(n, InputAttributeNode) for n in (by_index, by_key, by_attr))
    assert inp[0] is by_index and inp.attr is by_attr  # one node per key
    assert inp["attr"] is not by_attr  # item and attribute access differ for one value
    assert [n._body() for n in (by_index, by_key, by_attr)] == ["inp[0]", "inp['k']", "inp.attr"]
    with pytest.raises(TypeError, match=r"^DAG inputs are read with an int index or a str key"):
        inp[1.5]
    with pytest.raises(AttributeError):
        inp._private  # noqa: B018


def test_input_rules_follow_ray():
    with InputNode() as inp:
        pair = MultiOutputNode([inp[0], inp[1]])
        named = MultiOutputNode([inp[0], inp["k"], inp.k])

    assert inp.execute(5) == 5
    assert pair.execute(1, 2) == [1, 2]  # several arguments: by position
    assert pair.execute([7, 8]) == [7, 8]  # one argument: indexed
    assert named.execute(1, k="v") == [1, "v", "v"]  # keywords by name, as item or attribute


def test_input_attribute_of_one_value():
    with InputNode() as inp:
        dag = MultiOutputNode([inp.x, inp.y])
        keyed = MultiOutputNode([inp["x"], inp["y"]])

    assert dag.execute(SimpleNamespace(x=1, y=2)) == [1, 2]
    assert keyed.execute({"x": 1, "y": 2}) == [1, 2]
    assert dag.execute(x=1, y=2) == [1, 2]


def test_missing_inputs_say_what_execute_got():
    with InputNode() as inp:
        dag = MultiOutputNode([inp[0], inp.k])

    with pytest.raises(
        TypeError,
        match=r"^execute\(1, 2\): the DAG reads inp\.k, but execute\(\) got no keyword "
        r"argument 'k'",
    ):
        dag.execute(1, 2)
    with pytest.raises(
        TypeError, match=r"^execute\(k=1\): the DAG reads inp\[0\], but execute\(\) got only 0 "
    ):
        dag.execute(k=1)
    with pytest.raises(TypeError, match=r"^execute\(5\): the DAG reads inp\[0\], and with one "):
        dag.execute(5)


def test_input_node_itself_takes_exactly_one_argument():
    with InputNode() as inp:
        dag = double.bind(inp)

    with pytest.raises(
        TypeError,
        match=r"^execute\(1, 2\): the DAG passes the InputNode itself to a node, so execute\(\) "
        r"takes exactly one positional argument",
    ):
        dag.execute(1, 2)


def test_execute_arguments_without_an_input_node_are_refused():
    with pytest.raises(
        TypeError, match=r"^execute\(3\): this DAG has no InputNode, so execute\(\) takes no "
    ):
        double.bind(1).execute(3)


def test_a_dag_has_one_input_node():
    with InputNode() as a:
        left = double.bind(a)
    with InputNode() as b:
        right = double.bind(b)

    with pytest.raises(ValueError, match=r"^this DAG uses 2 different InputNodes"):
        add.bind(left, right).execute(1)


def test_binding_an_input_node_outside_with_is_refused():
    inp = InputNode()
    with pytest.raises(
        ValueError, match=r"^double\.bind\(\): InputNode\(\) is used outside its 'with' block"
    ):
        double.bind(inp)
    with pytest.raises(ValueError, match=r"^add\.bind\(\): InputNode\(\) is used outside"):
        add.bind(1, b=[inp[0]])
    with pytest.raises(ValueError, match=r"^MultiOutputNode: InputNode\(\) is used outside"):
        MultiOutputNode([inp.x])
    with pytest.raises(ValueError, match=r"was never entered"):
        inp.execute(1)


def test_an_input_node_stays_usable_after_its_block():
    with InputNode() as inp:
        first = double.bind(inp)
    later = double.bind(inp)  # e.g. in the next notebook cell

    assert later.get_args() == (inp,)
    assert first.get_args() == (inp,)


# ------------------------------------------------------------------------------ misuse


def test_multi_output_node_takes_a_list_of_nodes():
    node = double.bind(1)
    with pytest.raises(
        TypeError,
        match=r"^MultiOutputNode takes DAG nodes \(made with \.bind\(\) or InputNode\), but item 1 "
        r"is 3 \(int\)",
    ):
        MultiOutputNode([node, 3])
    with pytest.raises(TypeError, match=r"^MultiOutputNode takes a list of DAG nodes"):
        MultiOutputNode(node)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^MultiOutputNode needs at least one node"):
        MultiOutputNode([])


def test_multi_output_node_is_not_an_argument():
    out = MultiOutputNode([double.bind(1)])
    with pytest.raises(TypeError, match=r"^double\.bind\(\): a MultiOutputNode cannot be an arg"):
        double.bind(out)
    with pytest.raises(TypeError, match=r"^MultiOutputNode: a MultiOutputNode cannot be an arg"):
        MultiOutputNode([out])


def test_bind_checks_the_signature():
    with pytest.raises(TypeError, match=r"^double\.bind\(\): missing a required argument: 'x'"):
        double.bind()
    with pytest.raises(TypeError, match=r"^Counter\.bind\(\): too many positional arguments"):
        Counter.bind(1, 2)
    c = Counter.bind()
    with pytest.raises(TypeError, match=r"^Counter\.inc\.bind\(\): got an unexpected keyword"):
        c.inc.bind(step=1)
    assert c.version.bind("v1").get_args() == ("v1",)  # a staticmethod takes no self


def test_class_node_methods_and_their_errors():
    c = Counter.bind()
    with pytest.raises(AttributeError, match=r"^actor class Counter has no method 'nope'; methods"):
        c.nope  # noqa: B018
    with pytest.raises(TypeError, match=r"whose actor exists only while the DAG executes"):
        c.inc.remote()
    with pytest.raises(TypeError, match=r"^Actor methods cannot be called directly"):
        c.inc()
    with pytest.raises(ValueError, match=r"^invalid option\(s\) for an actor method: num_cpus"):
        c.inc.options(num_cpus=1)
    assert c.get_method("get").bind().get_args() == ()


def test_nodes_have_no_remote_and_are_bound_once():
    node = double.bind(1)
    with pytest.raises(AttributeError, match=r"has no \.remote\(\).*\.execute\(\.\.\.\)"):
        node.remote()
    with pytest.raises(AttributeError, match=r"^FunctionNode is already bound"):
        node.bind()


def test_nodes_cannot_be_pickled():
    with pytest.raises(TypeError, match=r"cannot be pickled or sent to the cluster"):
        pickle.dumps(double.bind(1))


# ------------------------------------------------------------------------------ display


def test_str_shows_the_nested_structure():
    with InputNode() as inp:
        c = Counter.options(name="c").bind()
        x = double.options(num_cpus=2).bind(inp[0])
        dag = add.bind(c.inc.bind(x), b=x)
    i, a, m = inp[0].get_id(), x.get_id(), dag.get_args()[0].get_id()

    assert str(dag) == "\n".join(
        [
            f"(FunctionNode {dag.get_id()})(",
            "    body=add",
            "    args=[",
            f"        (ClassMethodNode {m})(",
            "            body=Counter.inc",
            f"            actor=(ClassNode {c.get_id()})(",
            "                body=Counter",
            "                args=[]",
            "                options={name: 'c'}",
            f"                calls=[{m}]",
            "            )",
            "            args=[",
            f"                (FunctionNode {a})(",
            "                    body=double",
            "                    args=[",
            f"                        (InputAttributeNode {i})(",
            "                            body=inp[0]",
            f"                            input=(InputNode {inp.get_id()})",
            "                        )",
            "                    ]",
            "                    options={num_cpus: 2}",
            "                )",
            "            ]",
            "            options={}",
            "        )",
            "    ]",
            "    kwargs={",
            f"        b: (FunctionNode {a}) <shown above>",
            "    }",
            "    options={}",
            ")",
        ]
    )


def test_to_dict_gives_nodes_and_edges():
    with InputNode() as inp:
        c = Counter.bind(inp.start)
        first = c.inc.bind()
        c.inc.bind([first, 2])
        dag = MultiOutputNode([first, c.get.bind(), add.options(num_cpus=0.5).bind(inp[0], b=3)])

    d = dag.to_dict()
    json.dumps(d)  # for tools: plain JSON
    ids = _ids(dag.get_nodes())
    assert d["output"] == dag.get_id()
    assert [n["id"] for n in d["nodes"]] == ids
    by_id = {n["id"]: n for n in d["nodes"]}
    assert [by_id[i]["kind"] for i in ids] == [
        "InputNode",
        "InputAttributeNode",
        "ClassNode",
        "ClassMethodNode",
        "ClassMethodNode",
        "ClassMethodNode",
        "InputAttributeNode",
        "FunctionNode",
        "MultiOutputNode",
    ]
    inp_id, start_id, c_id, first_id, second_id, get_id, zero_id, add_id, _ = ids
    assert (by_id[start_id]["key"], by_id[start_id]["accessor"]) == ("start", "attr")
    assert by_id[c_id]["args"] == [{"node": start_id}]
    assert by_id[c_id]["calls"] == [first_id, second_id, get_id]
    assert by_id[second_id]["args"] == [{"value": f"[{first_id}, 2]", "nodes": [first_id]}]
    assert by_id[second_id]["actor"] == c_id
    assert by_id[add_id]["name"] == "add"
    assert by_id[add_id]["args"] == [{"node": zero_id}]
    assert by_id[add_id]["kwargs"] == {"b": {"value": "3"}}
    assert by_id[add_id]["options"] == {"num_cpus": 0.5}
    edges = {(e["source"], e["target"], e["kind"]) for e in d["edges"]}
    assert edges == {
        (inp_id, start_id, "input"),
        (inp_id, zero_id, "input"),
        (start_id, c_id, "arg"),
        (c_id, first_id, "actor"),
        (c_id, second_id, "actor"),
        (c_id, get_id, "actor"),
        (first_id, second_id, "arg"),  # also the call order: no separate order edge
        (second_id, get_id, "order"),
        (zero_id, add_id, "arg"),
        (first_id, dag.get_id(), "output"),
        (get_id, dag.get_id(), "output"),
        (add_id, dag.get_id(), "output"),
    }
    assert [by_id[i]["depth"] for i in ids] == [0, 1, 2, 3, 4, 5, 1, 2, 6]


def test_mimebundle_has_a_listing_and_an_escaped_svg():
    evil = nbcluster.remote(lambda x: x)  # its name is "<lambda>"
    with InputNode() as inp:
        dag = add.bind(evil.bind(inp["<b>key</b>"]), b="<script>alert(1)</script>")
    bundle = dag._repr_mimebundle_()

    assert set(bundle) == {"text/plain", "text/html"}
    lines = bundle["text/plain"].splitlines()
    assert lines[0] == f"DAG of 4 node(s); output {dag.get_id()} (FunctionNode)"
    assert lines[-1].split() == [
        dag.get_id(),
        "FunctionNode",
        f"add({dag.get_args()[0].get_id()},",
        "b='<script>alert(1)</script>')",
    ]
    html = bundle["text/html"]
    assert "<svg" in html
    assert html.count('<g class="nbcluster-dag-node"') == 4
    assert html.count('<path class="nbcluster-dag-edge"') == 3
    assert "&lt;lambda&gt;" in html and "<lambda>" not in html
    assert "<script>" not in html and "<b>key" not in html


def test_large_dags_are_listed_not_drawn_and_deep_ones_do_not_recurse():
    node = double.bind(0)
    for _ in range(2000):
        node = double.bind(node)

    assert len(node.get_nodes()) == 2001
    html = node._repr_mimebundle_()["text/html"]
    assert "too large to draw" in html and "<svg" not in html
    assert "1942 more node(s)" in node._repr_mimebundle_()["text/plain"]
    assert "<deeper nodes: see to_dict()>" in str(node)
    assert node.to_dict()["nodes"][-1]["depth"] == 2000


def test_to_figure_is_a_static_plotly_figure():
    import plotly.graph_objects as go

    with InputNode() as inp:
        c = Counter.bind()
        c.inc.bind()
        dag = MultiOutputNode([double.bind(inp), c.get.bind()])
    fig = dag.to_figure()

    assert isinstance(fig, go.Figure)
    kinds = {t.name for t in fig.data if t.mode == "markers+text"}
    assert kinds == {"InputNode", "FunctionNode", "ClassNode", "ClassMethodNode", "MultiOutputNode"}


def test_importing_the_dag_package_imports_no_plotly():
    code = "import sys, nbcluster.dag; sys.exit('plotly' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_exports():
    assert sorted(nbcluster.dag.__all__) == [
        "ClassMethodNode",
        "ClassNode",
        "DAGNode",
        "FunctionNode",
        "InputAttributeNode",
        "InputNode",
        "MultiOutputNode",
    ]
    for name in nbcluster.dag.__all__:
        assert getattr(nbcluster.dag, name).__module__.startswith("nbcluster.dag.")
        assert getattr(nbcluster.dag, name).__doc__
