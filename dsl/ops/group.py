"""Grouped convolution on the cube layouts: ``group_dict`` and the group-extended FracZ map.

The cube multiplies 16x16 blocks, so a grouped convolution whose per-group channel counts are
not multiples of 16 would waste most of each block. TBE packs ``multiple_extend`` (E) original
groups into one *extended* group whose channels fill whole blocks, and there are ``g_extend``
(G) extended groups. For original group ``g`` (``ge, e = divmod(g, E)``), its input channel
``ci`` and output channel ``co`` sit at extended positions ``e*Cin_g + ci`` and
``e*Cout_g + co`` of extended group ``ge``.

Everything that indexes the group FracZ layout (numpy packers, TE layout kernels, dx, dw) goes
through :class:`GroupLayout`, so the map is written once.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from dsl.errors import E_CHANNEL, E_GROUPS, E_SHAPE, E_TYPE, ceil_div, check_int, check_ints, fail

C0 = 16  # channels per 5HD block and per FracZ fractal side, for float16 and float32 alike

# Filter formats calculate_group understands, as the permutation that brings them to NCHW.
_TO_NCHW = {"NCHW": (0, 1, 2, 3), "NHWC": (0, 3, 1, 2), "HWCN": (3, 2, 0, 1)}
_CUBE_K = {"float16": 16, "float32": 16, "bfloat16": 16, "int8": 32}
C0_INT8 = 32  # TBE's CUBE_MKN["int8"] k0: int8 5HD blocks and the int8 FracZ reduction side

GROUP_DICT_KEYS = ("g_extend", "multiple_extend", "groups", "dx_c1_extend", "dy_c1_extend",
                   "dx_c_ori", "dy_c_ori", "filter_batch_ori", "filter_c_ori")


def _lcm(a: int, b: int) -> int:
    return a * b // math.gcd(a, b)


def calculate_group(out_backprop_nchw, input_size_nchw, w_shape_nchw, groups,
                    filter_dtype="float16", filter_ori_format="NCHW", *,
                    names: dict | None = None) -> dict:
    """The ``group_dict`` of seed 001 for a grouped ``conv2d_backprop_input``.

    Parameters
    ----------
    out_backprop_nchw : sequence of 4 int
        dy shape ``(N, Cout, Ho, Wo)``.
    input_size_nchw : sequence of 4 int
        dx shape ``(N, Cin, H, W)``.
    w_shape_nchw : sequence of 4 int
        Forward weight shape in ``filter_ori_format`` (``(Cout, Cin/groups, KH, KW)`` for NCHW).
    groups : int
    filter_dtype : str
        Selects ``c0_size_k`` (16 for float16, bfloat16 and float32; 32 for int8).
    filter_ori_format : {"NCHW", "NHWC", "HWCN"}
    names : dict, optional
        What errors call the three shapes, keyed by this function's parameter names: an
        operator that derives them from its own arguments passes those (``{"input_size_nchw":
        "input_sizes", ...}``) so the message names what its caller wrote.

    Returns
    -------
    dict
        ``g_extend = ceil(groups / multiple_extend)``, ``multiple_extend``, ``groups``,
        ``dx_c1_extend``, ``dy_c1_extend``, ``dx_c_ori``, ``dy_c_ori``, ``filter_batch_ori``,
        ``filter_c_ori``, ``filter_ori_format``.
    """
    # isinstance first: an unhashable value (a list) would make ``in`` raise TypeError
    if not isinstance(filter_ori_format, str) or filter_ori_format not in _TO_NCHW:
        raise fail(E_SHAPE, "filter_ori_format", filter_ori_format,
                   f"must be one of {', '.join(_TO_NCHW)}")
    if not isinstance(filter_dtype, str) or filter_dtype not in _CUBE_K:
        raise fail(E_TYPE, "filter_dtype", filter_dtype, f"must be one of {', '.join(_CUBE_K)}")
    n = {"out_backprop_nchw": "out_backprop_nchw", "input_size_nchw": "input_size_nchw",
         "w_shape_nchw": "w_shape_nchw", **(names or {})}
    dy = check_ints(n["out_backprop_nchw"], out_backprop_nchw, 4, lo=1, code=E_SHAPE)
    dx = check_ints(n["input_size_nchw"], input_size_nchw, 4, lo=1, code=E_SHAPE)
    w_raw = check_ints(n["w_shape_nchw"], w_shape_nchw, 4, lo=1, code=E_SHAPE)
    w = tuple(w_raw[i] for i in _TO_NCHW[filter_ori_format])
    groups = check_int("groups", groups, lo=1, code=E_GROUPS)
    if dy[1] != w[0]:
        raise fail(E_CHANNEL, f"{n['out_backprop_nchw']}[1]", dy[1],
                   f"must equal the filter's output channels ({n['w_shape_nchw']}: {w[0]})")
    if dx[1] != w[1] * groups:
        raise fail(E_CHANNEL, f"{n['input_size_nchw']}[1]", dx[1],
                   f"must equal the filter's input channels per group ({n['w_shape_nchw']}: "
                   f"{w[1]}) * groups ({groups}) = {w[1] * groups}")
    if w[0] % groups:
        raise fail(E_GROUPS, "groups", groups,
                   f"must divide the filter's output channels ({n['w_shape_nchw']}: {w[0]})")
    c0_size, c0_size_k = C0, _CUBE_K[filter_dtype]
    dx_c_ori = w[1]
    dy_c_ori = w[0] // groups
    dx_c_extend = _lcm(dx_c_ori, c0_size) // dx_c_ori
    dy_c_extend = _lcm(dy_c_ori, c0_size_k) // dy_c_ori
    multiple_extend = min(_lcm(dx_c_extend, dy_c_extend), groups)
    return {
        "g_extend": ceil_div(groups, multiple_extend),
        "multiple_extend": multiple_extend,
        "groups": groups,
        "dx_c1_extend": ceil_div(multiple_extend * dx_c_ori, c0_size),
        "dy_c1_extend": ceil_div(multiple_extend * dy_c_ori, c0_size_k),
        "dx_c_ori": dx_c_ori,
        "dy_c_ori": dy_c_ori,
        "filter_batch_ori": w[0] // groups,
        "filter_c_ori": w[1],
        "filter_ori_format": filter_ori_format,
    }


def check_group_dict(given: object, expected: dict, param: str = "para_dict['group_dict']"):
    """Refuse a user ``group_dict`` that disagrees with the one the shapes imply."""
    if not isinstance(given, dict):
        raise fail(E_GROUPS, param, given, "must be a dict as returned by calculate_group")
    for key in GROUP_DICT_KEYS:
        if key not in given:
            raise fail(E_GROUPS, f"{param}['{key}']", None,
                       "is missing; build the dict with dsl.calculate_group(...)")
        value = given[key]
        # only true ints compare safely: a numpy array's ``!=`` has no truth value
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) \
                or value != expected[key]:
            raise fail(E_GROUPS, f"{param}['{key}']", value,
                       f"must be {expected[key]} for these filter_sizes / input_sizes / groups "
                       "(see dsl.calculate_group)")
    fmt = given.get("filter_ori_format", "NCHW")
    if not isinstance(fmt, str) or fmt != "NCHW":
        raise fail(E_GROUPS, f"{param}['filter_ori_format']", fmt,
                   "must be 'NCHW': filter_sizes are given in NCHW")


@dataclass(frozen=True)
class GroupLayout:
    """The group FracZ index map of one weight ``W[Cout, Cin/groups, KH, KW]``.

    Group FracZ (FRACTAL_Z_G) is a 6-D array ``[G, dx_c1e, KH, KW, dy_c1e*16, 16]`` reshaped to
    4-D ``(G*dx_c1e*KH*KW, dy_c1e, 16, 16)``; see the module docstring for the channel map.
    With ``groups == 1`` it is the plain FracZ ``(C1*KH*KW, ceil(Cout/16), 16, 16)``.

    All index methods use only ``+ - * // %`` so they work on ints, numpy arrays and TE
    expressions alike.
    """

    groups: int
    cin_g: int
    cout_g: int
    kh: int
    kw: int
    multiple_extend: int
    g_extend: int
    dx_c1e: int
    dy_c1e: int

    FILTER_DTYPE = "float16"  # the group_dict rule this layout follows (c0_size_k of 16)

    @classmethod
    def from_weight(cls, w_shape_nchw, groups: int) -> GroupLayout:
        # checked here so errors name the caller's weight / groups, not the derived shapes
        cout, cin_g, kh, kw = check_ints("w_shape_nchw", w_shape_nchw, 4, lo=1, code=E_SHAPE)
        groups = check_int("groups", groups, lo=1, code=E_GROUPS)
        gd = calculate_group((1, cout, 1, 1), (1, cin_g * groups, 1, 1), w_shape_nchw, groups,
                             filter_dtype=cls.FILTER_DTYPE)
        return cls(groups, cin_g, cout // groups, kh, kw, gd["multiple_extend"],
                   gd["g_extend"], gd["dx_c1_extend"], gd["dy_c1_extend"])

    @property
    def cin(self) -> int:
        return self.cin_g * self.groups

    @property
    def cout(self) -> int:
        return self.cout_g * self.groups

    @property
    def fracz_shape(self) -> tuple[int, int, int, int]:
        return (self.g_extend * self.dx_c1e * self.kh * self.kw, self.dy_c1e, C0, C0)

    @property
    def dense(self) -> bool:
        """True when no extended group mixes original groups (``groups == 1``)."""
        return self.groups == 1

    def dot_depth(self, dtype: str, cin_lanes: bool) -> int:
        """Reduction elements one lane sums per step of the current target's dot-product
        instruction (:meth:`targets.CpuTarget.dot_depth`: 4 for int8 with AVX-512 VNNI, 2
        for bfloat16 with AVX512-BF16) when the cube operators lay this weight out for it:
        a dense layer with Cin in the vector lanes (``cin_lanes``); else 1 (multiply-adds).
        Every target computes the layouts this picks correctly; only one with the
        instruction runs them at its rate."""
        import targets

        if not cin_lanes or not self.dense:
            return 1
        return targets.current().dot_depth(dtype)

    # --- forward map: weight element -> FracZ index -----------------------------------------
    def group_of_input_channel(self, c):
        """``(g, ci)`` of dx/x channel ``c``."""
        if self.groups == 1:
            return 0, c
        return c // self.cin_g, c % self.cin_g

    def fracz_row_lane(self, g, ci, kh, kw):
        """FracZ row and Cin lane of input channel ``ci`` of group ``g`` at tap ``(kh, kw)``."""
        if self.groups == 1:
            return (ci // C0) * (self.kh * self.kw) + kh * self.kw + kw, ci % C0
        ge, e = g // self.multiple_extend, g % self.multiple_extend
        cin_ext = e * self.cin_g + ci
        row = (ge * self.dx_c1e + cin_ext // C0) * (self.kh * self.kw) + kh * self.kw + kw
        return row, cin_ext % C0

    def fracz_col(self, g, co):
        """FracZ (axis-1, axis-2) position of output channel ``co`` of group ``g``."""
        cout_ext = co if self.groups == 1 else (g % self.multiple_extend) * self.cout_g + co
        return cout_ext // C0, cout_ext % C0

    def fracz_index(self, co_orig, ci, kh, kw):
        """4-D FracZ index of ``W[co_orig, ci, kh, kw]``."""
        g, co = (0, co_orig) if self.groups == 1 else (co_orig // self.cout_g,
                                                       co_orig % self.cout_g)
        row, lane = self.fracz_row_lane(g, ci, kh, kw)
        col1, col0 = self.fracz_col(g, co)
        return row, col1, col0, lane

    # --- inverse map: FracZ index -> weight element ------------------------------------------
    def weight_of_fracz(self, row, col1, col0, lane):
        """``(co_orig, ci, kh, kw, valid)`` for a FracZ index; ``valid`` is a list of conditions
        (empty when always valid) that the caller combines with its own ``and``."""
        khw = self.kh * self.kw
        k = row % khw
        kh, kw = k // self.kw, k % self.kw
        blk = row // khw
        ge, c1 = blk // self.dx_c1e, blk % self.dx_c1e
        cin_ext, cout_ext = c1 * C0 + lane, col1 * C0 + col0
        if self.groups == 1:
            conds = []
            if self.cin % C0:
                conds.append(("lt", cin_ext, self.cin))
            if self.cout % C0:
                conds.append(("lt", cout_ext, self.cout))
            return cout_ext, cin_ext, kh, kw, conds
        e_in, ci = cin_ext // self.cin_g, cin_ext % self.cin_g
        e_out, co = cout_ext // self.cout_g, cout_ext % self.cout_g
        g = ge * self.multiple_extend + e_in
        conds = [("eq", e_in, e_out), ("lt", e_in, self.multiple_extend), ("lt", g, self.groups)]
        return g * self.cout_g + co, ci, kh, kw, conds


@dataclass(frozen=True)
class Int8DxLayout(GroupLayout):
    """TBE's int8 dx FracZ of ``W[Cout, Cin/groups, KH, KW]`` (CUBE_MKN int8, k0 = 32).

    Shape ``(G*dy_c1e*KH*KW, dx_c1e, 16, 32)`` from :func:`calculate_group` with
    ``filter_dtype="int8"`` (``c0_size_k = 32``): the dx GEMM reduces over Cout, so blocks of
    32 (extended) Cout channels are the rows and the innermost axis, Cin blocks of 16 the
    columns. With ``ge, e = divmod(g, E)``, ``cout_ext = e*Cout_g + co`` and
    ``cin_ext = e*Cin_g + ci``::

        FracZ[(ge*dy_c1e + cout_ext//32)*KH*KW + kh*KW + kw, cin_ext//16, cin_ext%16,
              cout_ext%32] = W[g*Cout_g + co, ci, kh, kw]

    Index arithmetic uses only ``+ * // %`` (ints, numpy arrays and TE expressions alike).
    """

    FILTER_DTYPE = "int8"  # group_dict with c0_size_k = 32

    @property
    def fracz_shape(self) -> tuple[int, int, int, int]:
        return (self.g_extend * self.dy_c1e * self.kh * self.kw, self.dx_c1e, C0, C0_INT8)

    def fracz_index(self, co_orig, ci, kh, kw):
        """4-D int8 FracZ index of ``W[co_orig, ci, kh, kw]``."""
        g, co = co_orig // self.cout_g, co_orig % self.cout_g
        ge, e = g // self.multiple_extend, g % self.multiple_extend
        cout_ext, cin_ext = e * self.cout_g + co, e * self.cin_g + ci
        row = (ge * self.dy_c1e + cout_ext // C0_INT8) * (self.kh * self.kw) + kh * self.kw + kw
        return row, cin_ext // C0, cin_ext % C0, cout_ext % C0_INT8
