"""clusterkit's version, in a module of its own that imports nothing: every layer may read it
without importing the package root (whose public names are the API's)."""

__version__ = "0.1.0"
