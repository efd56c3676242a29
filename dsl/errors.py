"""The one exception type of the project, and the checks that raise it.

TBE raises ``RuntimeError`` carrying an error code (``E60011`` ...); :class:`DslError` is a
``RuntimeError`` subclass so TBE-era ``except RuntimeError`` still works, and it carries the code,
the parameter, the offending value and the rule so a caller can react to any of them.

Every check here runs on plain Python values, before TVM is asked to do anything, so a bad call
never compiles or writes a file.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

# TBE-style error codes. Kept as data so messages and tests agree on one table.
E_RANGE = "E60011"  # a value outside its allowed range
E_DTYPE_MISMATCH = "E65002"  # two tensors that must share a dtype do not
E_CHANNEL = "E60002"  # channel counts that must agree do not
E_GEOMETRY_IN = "E60024"  # input / output spatial sizes inconsistent
E_GEOMETRY_OUT = "E60025"  # output spatial size impossible (no valid tap)
E_GROUPS = "E60108"  # groups / group_dict invalid
E_SHAPE = "E60003"  # wrong rank or non-positive dimension
E_TYPE = "E60005"  # wrong Python type (bool where int, float where int, ...)
E_DTYPE = "E60006"  # unsupported dtype
E_NAME = "E60030"  # kernel name / path invalid
E_FILE = "E60040"  # kernel files missing, corrupt or built elsewhere
E_VALUE = "E60012"  # any other invalid value


class DslError(RuntimeError):
    """A call the DSL refuses, raised before anything is compiled or written.

    Attributes
    ----------
    code : str
        TBE-style error code, e.g. ``"E60011"``.
    param : str
        The parameter at fault, e.g. ``"para_dict['strides']"``.
    value : object
        The offending value.
    rule : str
        What the value must satisfy (and how to fix it).
    """

    def __init__(self, code: str, param: str, value: object, rule: str):
        self.code, self.param, self.value, self.rule = code, param, value, rule
        super().__init__(f"[{code}] {param}={_short(value)!s}: {rule}")


def _short(value: object, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def fail(code: str, param: str, value: object, rule: str) -> DslError:
    """Build the error (callers ``raise fail(...)`` so tracebacks point at the check)."""
    return DslError(code, param, value, rule)


def check_int(param: str, value: object, *, lo: int | None = None, hi: int | None = None,
              code: str = E_RANGE) -> int:
    """Return ``value`` as an int if it is a true integer within ``[lo, hi]``.

    bools are refused: ``True`` as a stride is a bug in the caller, not the number 1.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise fail(E_TYPE, param, value, f"must be an integer, got {type(value).__name__}")
    value = int(value)
    if lo is not None and value < lo:
        raise fail(code, param, value, f"must be >= {lo}")
    if hi is not None and value > hi:
        raise fail(code, param, value, f"must be <= {hi}")
    return value


def check_bool(param: str, value: object, *, numpy_bool: bool = False,
               name_type: bool = False) -> bool:
    """Return ``value`` if it is ``True`` or ``False`` (ints such as 0 / 1 are refused).

    ``numpy_bool`` also accepts ``numpy.bool_`` (returned as a Python bool), for parameters
    that arrive from numpy arrays (an ``output_mask``); ``name_type`` adds the offending
    value's type to the rule ("must be True or False, got int").
    """
    if isinstance(value, bool):
        return value
    if numpy_bool:
        try:
            import numpy as np

            if isinstance(value, np.bool_):
                return bool(value)
        except ImportError:  # pragma: no cover
            pass
    rule = "must be True or False"
    raise fail(E_TYPE, param, value, f"{rule}, got {type(value).__name__}" if name_type else rule)


def check_ints(param: str, value: object, length: int | Sequence[int], *, lo: int | None = None,
               hi: int | None = None, code: str = E_RANGE) -> tuple[int, ...]:
    """Return ``value`` as a tuple of ints of an allowed length, each within ``[lo, hi]``."""
    lengths = (length,) if isinstance(length, int) else tuple(length)
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        if hasattr(value, "shape") and hasattr(value, "tolist"):  # a numpy array of sizes
            value = value.tolist()
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            # a numpy scalar / 0-d array's tolist() is a bare number, not a sequence
            raise fail(E_TYPE, param, value,
                       f"must be a list or tuple of {_alts(lengths)} integers")
    if len(value) not in lengths:
        raise fail(E_SHAPE, param, value,
                   f"must have {_alts(lengths)} elements, got {len(value)}")
    return tuple(check_int(f"{param}[{i}]", v, lo=lo, hi=hi, code=code)
                 for i, v in enumerate(value))


