"""head internals."""
