"""The per-node object store: files in shared memory (``store``) and their accounting (``state``)."""
