"""TBE's ``tbe.dsl.compute`` namespace (``from dsl.compute import cube_util``)."""

from dsl.compat import cube_util  # noqa: F401
