"""The Jupyter layer: ``%cluster`` magics, rich displays, task output routing.

Nothing is imported here, so that ``import nbcluster`` stays cheap: the magics load with
``%load_ext nbcluster`` (:mod:`nbcluster.jupyter.magics`), and the first rich display of
an ``ObjectRef`` or ``TaskError`` imports :mod:`nbcluster.jupyter.display`, which installs
their renderers in the runtime's display registry. This package uses the modules behind the
public API (``nbcluster._api``, ``_actor``, ``_refs``: what the package face hands on) and
:mod:`nbcluster.state`, never the face itself: the face loads this layer on demand, so an
import of it here would close a loop.
"""
