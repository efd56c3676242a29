"""The cube layouts, as numpy host packers and as TE computes that build into kernels.

5HD / NC1HWC0
    ``(N, ceil(C/16), H, W, 16)``; channel ``c`` at ``[n, c // 16, h, w, c % 16]``, pad channels
    zero. The 2-D spatial case generalises to any number of spatial axes (``NC1DHWC0``...).
FracZ / group FracZ
    See :class:`dsl.group.GroupLayout`: ``(G*dx_c1e*KH*KW, dy_c1e, 16, 16)``, axes 1-2 Cout,
    axis 3 Cin; ``groups == 1`` gives plain FracZ ``(C1*KH*KW, ceil(Cout/16), 16, 16)``.
int8 (TBE's CUBE_MKN int8, k0 = 32)
    The numpy packers pick these for int8 arrays: 5HD with C0 = 32, and the int8 dx FracZ
    ``(G*dy_c1e*KH*KW, dx_c1e, 16, 32)`` of :class:`dsl.ops.group.Int8DxLayout`.

The numpy functions are for hosts feeding kernels; the ``*_compute`` functions return TE tensors
(tags ``layout.*``) so a user can build a transdata kernel with ``auto_schedule`` / ``build``.
"""

from __future__ import annotations

import numpy as np

from dsl.errors import (
    E_SHAPE,
    E_TYPE,
    ceil_div,
    check_elems,
    check_int,
    check_shape,
    fail,
    te_shape,
)
from dsl.ops.group import C0, C0_INT8, GroupLayout, Int8DxLayout
from dsl.ops.tag import LAYOUT_FROM_5HD, LAYOUT_FROM_FRACZ, LAYOUT_TO_5HD, LAYOUT_TO_FRACZ

FORMAT_5HD = "NC1HWC0"
FORMAT_FRACZ = "FRACTAL_Z"
FORMAT_FRACZ_G = "FRACTAL_Z_G"


def _as_array(param: str, a: object, rank: int) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise fail(E_TYPE, param, type(a).__name__, "must be a numpy.ndarray")
    if a.ndim != rank:
        raise fail(E_SHAPE, f"{param}.shape", a.shape, f"must have rank {rank}")
    return a




# --- numpy host packers ----------------------------------------------------------------------

def block_c0(dtype) -> int:
    """5HD C0 of a numpy dtype: 32 for int8 (TBE's CUBE_MKN int8 k0), else 16."""
    return C0_INT8 if np.dtype(dtype) == np.int8 else C0


def nchw_to_5hd(x: np.ndarray) -> np.ndarray:
    """``(N, C, *spatial)`` -> ``(N, ceil(C/C0), *spatial, C0)``, pad channels zero;
    C0 = 16, or 32 for int8 arrays."""
    if not isinstance(x, np.ndarray) or x.ndim < 3:
        raise fail(E_SHAPE, "x", getattr(x, "shape", x), "must be an ndarray (N, C, *spatial)")
    if 0 in x.shape:  # C == 0 would give a 5HD with no C1 blocks, which no kernel takes
        raise fail(E_SHAPE, "x.shape", x.shape, "must have no zero dimension")
    n, c, *sp = x.shape
    c0 = block_c0(x.dtype)
    c1 = ceil_div(c, c0)
    out = np.zeros((n, c1 * c0, *sp), dtype=x.dtype)
    out[:, :c] = x
    out = out.reshape(n, c1, c0, *sp)
    return np.ascontiguousarray(np.moveaxis(out, 2, -1))


def nc1hwc0_to_nchw(x5: np.ndarray, channels: int) -> np.ndarray:
    """Inverse of :func:`nchw_to_5hd`: ``(N, C1, *spatial, C0)`` -> ``(N, channels, *spatial)``
    (C0 = 32 for int8 arrays, else 16)."""
    c0 = block_c0(x5.dtype) if isinstance(x5, np.ndarray) else C0
    if not isinstance(x5, np.ndarray) or x5.ndim < 4 or x5.shape[-1] != c0:
        raise fail(E_SHAPE, "x5", getattr(x5, "shape", x5),
                   f"must be an ndarray (N, C1, *spatial, {c0})")
    channels = check_int("channels", channels, lo=1, hi=x5.shape[1] * c0, code=E_SHAPE)
    n, c1, *sp, _ = x5.shape
    full = np.moveaxis(x5, -1, 2).reshape(n, c1 * c0, *sp)
    return np.ascontiguousarray(full[:, :channels])


def weight_to_fracz(w: np.ndarray, groups: int = 1) -> np.ndarray:
    """Forward weight ``W[Cout, Cin/groups, KH, KW]`` -> group FracZ (plain FracZ for groups=1);
    int8 weights go to TBE's int8 dx FracZ (:class:`dsl.ops.group.Int8DxLayout`)."""
    w = _as_array("w", w, 4)
    lay = _weight_layout(w.dtype, w.shape, groups)
    out = np.zeros(lay.fracz_shape, dtype=w.dtype)
    co, ci, kh, kw = np.meshgrid(*(np.arange(s) for s in w.shape), indexing="ij")
    out[lay.fracz_index(co, ci, kh, kw)] = w
    return out


def fracz_to_weight(fz: np.ndarray, w_shape_nchw, groups: int = 1) -> np.ndarray:
    """Inverse of :func:`weight_to_fracz`: gather ``W[Cout, Cin/groups, KH, KW]`` back (from
    the int8 dx FracZ for int8 arrays)."""
    fz = _as_array("fz", fz, 4)
    w_shape = check_shape("w_shape_nchw", w_shape_nchw, 4)
    lay = _weight_layout(fz.dtype, w_shape, groups)
    if fz.shape != lay.fracz_shape:
        raise fail(E_SHAPE, "fz.shape", fz.shape,
                   f"must be {lay.fracz_shape} for weight {w_shape} with groups={groups}")
    co, ci, kh, kw = np.meshgrid(*(np.arange(s) for s in w_shape), indexing="ij")
    return fz[lay.fracz_index(co, ci, kh, kw)]


