"""How well a kernel's loop nests keep ``N`` cores busy: a static model, no timing.

This project is developed on 2-core machines and run on 8-128-core servers. A schedule that
leaves a stage serial, or splits a parallel loop into too few tasks, costs nothing visible
on 2 cores and most of the machine on 64. :func:`predict` reads a lowered kernel (the
``IRModule`` of ``build(sch, {..., "need_build": False})``) and says, per stage, how much of
``cores`` x the kernel's time its tasks can fill:

* the work of a statement is the number of times its leaf stores run (each element of a
  vectorised store counts once): a copy of ``E`` elements weighs ``E``, a reduction of ``K``
  steps per output ``K`` per output;
* a stage's first parallel loop of ``E`` tasks runs its work in ``ceil(E / cores)`` rounds of
  ``work / E`` each; work outside every parallel loop runs on one core;
* the kernel's **busy share** is ``total work / (cores x sum of the stages' times)``: 1.0 when
  every stage splits evenly over the cores, ``1 / cores`` for a serial kernel.

What it leaves out, on purpose: memory bandwidth and caches (shared by the cores; the
benchmark measures those), unequal tasks (a ragged tile; a loop of data-dependent extent
counts at its bound) and the cost of starting a parallel region, which it counts apart
(``launches``) because it is the machine's, not the schedule's: about 3 us on the 2-core
development VM (a vectorised copy of 2^16 fp32 after a parallel stage: 9.2 us serial, 14.8
us across both cores), so a small serial stage after a parallel one is usually right, even
where the share says it idles the other cores. A share near 1.0 says the split cannot be
what limits a kernel on that many cores; a low one names the stage that will (``python -m
dsl scaling``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class StageLoad:
    """One top-level statement of a kernel (a stage and what a schedule moved into it).

    ``work``: leaf stores it runs; ``tasks``: the extent of its first parallel loop (0 when
    it has none, or the largest where branches differ); ``time``: its time on the cores of
    the prediction, in units of one store on one core; ``launches``: how many times a call
    starts a parallel region in it (once per iteration of the serial loops around one).
    ``conditional``: it runs only when a value the kernel reads says so (an exact twin,
    :mod:`dsl.runtime.run_if`, run for non-finite weights), so a call usually skips it.
    """

    name: str
    work: int
    tasks: int
    time: float
    launches: int = 0
    conditional: bool = False


@dataclass(frozen=True)
class Prediction:
    """:func:`predict`'s answer for one kernel on ``cores`` cores."""

    cores: int
    stages: tuple[StageLoad, ...]

    @property
    def running(self) -> tuple[StageLoad, ...]:
        """The stages a usual call runs (not the :attr:`StageLoad.conditional` ones); the
        properties below are theirs."""
        return tuple(s for s in self.stages if not s.conditional)

    @property
    def work(self) -> int:
        return sum(s.work for s in self.running)

    @property
    def launches(self) -> int:
        """Parallel regions one call starts (each costs a wake-up and a join of the pool)."""
        return sum(s.launches for s in self.running)

    @property
    def share(self) -> float:
        """The share of ``cores`` x the kernel's time its stages fill (1.0: all busy)."""
        time = sum(s.time for s in self.running)
        return self.work / (self.cores * time) if time else 1.0

    def limiting(self) -> StageLoad | None:
        """The stage that loses the most core time (its time x cores - its work)."""
        lost = [(s.time * self.cores - s.work, s) for s in self.running if s.work]
        return max(lost, key=lambda t: t[0])[1] if lost else None


def predict(mod, cores: int) -> Prediction:
    """:class:`Prediction` for the kernel(s) of ``mod`` (an ``IRModule`` or ``PrimFunc``,
    scheduled and lowered, as :func:`dsl.runtime.build.lower` makes it) on ``cores`` cores."""
    from tvm import tirx

    if cores < 1:
        raise ValueError(f"cores={cores}: a prediction needs at least one core")
    funcs = [mod] if isinstance(mod, tirx.PrimFunc) else [
        f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)]
    stages = []
    for func in funcs:
        stages += [_stage(stmt, cores) for stmt in _top_level(func.body)]
    return Prediction(cores, tuple(s for s in stages if s.work))


def _top_level(stmt) -> list:
    """The statements of a kernel's body below its root block: its stages, in order (the
    body itself where it is one loop nest)."""
    from tvm import tirx

    while not isinstance(stmt, (tirx.SeqStmt, tirx.For)):
        inner = _children(stmt)
        if len(inner) != 1:
            return [stmt]
        stmt = inner[0]
    return list(stmt.seq) if isinstance(stmt, tirx.SeqStmt) else [stmt]


def _children(stmt) -> list:
    """The statements directly under ``stmt`` (a block's init before its body)."""
    from tvm import tirx

    if isinstance(stmt, tirx.SeqStmt):
        return list(stmt.seq)
    if isinstance(stmt, tirx.IfThenElse):
        return [s for s in (stmt.then_case, stmt.else_case) if s is not None]
    block = getattr(stmt, "block", None)
    if block is not None:
        return [block]
    return [s for s in (getattr(stmt, "init", None), getattr(stmt, "body", None))
            if s is not None]


def _extent(expr) -> int:
    """A loop's extent, or its upper bound where it is not a constant."""
    import tvm

    if isinstance(expr, tvm.tirx.IntImm):
        return max(1, int(expr.value))
    bound = tvm.sym.Analyzer().const_int_bound(expr)
    return max(1, int(bound.max_value)) if bound.max_value < (1 << 40) else 1


def _stage(stmt, cores: int) -> StageLoad:
    """The load of one top-level statement, named after the block that does most of its work
    (a reduction's update, not its init)."""
    from tvm import tirx

    work, time, tasks_seen, launches = {}, [0.0], [0], [0]

    def walk(node, trips: int, tasks: int, block: str) -> None:
        if isinstance(node, tirx.For):
            n = _extent(node.extent)
            if not tasks and node.kind == tirx.ForKind.PARALLEL:
                tasks_seen[0] = max(tasks_seen[0], n)
                launches[0] += trips
                tasks = n
            walk(node.body, trips * n, tasks, block)
            return
        if isinstance(node, tirx.BufferStore):
            work[block] = work.get(block, 0) + trips
            time[0] += trips / tasks * math.ceil(tasks / cores) if tasks else trips
            return
        if hasattr(node, "name_hint") and hasattr(node, "reads"):
            block = str(node.name_hint)
        for child in _children(node):
            walk(child, trips, tasks, block)

    walk(stmt, 1, 0, "?")
    name = max(work, key=work.get) if work else "?"
    return StageLoad(name, sum(work.values()), tasks_seen[0], time[0], launches[0],
                     _data_guarded(stmt))


def _data_guarded(stmt) -> bool:
    """Whether ``stmt`` is an ``if`` without ``else`` whose condition reads a buffer."""
    import tvm_ffi
    from tvm import tirx
    from tvm.ir.expr import TensorLoad

    if not isinstance(stmt, tirx.IfThenElse) or stmt.else_case is not None:
        return False
    loads = []
    tvm_ffi.structural_walk(stmt.condition, (TensorLoad, loads.append), order="post")
    return bool(loads)
