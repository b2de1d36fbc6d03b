"""The package's version: the runtime reports it (the head's status), and the package face
publishes it as ``nbcluster.__version__``."""

__all__ = ["__version__"]

__version__ = "0.1.0"
