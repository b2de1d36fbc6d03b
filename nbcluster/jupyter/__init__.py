"""The Jupyter layer: ``%cluster`` magics, rich displays, task output routing.

Nothing is imported here, so that ``import nbcluster`` stays cheap: the magics load with
``%load_ext nbcluster`` (:mod:`nbcluster.jupyter.magics`), and the first rich display of
an ``ObjectRef`` or ``TaskError`` imports :mod:`nbcluster.jupyter.display`, which installs
their renderers in the runtime's display registry. This package uses only the public API
and :mod:`nbcluster.state`.
"""
