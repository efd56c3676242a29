"""Schedules: how each compute runs on each target family.

A *rule* is ``rule(sch, workload)``: it transforms ``sch`` (a ``tvm.s_tir.Schedule`` of the
whole kernel) in place. Rules are registered per (compute tag, target family) and looked up by
the tag of the kernel's *anchor* stage (:func:`find_anchor`: a shipped operator's stage
wherever it stands in the graph, else the output's); a (tag, family) without a rule falls back
to (tag, "generic"), then to :func:`schedules.generic.schedule_generic`, always correct.
:func:`apply` first fuses the user's elementwise stages around the operator into it
(:mod:`schedules.fusion`), runs the rule, then schedules any stage left over.

Rules read target numbers (vector lanes, cores) from ``workload.target`` and never test its
name, so a new target is a new entry in ``targets/``, not an edit here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from targets import CpuTarget


@dataclass
class Workload:
    """What a rule sees besides the schedule.

    Attributes
    ----------
    anchor_tag : str
        Tag of the output stage (the registry key).
    blocks : dict
        Block name per stage tag (``{"conv2d_backprop_input.weight": "dx_weight", ...}``);
        for a tag that several stages carry, the last of them.
    stages : dict
        Every block name per stage tag, producers first (dx has one ``acc`` per stride
        phase). :meth:`find` and :meth:`find_all` turn them into block handles.
    attrs : dict
        The anchor compute's ``attrs`` (op name, JSON parameters).
    target : CpuTarget
    decisions : list of (stage, rule, why)
        What scheduled each stage and why, appended by :meth:`note` (``dsl.explain`` prints
        it; a stage left to the generic rule is reported there).
    """

    anchor_tag: str
    blocks: dict[str, str]
    attrs: dict
    target: CpuTarget
    extra: dict = field(default_factory=dict)
    decisions: list = field(default_factory=list)
    stages: dict[str, list[str]] = field(default_factory=dict)

    def __post_init__(self):
        for tag, name in self.blocks.items():
            self.stages.setdefault(tag, [name])

    def find_all(self, sch, tag: str) -> list:
        """The blocks of ``sch`` whose stage carries ``tag``, in program order."""
        names = set(self.stages.get(tag, ()))
        return [b for b in sch.get_child_blocks(sch.get_sblock("root"))
                if sch.get(b).name_hint in names]

    def find(self, sch, tag: str):
        """The block of the stage tagged ``tag`` (the last one, as :attr:`blocks`), or None."""
        name = self.blocks.get(tag)
        return sch.get_sblock(name) if name is not None else None

    def note(self, stage: str, rule: str, why: str) -> None:
        """Record that ``rule`` scheduled block ``stage`` because ``why``."""
        self.decisions.append((stage, rule, why))


Rule = Callable[["object", Workload], None]
_RULES: dict[tuple[str, str], tuple[str, Rule]] = {}


def register(tag: str, family: str = "generic"):
    """Decorator: ``@register("conv2d_backprop_input", "x86")``."""

    def deco(fn: Rule) -> Rule:
        _RULES[(tag, family)] = (f"{fn.__module__}.{fn.__name__}", fn)
        return fn

    return deco


def lookup(tag: str, target: CpuTarget) -> tuple[str, Rule]:
    """The (name, rule) for a tag on a target, falling back to the generic schedule."""
    _load_builtin()
    from schedules.generic import schedule_generic

    for key in ((tag, target.family), (tag, "generic")):
        if key in _RULES:
            return _RULES[key]
    return f"{schedule_generic.__module__}.{schedule_generic.__name__}", schedule_generic


def has_rule(tag: str, target: CpuTarget) -> bool:
    """True if ``tag`` has a rule of its own on ``target`` (not the generic fallback)."""
    _load_builtin()
    return (tag, target.family) in _RULES or (tag, "generic") in _RULES


def find_anchor(ops, target: CpuTarget):
    """The compute whose rule schedules the kernel, or None (the generic rule then).

    ``ops`` are the kernel's computes, consumers first. A shipped operator's stage (one with
    a rule whose compute carries ``dsl_op`` attributes) wins wherever it stands, so a user's
    epilogue after it keeps the operator's rule; then any other stage with a rule of its own
    (layout copies), then pattern stages (:data:`dsl.ops.tag.PATTERNS`).
    """
    from dsl.ops import tag as tags

    def rank(op) -> int:
        if op.attrs is not None and "dsl_op" in op.attrs:
            return 0
        return 2 if op.tag in tags.PATTERNS else 1

    ranked = [(rank(op), i, op) for i, op in enumerate(ops) if op.tag and has_rule(op.tag, target)]
    return min(ranked, key=lambda r: r[:2])[2] if ranked else None


def apply(sch, workload: Workload) -> str:
    """Schedule the whole kernel ``sch``: fuse the user's stages around the operator into it,
    run the anchor's rule, give what is left the elementwise rule; returns the rule's name."""
    from schedules import fusion

    name, rule = lookup(workload.anchor_tag, workload.target)
    if not has_rule(workload.anchor_tag, workload.target):
        rule(sch, workload)  # the generic rule schedules every block itself
        return name
    left = fusion.fuse_into_operator(sch, workload)
    rule(sch, workload)
    fusion.schedule_leftovers(sch, workload, left)
    return name


def registered() -> list[tuple[str, str, str]]:
    _load_builtin()
    return sorted((tag, fam, name) for (tag, fam), (name, _) in _RULES.items())


_LOADED = False


def _load_builtin() -> None:
    """Import every module of this package once: each registers its rules on import."""
    global _LOADED
    if _LOADED:
        return
    import importlib
    import pkgutil

    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")
    _LOADED = True
