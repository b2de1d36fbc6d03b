"""Live widgets: task timeline, resources, object store, task graph, progress bars.

Each is a small object that owns an ipywidget (a plotly ``FigureWidget`` or a box of
ipywidgets) and is updated from the kernel's one throttled feed (``_feed.py``: one
subscription to the head's pushed event stream, handed out a few times a second at most). ipywidgets and plotly are imported
when a widget is created, never by ``import nbcluster``. Every widget has a text/plain
repr, so it reads well where widgets do not render.

- :class:`Timeline` — a lane per worker, a bar per task attempt, a colour per function, a
  picker of the cell whose work it shows.
- :class:`Resources` — CPU, GPU, memory and custom resources in use per node.
- :class:`ObjectStore` — store use per node over time, and the largest objects this
  notebook owns with the variables that hold them.
- :class:`DAGView` — the tasks behind some refs as a graph, coloured by state.
- :func:`progress` — a progress bar for many refs (returns a :class:`Progress` handle).
- :class:`Autoscaler` — nodes and pending demand over time, with the scaling events.
- :func:`dashboard` — Timeline, Resources and ObjectStore in tabs (``%cluster widgets``),
  plus Autoscaler when the cluster has one.
"""

from nbcluster.jupyter.widgets._autoscaler import Autoscaler
from nbcluster.jupyter.widgets._dag import DAGView
from nbcluster.jupyter.widgets._dashboard import Dashboard, dashboard
from nbcluster.jupyter.widgets._objects import ObjectStore, find_ref_names
from nbcluster.jupyter.widgets._progress import Progress, progress
from nbcluster.jupyter.widgets._resources import Resources
from nbcluster.jupyter.widgets._timeline import Timeline

__all__ = [
    "Autoscaler",
    "DAGView",
    "Dashboard",
    "ObjectStore",
    "Progress",
    "Resources",
    "Timeline",
    "dashboard",
    "find_ref_names",
    "progress",
]
