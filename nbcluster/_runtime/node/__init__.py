"""node internals."""
