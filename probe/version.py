"""The package's version, in a module of its own so that the store can record it without
importing the package's entry points."""

__version__ = "0.2.0"
