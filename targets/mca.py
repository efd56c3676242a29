"""What ``llvm-mca`` predicts for an inner loop on a target's ``-mcpu``: a benchmark aid.

``llvm-mca`` simulates a straight-line block on LLVM's scheduling model of one CPU and reports
the cycles per iteration once it reaches a steady state. Compared with the measured rate this
tells whether a loss is inside the inner loop (the model predicts it too) or outside it (loop
order, packing, the parallel split, caches). Helpers:

* :func:`predict` — cycles per iteration of a block of AT&T assembly for one ``-mcpu``;
* :func:`hot_loop` — the innermost loop of a built kernel's assembly (most FMAs per
  instruction) to feed to :func:`predict`;
* :func:`roof_report` — predicted vs achieved FLOP per cycle of the roof loop itself.

Everything returns ``None`` with a reason (:class:`Unavailable`) when ``llvm-mca`` is not
installed or has no model for the CPU (Debian's llvm-mca 14 predates ``znver4``,
``znver5``): callers print the reason and go on. Depends on nothing in ``dsl``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from targets.cpu import LLVM_ALIASES

FMA_RE = re.compile(r"^\s*(\{vex\}\s*)?v(p?dp\w+|f[n]?m(add|sub)\w*)\b")


@dataclass(frozen=True)
class Prediction:
    mcpu: str
    cycles_per_iter: float  # steady state, from Total Cycles / Iterations
    block_rthroughput: float  # the resource bound alone
    ipc: float
    tool: str


class Unavailable(RuntimeError):
    """llvm-mca cannot answer here (missing, or no model for the CPU); the message says why."""


def tool() -> str | None:
    """Path of ``llvm-mca`` (or the newest ``llvm-mca-N``), None when not installed."""
    found = shutil.which("llvm-mca")
    if found:
        return found
    for version in range(30, 9, -1):
        found = shutil.which(f"llvm-mca-{version}")
        if found:
            return found
    return None


def predict(block: Sequence[str], mcpu: str, iterations: int = 500) -> Prediction:
    """Cycles per iteration of ``block`` (AT&T assembly lines, a label and branch allowed).

    Where llvm-mca has no model for ``mcpu`` but knows the row it aliases
    (:data:`targets.cpu.LLVM_ALIASES`: ``emeraldrapids`` -> ``sapphirerapids``), that row's
    model answers; the :class:`Prediction`'s ``mcpu`` names the model used.

    Raises
    ------
    Unavailable
        No llvm-mca, no model for ``mcpu`` or its alias, or an instruction the model does
        not know.
    """
    exe = tool()
    if exe is None:
        raise Unavailable("llvm-mca is not installed (Debian: apt-get install llvm)")
    proc = _run(exe, block, mcpu, iterations)
    alias = LLVM_ALIASES.get(mcpu)
    if "not a recognized processor" in proc.stderr and alias is not None:
        # an older llvm-mca than the compiler (Debian's 14 has no emeraldrapids): the row
        # whose core the name shares (targets.cpu.LLVM_ALIASES) answers, and says so
        mcpu, proc = alias, _run(exe, block, alias, iterations)
    if "not a recognized processor" in proc.stderr:
        raise Unavailable(f"{exe} has no scheduling model for -mcpu={mcpu}")
    if proc.returncode:
        raise Unavailable(f"{exe} -mcpu={mcpu} failed: {proc.stderr.strip()[:300]}")
    field = {k: float(re.search(rf"^{k}:\s+([\d.]+)", proc.stdout, re.M).group(1))
             for k in ("Iterations", "Total Cycles", "IPC", "Block RThroughput")}
    return Prediction(mcpu, field["Total Cycles"] / field["Iterations"],
                      field["Block RThroughput"], field["IPC"], exe)


def _run(exe: str, block: Sequence[str], mcpu: str, iterations: int):
    return subprocess.run([exe, f"-mcpu={mcpu}", f"-iterations={iterations}"],
                          input="\n".join(block) + "\n", capture_output=True, text=True,
                          check=False, timeout=120)


_LABEL = re.compile(r"^([.\w$]+):")
_JUMP = re.compile(r"^\s+j\w+\s+([.\w$]+)\s*$")


def hot_loop(asm: str) -> list[str]:
    """The innermost hot loop of AT&T ``asm`` (``mod.inspect_source("asm")``): among the
    blocks from a label to a jump back to it, the one with the most FMA / dot-product
    instructions per instruction (ties: the most of them). Empty when there is none."""
    lines = asm.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := _LABEL.match(line))}
    best, best_key = [], (0.0, 0)
    for j, line in enumerate(lines):
        m = _JUMP.match(line)
        if not m or labels.get(m.group(1), j) >= j:
            continue
        body = [s.split("#")[0].rstrip() for s in lines[labels[m.group(1)]:j + 1]]
        body = [s for s in body if s.strip() and not s.strip().startswith(".")
                or _LABEL.match(s)]
        key = loop_rank(body)
        if key[1] and key > best_key:
            best, best_key = body, key
    return best


def loop_rank(block: Sequence[str]) -> tuple[float, int]:
    """How hot a loop body looks: (FMA / dot-product instructions per instruction, their
    count); labels do not count as instructions."""
    insns = [s for s in block if not _LABEL.match(s)]
    fmas = sum(1 for s in insns if FMA_RE.match(s))
    return fmas / max(1, len(insns)), fmas


def fma_flops(block: Sequence[str]) -> int:
    """fp32 FLOP per iteration of ``block``: 2 per lane of each FMA (ymm 8, zmm 16, xmm 4
    lanes; dot products count as their multiply-add pairs)."""
    lanes = {"xmm": 4, "ymm": 8, "zmm": 16}
    total = 0
    for line in block:
        m = FMA_RE.match(line)
        reg = re.search(r"%([xyz]mm)\d+\s*$", line)
        if m and reg:
            per_lane = 8 if "dpbusd" in line else 4 if "dpbf16" in line else 2
            total += lanes[reg.group(1)] * per_lane
    return total


def roof_report(roof, target) -> dict:
    """llvm-mca's prediction for the roof loop ``roof`` was measured with, against what was
    achieved (FLOP per cycle per core). ``prediction`` is None with ``reason`` when llvm-mca
    cannot answer."""
    from targets.roof import make_loop

    loop = make_loop(roof.isa, roof.dtype)
    block = [".Lroof:", *loop.body, "dec %rcx", "jnz .Lroof"]
    achieved = roof.gflops_per_core / roof.ghz
    out = {"mcpu": target.mcpu, "flops_per_iter": loop.flops, "achieved_flops_per_cycle":
           achieved, "bound_flops_per_cycle": roof.flops_per_cycle}
    try:
        pred = predict(block, target.mcpu)
    except Unavailable as err:
        return {**out, "prediction": None, "reason": str(err)}
    predicted = loop.flops / pred.cycles_per_iter
    return {**out, "prediction": pred, "predicted_flops_per_cycle": predicted,
            "achieved_over_predicted": achieved / predicted}


def kernel_report(asm: str, mcpu: str, gflops_per_core: float | None = None,
                  ghz: float | None = None) -> dict:
    """llvm-mca on a built kernel's hot loop (:func:`hot_loop` of ``asm``): predicted FLOP per
    cycle of that loop and, given the kernel's measured GFLOP/s per core and the clock (from
    :func:`targets.roof.measured_peak`), the achieved FLOP per cycle. Achieved well below
    predicted means the time goes outside the inner loop (packing, loop order, the split)."""
    loop = hot_loop(asm)
    out: dict = {"mcpu": mcpu, "loop_instructions": sum(1 for s in loop if not _LABEL.match(s)),
                 "flops_per_iter": fma_flops(loop)}
    if gflops_per_core and ghz:
        out["achieved_flops_per_cycle"] = gflops_per_core / ghz
    if not loop:
        return {**out, "prediction": None, "reason": "no loop with FMA instructions found"}
    try:
        pred = predict(loop, mcpu)
    except Unavailable as err:
        return {**out, "prediction": None, "reason": str(err)}
    out.update(prediction=pred, predicted_flops_per_cycle=out["flops_per_iter"]
               / pred.cycles_per_iter)
    if "achieved_flops_per_cycle" in out:
        out["achieved_over_predicted"] = (out["achieved_flops_per_cycle"]
                                          / out["predicted_flops_per_cycle"])
    return out