def _weight_layout(dtype, w_shape, groups: int):
    if np.dtype(dtype) == np.int8:
        return Int8DxLayout.from_weight(w_shape, groups)
    return GroupLayout.from_weight(w_shape, groups)


# --- TE computes (build into transdata kernels) ----------------------------------------------

def te_all(conds):
    """Combine GroupLayout conditions into one TE boolean (None when always true)."""
    import tvm

    exprs = [(a < b) if op == "lt" else (a == b) for op, a, b in conds]
    return tvm.tirx.all(*exprs) if exprs else None


def nchw_to_5hd_compute(x, name: str = "to_5hd"):
    """TE: ``x (N, C, *spatial)`` -> ``(N, ceil(C/16), *spatial, 16)``; tag ``layout.to_5hd``."""
    from tvm import te

    n, c, *sp = te_shape("x", x, range(3, 9))
    c1 = ceil_div(c, C0)
    check_elems("x.shape", (n, c, *sp), (n, c1, *sp, C0), "the 5HD result")

    def body(i, j, *rest):
        *sidx, k = rest
        ch = j * C0 + k
        val = x[(i, te.min(ch, c - 1), *sidx)]
        return val if c % C0 == 0 else te.if_then_else(ch < c, val, te.const(0, x.dtype))

    return te.compute((n, c1, *sp, C0), body, name=name, tag=LAYOUT_TO_5HD,
                      attrs={"format": FORMAT_5HD})


def nc1hwc0_to_nchw_compute(x5, channels: int, name: str = "from_5hd"):
    """TE: ``(N, C1, *spatial, 16)`` -> ``(N, channels, *spatial)``; tag ``layout.from_5hd``."""
    from tvm import te

    n, c1, *sp, c0 = te_shape("x5", x5, range(4, 10))
    if c0 != C0:
        raise fail(E_SHAPE, "x5.shape", (n, c1, *sp, c0), f"must end in C0={C0}")
    # more channels than C1*16 would read past x5
    channels = check_int("channels", channels, lo=1, hi=c1 * C0, code=E_SHAPE)
    return te.compute((n, channels, *sp),
                      lambda i, ch, *s: x5[(i, ch // C0, *s, ch % C0)],
                      name=name, tag=LAYOUT_FROM_5HD, attrs={"format": "NCHW"})


def weight_to_fracz_compute(w, groups: int = 1, name: str = "to_fracz"):
    """TE: ``W[Cout, Cin/groups, KH, KW]`` -> group FracZ; tag ``layout.to_fracz``."""
    from tvm import te

    w_shape = te_shape("w", w, 4)
    lay = GroupLayout.from_weight(w_shape, groups)
    check_elems("w.shape", w_shape, lay.fracz_shape, "the group FracZ result")

    def body(row, col1, col0, lane):
        co, ci, kh, kw, conds = lay.weight_of_fracz(row, col1, col0, lane)
        if groups == 1:  # clamp so a pad position never indexes past W
            co, ci = te.min(co, lay.cout - 1), te.min(ci, lay.cin_g - 1)
        else:
            co = te.min(co, lay.cout - 1)
        ok = te_all(conds)
        val = w[co, ci, kh, kw]
        return val if ok is None else te.if_then_else(ok, val, te.const(0, w.dtype))

    fmt = FORMAT_FRACZ if groups == 1 else FORMAT_FRACZ_G
    return te.compute(lay.fracz_shape, body, name=name, tag=LAYOUT_TO_FRACZ,
                      attrs={"format": fmt, "groups": groups})


def fracz_to_weight_compute(fz, w_shape_nchw, groups: int = 1, name: str = "from_fracz"):
    """TE: group FracZ -> ``W[Cout, Cin/groups, KH, KW]``; tag ``layout.from_fracz``."""
    from tvm import te

    w_shape = check_shape("w_shape_nchw", w_shape_nchw, 4)
    lay = GroupLayout.from_weight(w_shape, groups)
    if te_shape("fz", fz, 4) != lay.fracz_shape:
        raise fail(E_SHAPE, "fz.shape", tuple(int(d) for d in fz.shape),
                   f"must be {lay.fracz_shape} for weight {w_shape} with groups={groups}")
    return te.compute(w_shape, lambda co, ci, kh, kw: fz[lay.fracz_index(co, ci, kh, kw)],
                      name=name, tag=LAYOUT_FROM_FRACZ, attrs={"format": "NCHW"})


def pad_cast_5hd_compute(x, before, sizes, dtype, *, name: str, tag: str):
    """TE: zero-pad the spatial axes of a 5HD tensor and cast it to ``dtype``.

    ``before[i]`` zero rows go before spatial axis ``i`` and the result has ``sizes[i]`` rows;
    kernels that gather taps from it then need no bounds checks in their inner loops.
    """
    import tvm
    from tvm import te

    n, c1, *sp, c0 = (int(d) for d in x.shape)

    def body(i, j, *rest):
        *s, k = rest
        src = [p - b for p, b in zip(s, before)]
        conds = [c for p, b, extent in zip(src, before, sp)
                 for c in ((p >= 0,) if b else ()) + ((p < extent,))]
        val = x[(i, j, *src, k)].astype(dtype)
        if not conds:
            return val
        return te.if_then_else(tvm.tirx.all(*conds), val, tvm.tirx.const(0, dtype))

    return te.compute((n, c1, *sizes, c0), body, name=name, tag=tag)
