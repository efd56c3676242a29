"""Every tag a compute in :mod:`dsl.ops` carries: one place, imported by computes and schedules.

A stage's tag says what it *is*; schedule rules find their stages by tag (never by a stage's
``name``, which a user may change). Operator tags are the op name; a stage inside an operator
is ``"<op>.<stage>"``. Pattern tags (``elemwise``, ``broadcast``, ``reduce``) mark the generic
graph shapes the pattern rules recognise, as TVM's ``topi/tag.py`` and TBE's pattern
classification do.
"""

from __future__ import annotations

import json

# Operators (the anchor stage of each carries the bare op tag).
CONV2D_BACKPROP_INPUT = "conv2d_backprop_input"
CONV2D_BACKPROP_FILTER = "conv2d_backprop_filter"
CONVOLUTION_BACKWARD = "convolution_backward"
AVG_POOL2D_BACKWARD = "avg_pool2d_backward"
DECONV_GRAD_FILTER = "deconv_grad_filter"

# Layout (transdata) kernels.
LAYOUT_TO_5HD = "layout.to_5hd"
LAYOUT_FROM_5HD = "layout.from_5hd"
LAYOUT_TO_FRACZ = "layout.to_fracz"
LAYOUT_FROM_FRACZ = "layout.from_fracz"
LAYOUT_PREFIX = "layout."

# Stages inside the operators (``stage(op, name)``); rules find their blocks by these.
DX_DY_CAST = "conv2d_backprop_input.dy_cast"
DX_DY_PAD = "conv2d_backprop_input.dy_pad"
DX_WEIGHT = "conv2d_backprop_input.weight"
DX_ACC = "conv2d_backprop_input.acc"  # one per stride phase
DX_NONFINITE = "conv2d_backprop_input.nonfinite"  # the weight scan (dsl.ops.fallback)
DX_EXACT = "conv2d_backprop_input.exact"  # per phase, padding never multiplied in
DX_WSUM = "conv2d_backprop_input.wsum"  # int8: weight sums per dx channel
DW_X_PAD = "conv2d_backprop_filter.x_pad"
DW_DY_CAST = "conv2d_backprop_filter.dy_cast"
DW_DY_GROUP = "conv2d_backprop_filter.dy_group"
DW_ACC = "conv2d_backprop_filter.acc"
DW_X_PAIR = "conv2d_backprop_filter.x_pair"  # bf16 x columns paired for vdpbf16ps
DW_DY_PAIR = "conv2d_backprop_filter.dy_pair"  # bf16 dy Wo pairs, one 32-bit broadcast
DW_NONFINITE = "conv2d_backprop_filter.nonfinite"  # the scan of x and dy (dsl.ops.fallback)
DW_EXACT = "conv2d_backprop_filter.exact"  # x's padding never multiplied in
CB_Y_PACK = "convolution_backward.y_pack"
CB_X_PACK = "convolution_backward.x_pack"
CB_Y_REP = "convolution_backward.y_rep"  # grouped, few channels per group
CB_X_REP = "convolution_backward.x_rep"
CB_W_ADJ = "convolution_backward.w_adj"
CB_W_FWD = "convolution_backward.w_fwd"
CB_DX_ACC = "convolution_backward.dx_acc"
CB_FWD_ACC = "convolution_backward.fwd_acc"
CB_DW_ACC = "convolution_backward.dw_acc"
CB_DB_ACC = "convolution_backward.db_acc"
CB_NC_Y_PAD = "convolution_backward.nc_y_pad"  # exact depthwise: NC* layout throughout
CB_NC_W_PAD = "convolution_backward.nc_w_pad"
CB_NC_X_PAD = "convolution_backward.nc_x_pad"
CB_NC_DX_ACC = "convolution_backward.nc_dx_acc"
CB_NC_DW_ACC = "convolution_backward.nc_dw_acc"
CB_NC_DY_ROWS = "convolution_backward.nc_dy_rows"  # ... dy rows padded to whole dw lanes
CB_NC_DW_LANES = "convolution_backward.nc_dw_lanes"  # ... and dw's partial sums per lane
# A pad stage's attribute: [lo, hi), the innermost columns that hold real data in every row
# (where its zero test does not show them: a stride-phase pad reads x[q * s + f - pad])
ROW_INTERIOR = "dsl_row_interior"
CB_NONFINITE = "convolution_backward.nonfinite"  # the scans (dsl.ops.fallback)
CB_EXACT = "convolution_backward.exact"  # the twins of the accs that multiply zeros in
CB_GRAD_INPUT = "convolution_backward.grad_input"  # the outputs carry stage tags
CB_GRAD_WEIGHT = "convolution_backward.grad_weight"
CB_GRAD_BIAS = "convolution_backward.grad_bias"
POOL_SCALE = "avg_pool2d_backward.scale"
POOL_ACC = "avg_pool2d_backward.acc"
DECONV_DY_PAD = "deconv_grad_filter.dy_pad"
DECONV_ACC = "deconv_grad_filter.acc"
DECONV_NONFINITE = "deconv_grad_filter.nonfinite"  # the scan of x (dsl.ops.fallback)
DECONV_EXACT = "deconv_grad_filter.exact"  # acc with dy's padding never multiplied in
# Block annotation of a fallback stage: the name of the flag stage whose one element must be
# non-zero for the stage to run (see dsl.runtime.run_if).
RUN_IF = "dsl_run_if"
# Block annotation of a stage whose values its exact twin (named) replaces when that twin ran.
EXACT_TWIN = "dsl_exact_twin"
# Block annotation of a stage whose C0 lanes come in runs of this many equal values (a grouped
# dx's regathered dy: the lanes of one group read one dy channel).
LANE_RUN = "dsl_lane_run"
# Block annotation of a stage whose lanes (the last axis) come in runs of this many read
# contiguously from one block of the source (dx's dy re-blocked into 64-byte AMX tile rows
# from 5HD blocks of 16 or 32 channels): each run is one vector load.
SOURCE_RUN = "dsl_source_run"

