"""``explain``: which rule scheduled each stage of a kernel, and why.

Rules record their decisions with :meth:`schedules.Workload.note`; ``explain`` applies the
schedule's rule to a fresh copy of the kernel and collects them. A stage no rule noted was
scheduled by the operator's own rule as part of its anchor. A stage left to the generic
last resort warns once per pattern when it is scheduled (:mod:`schedules.patterns`).
"""

from __future__ import annotations

from dataclasses import dataclass

from dsl.errors import E_TYPE, fail
from dsl.runtime.schedule import Schedule


@dataclass(frozen=True)
class Explanation:
    """What ``dsl.explain`` returns.

    Attributes
    ----------
    rule : str
        The registered rule the schedule dispatched to (``schedules.generic.schedule_generic``
        for a graph no operator rule claims).
    target : str
        The target's name.
    stages : tuple of (stage, rule, why)
        One entry per decision, in the order the rules made them; a stage the operator's
        rule scheduled without a note appears once with that rule's name.
    """

    rule: str
    target: str
    stages: tuple

    def rule_of(self, stage: str) -> str:
        """The rule that scheduled ``stage`` (its last decision); KeyError if unknown."""
        hits = [r for s, r, _ in self.stages if s == stage]
        if not hits:
            raise KeyError(stage)
        return hits[-1]

    def fell_to_generic(self) -> list[str]:
        """Stages left to the generic last resort."""
        from schedules.patterns import GENERIC

        return [s for s, r, _ in self.stages if r == GENERIC]

    def __str__(self) -> str:
        width = max([len(s) for s, _, _ in self.stages] + [5])
        rwidth = max([len(r) for _, r, _ in self.stages] + [4])
        lines = [f"schedule of {self.rule} on {self.target}:",
                 f"  {'stage':<{width}}  {'rule':<{rwidth}}  why"]
        lines += [f"  {s:<{width}}  {r:<{rwidth}}  {w}" for s, r, w in self.stages]
        return "\n".join(lines)


def explain(sch: Schedule, tensor_list=None) -> Explanation:
    """List each stage of ``sch``, the rule that scheduled it and why.

    Parameters
    ----------
    sch : dsl.Schedule
        What :func:`dsl.auto_schedule` returned.
    tensor_list : list of te.Tensor, optional
        The kernel's argument order (default: placeholders in first use, then outputs).

    Returns
    -------
    Explanation
        ``str()`` of it is a table; :meth:`Explanation.rule_of` answers for one stage.
    """
    import tvm

    if not isinstance(sch, Schedule):
        raise fail(E_TYPE, "sch", type(sch).__name__,
                   "must be the Schedule returned by dsl.auto_schedule(res)")
    func = sch.prim_func(tensor_list)
    names = _block_names(tvm.s_tir.Schedule(func))
    if sch.override is not None:
        stages = tuple((n, "tuned trace", "a dsl.tune record replaces the rule") for n in names)
        return Explanation(sch.rule_name, sch.target.name, stages)
    sch.apply_rule(tvm.s_tir.Schedule(func))  # fusion pre-pass + rule, decisions recorded
    decisions = list(sch.decisions or [])
    noted = {s for s, _, _ in decisions}
    rest = tuple((n, sch.rule_name, f"part of the operator '{sch.anchor_tag}' its rule "
                  "schedules") for n in names if n not in noted)
    return Explanation(sch.rule_name, sch.target.name, (*decisions, *rest))


def _block_names(sch) -> list[str]:
    return [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
