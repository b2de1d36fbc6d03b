"""worker internals."""