LAYOUT_TAGS = (LAYOUT_TO_5HD, LAYOUT_FROM_5HD, LAYOUT_TO_FRACZ, LAYOUT_FROM_FRACZ)

# Generic patterns (vector DSL and user stages).
ELEMWISE = "elemwise"
BROADCAST = "broadcast"
INJECTIVE = "injective"
REDUCE = "reduce"
PATTERNS = frozenset({ELEMWISE, BROADCAST, INJECTIVE, REDUCE})


def stage(op: str, name: str) -> str:
    """The tag of stage ``name`` inside operator ``op`` (``"conv2d_backprop_input.acc"``)."""
    return f"{op}.{name}"


PATTERNS = (ELEMWISE, BROADCAST, INJECTIVE, REDUCE)


def pattern_of(tag: str) -> str | None:
    """The generic pattern a stage tag names (``"elemwise.vadd"`` -> ``"elemwise"``, the vector
    DSL's ``"<pattern>.<op>"`` tags), or None for an operator's or layout stage."""
    head = op_of(tag)
    return head if head in PATTERNS else None


def op_of(tag: str) -> str:
    """The operator a stage tag belongs to (``"conv2d_backprop_input.acc"`` -> the op)."""
    return tag.split(".", 1)[0]


def kernel_attrs(op: str, params: dict, formats: dict, **extra) -> dict:
    """The attributes an operator's anchor stage carries into the kernel's JSON (read back by
    ``dsl.runtime.schedule`` and by rules): ``dsl_op`` the op tag, ``dsl_params`` the checked
    call as sorted JSON, ``dsl_formats`` each tensor's layout by name, then ``extra`` as given
    (facts a schedule rule reads directly, e.g. ``w_phases``)."""
    return {"dsl_op": op, "dsl_params": json.dumps(params, sort_keys=True),
            "dsl_formats": json.dumps(formats, sort_keys=True), **extra}


# Side stages: computes that belong to a kernel although no output reads them (a fallback and
# its flag, see dsl.runtime.run_if). Keyed by the anchor op; Schedule.prim_func adds them.
_SIDE_STAGES: dict = {}


def with_side_stages(out, stages: list):
    """Record ``stages`` (te.Tensor) as side stages of ``out``'s op; returns ``out``."""
    _SIDE_STAGES[out.op] = tuple(stages)
    return out


def side_stages(op) -> tuple:
    """The side stages recorded for ``op`` (empty when none)."""
    return _SIDE_STAGES.get(op, ())
