"""Runtime environments (Ray's ``runtime_env``): validation, packing, upload, per-node setup.

- :mod:`.spec` — what a ``runtime_env`` may hold; normalizing, inheritance, hashing (pure).
- :mod:`.pack` — content-hashed zips of local directories (``working_dir``, ``py_modules``).
- :mod:`.resolve` — a user's env → the resolved form that travels (local paths uploaded).
- :mod:`.agent` — a node's cache: download and unpack packages, build pip environments.
- :mod:`.pip_env` — virtual environments with ``uv`` (or pip), layered over the base one.
- :mod:`.worker` — what a worker or job entrypoint applies at start.
"""
