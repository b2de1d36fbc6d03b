"""core internals."""
