"""nbcluster's version, kept here so the runtime (the head reports it) needs nothing above it."""

__version__ = "0.1.0"
