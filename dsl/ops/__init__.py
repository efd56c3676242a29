"""Operator computes (what, in TE): one operator per module, plus their shared geometry.

Every stage is a tagged ``te.compute`` (tags in :mod:`dsl.ops.tag`); schedules find stages by
those tags. Shared pieces: :mod:`~dsl.ops.conv_geometry` (the conv index map and padding),
:mod:`~dsl.ops.group` (group_dict, the group FracZ map), :mod:`~dsl.ops.layout` (5HD / FracZ
packing), :mod:`~dsl.ops.para_dict` (TBE parameter parsing). :mod:`~dsl.ops.vector` is TBE's
vector DSL (``vadd`` ... ``reduce_sum``), the elementwise / broadcast / reduce stages users
compose with the operators.
"""
