"""Compiled graphs (Ray's ``experimental_compile``): an actor DAG set up once, then run by
writing to and reading from preallocated channels instead of submitting tasks::

    with InputNode() as inp:
        dag = b.double.bind(a.inc.bind(inp))
    compiled = dag.experimental_compile()
    assert nbcluster.get(compiled.execute(1)) == 4
    compiled.teardown()

Channels are shared memory between processes of one host (see ``_shm``) and actor calls
between hosts (see ``_relay``). Each actor runs its calls of the graph in a loop thread
(see ``_loop``).
"""

from nbcluster.dag.compiled._compiled import (
    CompiledDAG,
    CompiledDAGFuture,
    CompiledDAGRef,
    compile_dag,
)
from nbcluster.dag.compiled._errors import (
    CgraphCapacityExceeded,
    ChannelError,
    ChannelTimeoutError,
)

__all__ = [
    "CgraphCapacityExceeded",
    "ChannelError",
    "ChannelTimeoutError",
    "CompiledDAG",
    "CompiledDAGFuture",
    "CompiledDAGRef",
    "compile_dag",
]
