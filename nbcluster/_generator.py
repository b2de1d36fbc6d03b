"""What generator tasks return (defined in :mod:`nbcluster._runtime.ref_generators`).

A remote generator function returns an :class:`ObjectRefGenerator` (``num_returns=
"streaming"``, the default) or one ref to a :class:`DynamicObjectRefGenerator`
(``num_returns="dynamic"``). The runtime makes both; the API layer imports them from here.
"""

from nbcluster._runtime.ref_generators import (
    DynamicObjectRefGenerator,
    ObjectRefGenerator,
    start_generator,
    wait_mixed,
)

__all__ = ["DynamicObjectRefGenerator", "ObjectRefGenerator", "start_generator", "wait_mixed"]