def _alts(lengths: Sequence[int]) -> str:
    return " or ".join(str(n) for n in lengths)


SUPPORTED_FLOATS = ("float16", "float32", "bfloat16")


def check_dtype(param: str, dtype: object, allowed: Sequence[str]) -> str:
    """Return the dtype string if it is one of ``allowed``."""
    if not isinstance(dtype, str) or dtype not in allowed:
        raise fail(E_DTYPE, param, dtype, f"must be one of {', '.join(allowed)}")
    return dtype


# The most elements a tensor may have: kernels index in 64 bits once a tensor reaches 2**31
# elements (dsl.runtime.schedule.INT64_INDEX_FROM), so only int64 index arithmetic bounds it.
MAX_ELEMS = 2**63 - 1


def check_shape(param: str, shape: object, rank: int | Sequence[int], *, lo: int = 1,
                max_elems: int = MAX_ELEMS) -> tuple[int, ...]:
    """Return a tensor shape as ints, checking rank, positivity and int64-indexable size."""
    dims = check_ints(param, shape, rank, lo=lo, code=E_SHAPE)
    total = math.prod(dims)
    if total > max_elems:
        raise fail(E_SHAPE, param, dims,
                   f"has {total} elements; at most {max_elems} fit the kernels' int64 indexing")
    return dims


def check_elems(param: str, value: object, shape: Sequence[int], what: str, *,
                max_elems: int = MAX_ELEMS) -> None:
    """Refuse a derived tensor (a 5HD result, a padded stage) too big for int64 indexing.

    The arguments can each fit while a tensor made from them does not (5HD pads C to 16, a
    padded stage adds rows); the index arithmetic would then wrap silently.
    """
    total = math.prod(int(d) for d in shape)
    if total > max_elems:
        raise fail(E_SHAPE, param, value,
                   f"makes {what} {tuple(int(d) for d in shape)} of {total} elements; at most "
                   f"{max_elems} fit the kernels' int64 indexing")


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def te_shape(param: str, t: object, rank: int | Sequence[int] | None = None) -> tuple[int, ...]:
    """The static shape of a TE tensor argument (``te.placeholder``) as ints.

    With ``rank``, also checks the rank, positivity and int64-indexable size (as
    :func:`check_shape`); without, the caller checks the dimensions itself (some operators
    accept empty tensors).
    """
    from tvm import te

    if not isinstance(t, te.Tensor):
        raise fail(E_TYPE, param, type(t).__name__, "must be a tvm.te.Tensor (te.placeholder)")
    try:
        dims = [int(d) for d in t.shape]
    except TypeError:
        raise fail(E_SHAPE, f"{param}.shape", list(t.shape),
                   "must be static: symbolic shapes are not supported") from None
    if any(str(getattr(d, "ty", "")) == "bool" for d in t.shape):  # int(True) passes; LLVM fails
        raise fail(E_TYPE, f"{param}.shape", list(t.shape), "must be integers, not bools")
    return tuple(dims) if rank is None else check_shape(f"{param}.shape", dims, rank)


def check_ndarray(param: str, a: object):
    """A plain ``numpy.ndarray`` argument of a numpy-level API (masked arrays refused: a
    kernel would silently compute on the values under the mask)."""
    import numpy as np

    if isinstance(a, np.ma.MaskedArray):
        raise fail(E_TYPE, param, "numpy.ma.MaskedArray",
                   "must be a plain numpy.ndarray: the kernel cannot honour a mask; pass "
                   "a.filled(value) to choose what masked elements mean")
    if not isinstance(a, np.ndarray):
        raise fail(E_TYPE, param, type(a).__name__, "must be a numpy.ndarray")
    return a
