"""TBE's vector DSL (``tbe.dsl``'s math, compare, cast, broadcast and reduce calls).

Same names and arguments as TBE, so a TBE script composing them with the cube operators ports
by its imports (``import dsl`` for ``from tbe import dsl``). Each call returns one tagged
``te.compute`` (two for an fp16 ``reduce_sum``): ``"elemwise.<op>"``, ``"broadcast"``,
``"reduce.<op>"`` or ``"injective.vcmp_bit"`` (patterns of :mod:`dsl.ops.tag`), which
``dsl.auto_schedule`` schedules by pattern.

Rules shared with TBE: binary ops take equal shapes *and* dtypes (no implicit promotion or
broadcasting: E65002 names both dtypes; use :func:`cast_to` and :func:`broadcast`); a scalar
operand is cast to the tensor's dtype; every check raises ``DslError`` before compilation.
"""

from dsl.ops.vector.broadcast import broadcast
from dsl.ops.vector.cast import cast_to, ceil, floor, round, trunc  # noqa: A004
from dsl.ops.vector.compare import vcmp, vcmpsel, vsel
from dsl.ops.vector.elemwise import (
    vabs,
    vadd,
    vadds,
    vdiv,
    vexp,
    vlog,
    vmax,
    vmaxs,
    vmin,
    vmins,
    vmul,
    vmuls,
    vrec,
    vrelu,
    vsqrt,
    vsub,
)
from dsl.ops.vector.reduce import reduce_max, reduce_min, reduce_sum

__all__ = ["broadcast", "cast_to", "ceil", "floor", "reduce_max", "reduce_min", "reduce_sum",
           "round", "trunc", "vabs", "vadd", "vadds", "vcmp", "vcmpsel", "vdiv", "vexp", "vlog",
           "vmax", "vmaxs", "vmin", "vmins", "vmul", "vmuls", "vrec", "vrelu", "vsel", "vsqrt",
           "vsub"]
