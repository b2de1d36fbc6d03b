"""The Jupyter layer: ``%cluster`` magics, rich displays, task output routing.

Nothing is imported here, so that ``import nbcluster`` stays cheap: the magics load with
``%load_ext nbcluster`` (:mod:`nbcluster.jupyter.magics`), and the reprs of
``ObjectRef`` and ``TaskError`` import :mod:`nbcluster.jupyter.display` when a front end
asks for them. This package uses only the public API and :mod:`nbcluster.state`.
"""
