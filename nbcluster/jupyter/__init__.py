"""The Jupyter layer: ``%cluster`` magics, rich displays, task output routing.

Nothing is imported here, so that ``import nbcluster`` stays cheap: the magics load with
``%load_ext nbcluster`` (:mod:`nbcluster.jupyter.magics`); ``import nbcluster`` imports
:mod:`nbcluster.jupyter.display`, which installs the reprs of ``ObjectRef`` and
``TaskError`` in the runtime's display registry. This package uses only the public API and :mod:`nbcluster.state`.
"""
