"""The DSL's version: one place, read by the package, the build records and ``--version``."""

__version__ = "0.2.0"
