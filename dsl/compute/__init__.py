"""TBE's ``tbe.dsl.compute`` namespace (``from dsl.compute import cube_util``)."""
