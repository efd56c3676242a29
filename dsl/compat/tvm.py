"""The ``tvm`` that TBE scripts import (``from tbe import tvm``): TE's tensor-building calls.

Porting a TBE script means ``from dsl import tvm``; ``tvm.placeholder`` and friends then build
the TE tensors the DSL operators take. Everything else of Apache TVM is reachable as usual with
``import tvm``.
"""

from tvm.te import compute, placeholder, reduce_axis, sum  # noqa: A004, F401
from tvm.tirx import const  # noqa: F401
