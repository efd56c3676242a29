"""``auto_schedule``: pick the registered schedule rule for a compute on the current target."""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass

import targets
from dsl.errors import E_VALUE, fail
from dsl.ops import tag
from dsl.runtime.target import get as target_get

# A tensor of this many elements or more is indexed in 64 bits: TVM's default int32 index
# arithmetic would wrap past 2**31 - 1 silently. Smaller kernels keep int32 (narrower address
# arithmetic, the schedules' tuned shape). Tests lower it to run int64 indexing on small shapes.
INT64_INDEX_FROM = 2**31


def _as_list(res) -> list:
    from tvm import te

    outs = list(res) if isinstance(res, (list, tuple)) else [res]
    if not outs or not all(isinstance(t, te.Tensor) for t in outs):
        raise fail(E_VALUE, "res", res, "must be a te.Tensor or a list of te.Tensor")
    return outs


def same_tensor(a, b) -> bool:
    """True if two te.Tensor handles name the same tensor (handles are not unique objects)."""
    return a.op.same_as(b.op) and a.value_index == b.value_index


def walk(outputs) -> tuple[list, list]:
    """``(placeholders, computes)`` reachable from ``outputs``, placeholders in first-use
    order (the default argument order), computes producers-first."""
    from tvm import te

    seen, placeholders, computes = set(), [], []

    def visit(op):
        if op in seen:
            return
        seen.add(op)
        if isinstance(op, te.PlaceholderOp):
            placeholders.append(op.output(0))
            return
        for t in op.input_tensors:
            visit(t.op)
        computes.append(op)

    for t in outputs:
        visit(t.op)
    return placeholders, computes


def side_first(outputs) -> tuple[list, list]:
    """``(side stages, computes)``: the side stages of ``outputs``' operators
    (:func:`dsl.ops.tag.side_stages`) and every compute of the kernel, in the order
    ``Schedule.prim_func`` builds them (side stages and their producers first)."""
    _, computes = walk(outputs)
    side: list = []
    for t in (t for op in computes for t in tag.side_stages(op)):
        if not any(same_tensor(t, u) for u in side):  # several outputs share one flag
            side.append(t)
    return side, (walk([*side, *outputs])[1] if side else computes)


def block_names(computes) -> list[str]:
    """The block name ``te.create_prim_func`` gives each compute (producers first): its
    ``name``, and ``name_1``, ``name_2``, ... for later computes of the same name."""
    used: dict[str, int] = {}
    names = []
    for op in computes:
        k = used.get(op.name, 0)
        used[op.name] = k + 1
        names.append(op.name if k == 0 else f"{op.name}_{k}")
    return names


@dataclass
class Schedule:
    """What ``auto_schedule`` returns and ``build`` consumes.

    The s_tir schedule is made per argument order (``build``'s ``tensor_list``), so this holds
    the outputs, the target and the rule; :meth:`s_tir` applies the rule.
    """

    outputs: list
    target: targets.CpuTarget
    rule_name: str
    anchor_tag: str
    override: object = None  # a tuned trace (set by dsl.tune) replacing the rule
    # What build writes to the JSON "schedule" entry (source, trace, measured time...).
    schedule_meta: dict | None = None
    # (block, rule, why) for each block the last :meth:`s_tir` scheduled (fusion included).
    decisions: list | None = None

    @functools.cached_property
    def _graph(self) -> tuple[list, list, list]:
        """``(placeholders, side stages, computes)`` of the kernel (:func:`walk`,
        :func:`side_first`), walked once per Schedule: ``workload``, ``index_dtype`` and
        ``prim_func`` all read them on every build."""
        placeholders, _ = walk(self.outputs)
        side, computes = side_first(self.outputs)
        return placeholders, side, computes

    def default_tensor_list(self) -> list:
        return [*self._graph[0], *self.outputs]

    def workload(self):
        from schedules import Workload

        _, _, computes = self._graph
        stages: dict[str, list[str]] = {}
        for op, name in zip(computes, block_names(computes)):
            if op.tag:
                stages.setdefault(op.tag, []).append(name)
        blocks = {tag: names[-1] for tag, names in stages.items()}
        anchor = next((op for op in reversed(computes) if op.tag == self.anchor_tag),
                      self.outputs[0].op)
        attrs = {str(k): (str(v) if not isinstance(v, (int, float)) else v)
                 for k, v in (anchor.attrs.items() if anchor.attrs else [])}
        return Workload(self.anchor_tag, blocks, attrs, self.target, stages=stages)

    def index_dtype(self) -> str:
        """``"int64"`` when some tensor of the kernel (argument or stage) has at least
        :data:`INT64_INDEX_FROM` elements, else ``"int32"`` (TVM's default, faster)."""
        placeholders, _, computes = self._graph
        shapes = [t.shape for t in placeholders]
        shapes += [op.output(k).shape for op in computes for k in range(op.num_outputs)]
        big = any(math.prod(int(d) for d in s) >= INT64_INDEX_FROM for s in shapes)
        return "int64" if big else "int32"

    def prim_func(self, tensor_list=None):
        """The unscheduled PrimFunc over ``tensor_list``, with the side stages of its
        operators (:func:`dsl.ops.tag.side_stages`) computed inside it (first)."""
        from tvm import te

        from dsl.runtime.run_if import side_outputs_to_buffers

        args = list(tensor_list or self.default_tensor_list())
        pattern = self.pattern_path()
        if pattern:  # a user's strided dx: its zero taps split away
            from schedules.patterns.phases import split_phases

            args = split_phases(args)
        _, side, _ = self._graph
        n_in = next((i for i, t in enumerate(args)
                     if not isinstance(t.op, te.PlaceholderOp)), len(args))
        # the side stages listed before the outputs, so their blocks come first
        full = [*args[:n_in], *side, *args[n_in:]]
        if self.index_dtype() == "int64":  # every index, loop and shape in 64 bits
            func = te.create_prim_func(full, index_dtype_override="int64")
        else:
            func = te.create_prim_func(full)
        func = side_outputs_to_buffers(func, range(n_in, n_in + len(side)))
        if pattern:  # a zero padding's stage is a copy the rules inline
            from schedules.rewrite import drop_proven_guards

            func = drop_proven_guards(func)
        return func

    def pattern_path(self) -> bool:
        """Whether the pattern rules schedule this kernel (no operator rule claims it)."""
        import schedules

        return not schedules.has_rule(self.anchor_tag, self.target)

    def s_tir(self, tensor_list=None):
        """The ``tvm.s_tir.Schedule`` of this kernel with its rule applied."""
        import tvm

        sch = tvm.s_tir.Schedule(self.prim_func(tensor_list))
        if self.override is not None:
            self.override(sch)
        else:
            # int64 kernels: TVM 0.27's fuse folds wide extents to int32 (see _WideFuse)
            self.apply_rule(_WideFuse(sch) if self.index_dtype() == "int64" else sch)
        return sch

    def apply_rule(self, sch) -> None:
        """Apply the registered rule to ``sch`` (the user's stages around the operator fused
        into it, see :mod:`schedules.fusion`); records :attr:`decisions`."""
        import schedules

        workload = self.workload()
        schedules.apply(sch, workload)
        self.decisions = list(workload.decisions)

    def op_info(self) -> dict:
        """The anchor op's name, parameters and tensor formats (for the kernel's JSON)."""
        attrs = self.workload().attrs
        return {"op": attrs.get("dsl_op", self.anchor_tag or self.outputs[0].op.name),
                "params": json.loads(attrs.get("dsl_params", "{}")),
                "formats": json.loads(attrs.get("dsl_formats", "{}"))}


