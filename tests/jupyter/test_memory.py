"""Memory a person can act on: release buttons in the object-store widget, the ``Out[n]``
policy, against a real 2-CPU cluster in this process."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import nbcluster
from nbcluster import state
from nbcluster.jupyter.memory import (
    DEFAULT_OUT_POLICY,
    OutPolicy,
    apply_out_policy,
    holds_refs,
    parse_out_policy,
    release_variable,
)
from nbcluster.jupyter.widgets import ObjectStore
from nbcluster.jupyter.widgets._feed import Feed
from nbcluster.jupyter.widgets._objects import releasable
from nbcluster.testing import assert_no_processes, poll_for

pytestmark = pytest.mark.integration

MB = 1_000_000


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    if nbcluster.is_initialized():
        nbcluster.shutdown()
    info = nbcluster.init(num_cpus=1)
    yield info
    nbcluster.shutdown()
    assert_no_processes(info.session_dir, timeout=15)


def owned_ids() -> set[str]:
    return {o.object_id for o in state.owned_objects()}


def test_release_buttons_free_what_a_variable_holds(cluster: Any) -> None:
    big = nbcluster.put(b"x" * (3 * MB))
    small = nbcluster.put(b"y" * (2 * MB))
    ns: dict[str, Any] = {"big": big, "pair": (small, big), "Out": {4: small}, "_4": small}
    big_id, small_id = big.hex(), small.hex()
    del big, small
    feed = Feed(autostart=False)
    store = ObjectStore(user_ns=ns, feed=feed)
    try:
        feed.poll_once()
        labels = [b.description for b in store.buttons]
        assert labels == ["release big", "release pair", "release Out[4]"]
        assert "3.0 MiB" not in store.buttons[0].tooltip and "2.9 MiB" in store.buttons[0].tooltip

        # "big" is also held by "pair": releasing it frees nothing yet.
        assert store.release("big") == 0
        assert "big" not in ns and big_id in owned_ids()
        assert store.last_release == "released big: 0 B freed"
        # "pair" held the last ref to the big object (the small one is in Out[4] too).
        freed = store.release("pair")
        assert 3 * MB <= freed < 3 * MB + 4096
        assert big_id not in owned_ids() and small_id in owned_ids()
        assert store.last_release.startswith("released pair: 2.9 MiB freed")
        assert [b.description for b in store.buttons] == ["release Out[4]"]
        assert store.release("_4") >= 2 * MB
        assert ns == {"Out": {}} and store.buttons == []
        assert store.release("nothing") == 0
        assert store.last_release == "nothing released: no variable 'nothing' to release"
    finally:
        store.close()
        feed.stop()


def test_out_policy_drops_old_output_refs(cluster: Any) -> None:
    refs = [nbcluster.put(i) for i in range(4)]
    ns: dict[str, Any] = {
        "Out": {1: refs[0], 2: [refs[1]], 3: "text", 4: {"k": refs[2]}, 5: refs[3]},
        "_1": refs[0],
        "_5": refs[3],
        "_": refs[3],
        "kept": refs[0],
    }
    assert apply_out_policy(ns, OutPolicy("keep")) == []
    assert apply_out_policy(ns, parse_out_policy(["last", "2"])) == [1, 2]
    assert sorted(ns["Out"]) == [3, 4, 5] and "_1" not in ns and ns["kept"] is refs[0]
    assert apply_out_policy(ns, OutPolicy("clear")) == [4, 5]
    assert ns["Out"] == {3: "text"} and ns["_"] == "" and "_5" not in ns
    assert holds_refs(refs) and holds_refs((1, refs[0])) and not holds_refs([[refs[0]]])
    assert OutPolicy("last", 10) == DEFAULT_OUT_POLICY
    with pytest.raises(ValueError, match="use keep, clear or last N"):
        parse_out_policy(["last", "0"])


def test_release_variable_names() -> None:
    ns: dict[str, Any] = {"refs": [1], "Out": {2: "v"}, "_2": "v", "__": "v"}
    assert release_variable(ns, "refs[3]") == ["refs"]
    assert release_variable(ns, "Out[2]") == ["Out[2]", "_2"]
    assert ns == {"Out": {}, "__": ""}
    with pytest.raises(KeyError, match="no output Out\\[9\\]"):
        release_variable(ns, "Out[9]")
    assert releasable(("x", "refs[3]", "refs['a']", "Out[7]", "_7")) == ["x", "refs", "Out[7]"]


def test_out_refs_policy_applies_after_each_cell(cluster: Any) -> None:
    """The kernel hooks apply the policy after every cell (IPython shell, real Out)."""
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.testing.globalipapp import start_ipython

    start_ipython()
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "nbcluster")
    try:
        ip.run_line_magic("cluster", "out-refs clear")
        result = ip.run_cell(
            "import nbcluster\nnbcluster.put(b'z' * 2_000_000)", store_history=True
        )
        oid = result.result.hex()
        del result
        assert not any(holds_refs(v) for v in ip.user_ns["Out"].values())
        ip.run_cell("pass")  # IPython's last execution result held the value until now
        poll_for(lambda: oid not in owned_ids(), 10, 0.05, "the output's object to be freed")
        ip.run_line_magic("cluster", "out-refs keep")
        result = ip.run_cell("nbcluster.put(b'w' * 1000)", store_history=True)
        assert any(v is result.result for v in ip.user_ns["Out"].values())
    finally:
        ip.run_line_magic("cluster", "out-refs last 10")
        ip.run_line_magic("unload_ext", "nbcluster")
