"""The per-node object store: files in shared memory (``store``), accounting (``state``)."""