def _check_reduce(op) -> None:
    """Refuse a reduction with ``where=`` or ``init=``: TVM 0.27's ``te.create_prim_func``
    drops both without a word, so ``te.sum(x, axis=k, where=k < i)`` would sum every term."""
    import tvm

    for expr in getattr(op, "body", ()):
        if not isinstance(expr, tvm.tirx.Reduce):
            continue
        cond = expr.condition
        if not (isinstance(cond, tvm.tirx.IntImm) and int(cond) == 1):
            raise fail(E_VALUE, f"stage '{op.name}'", str(cond),
                       "is a reduction with where=, which TVM 0.27 drops when it builds the "
                       "kernel (every term would be summed): put the condition in the term, "
                       "te.sum(te.if_then_else(cond, value, 0), axis=...)")
        if len(expr.init):
            raise fail(E_VALUE, f"stage '{op.name}'", [str(v) for v in expr.init],
                       "is a reduction with init=, which TVM 0.27 drops when it builds the "
                       "kernel: add the initial value in a stage after the reduction")


class _WideFuse:
    """An s_tir schedule whose ``fuse`` works on loops of 2**31 iterations or more.

    TVM 0.27's fuse folds the product of the inner loops' extents as an int32 constant, so
    fusing loops whose inner extents multiply to 2**31 or more fails ("Literal value ...
    exceeds range of int32") even with int64 loops. Here only the innermost loops whose inner
    products fit are fused, the outer ones stay serial around the fused loop (a parallel
    loop inside them is still parallel). Everything else goes to the schedule unchanged.
    """

    def __init__(self, sch):
        self._sch = sch

    def __getattr__(self, name):
        return getattr(self._sch, name)

    def fuse(self, *loops, preserve_unit_iters: bool = True):
        extents = [int(self._sch.get(loop).extent) for loop in loops]
        first = 0
        while first < len(loops) - 1 and math.prod(extents[first + 1:]) >= 2**31:
            first += 1
        if first == len(loops) - 1:
            return loops[-1]
        return self._sch.fuse(*loops[first:], preserve_unit_iters=preserve_unit_iters)


@dataclass
class TuningHooks:
    """Where the tuning layer plugs in. :mod:`dsl.tuning` sits above the runtime and sets
    these when it is imported (``import dsl`` does), so the runtime never imports it."""

    apply: object = None  # apply(sch): point sch at its accepted tuned record, if any
    reject: object = None  # reject(schedule_meta, reason): a record failed re-verification


TUNING_HOOKS = TuningHooks()


def auto_schedule(res, target=None) -> Schedule:
    """Choose the schedule for ``res`` (a tensor or list of output tensors).

    The rule is the one of the kernel's anchor stage (:func:`schedules.find_anchor`): a
    shipped operator's stage wherever it stands, so a user's elementwise epilogue or prologue
    around it is fused into the operator's schedule instead of dropping it to the generic one.
    ``target`` defaults to :func:`targets.current` (host unless inside ``targets.use(...)``).
    When the tuning database (:mod:`dsl.tuning.database`) holds an accepted record for this workload
    on this target, the schedule replays its trace instead of the registered rule.
    """
    from schedules import find_anchor, lookup

    outs = _as_list(res)
    tgt = target_get(target) if target is not None else targets.current()
    _, computes = walk(outs)
    for op in computes:
        _check_reduce(op)
    anchor = find_anchor(list(reversed(computes)), tgt)
    tag = anchor.tag if anchor is not None else outs[0].op.tag
    name, _ = lookup(tag, tgt)
    sch = Schedule(outs, tgt, name, tag)
    if TUNING_HOOKS.apply is not None:
        TUNING_HOOKS.apply(sch)  # a tuned record for this workload and target replaces the rule
    return sch
