"""TBE compatibility shims: the names TBE scripts import, so a script ports by its imports.

``from dsl import tvm`` is :mod:`dsl.compat.tvm`; ``from dsl.compute import cube_util`` is
:mod:`dsl.compat.cube_util` (``dsl.compute`` is :mod:`dsl.compat.compute`). The old paths are
kept by :mod:`dsl._aliases`.
"""
