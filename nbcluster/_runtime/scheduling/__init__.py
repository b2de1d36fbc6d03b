"""scheduling internals."""
