"""``python -m dsl bench --mca``: llvm-mca's prediction for each row's inner loop.

For every row whose kernel has an FMA inner loop (:func:`targets.mca.hot_loop` of the kernel's
assembly), llvm-mca on the target's ``-mcpu`` predicts the cycles per iteration; with the
loop's FLOP (2 per fp32 lane per FMA: xmm 4, ymm 8, zmm 16 lanes) that is a predicted FLOP per
cycle per core. Next to it: the achieved FLOP per cycle per core,
``ours GFLOP/s / threads / GHz`` (the clock :func:`targets.roof.measured_peak` measured), and
both as a share of the target's issue bound (``flops_per_cycle``). Achieved far below
predicted: the time goes outside the inner loop (packing, loop order, the parallel split).
"""

from __future__ import annotations

import contextlib
import re
import sys

from targets import mca


@contextlib.contextmanager
def capture():
    """Collect the assembly of every kernel ``fresh_build`` builds inside the block."""
    from dsl.cli import bench

    sink: list[str] = []
    old, bench.ASM_SINK = bench.ASM_SINK, sink
    try:
        yield sink
    finally:
        bench.ASM_SINK = old


_TILE_PRODUCT = re.compile(r"^\s*tdp\w+\s", re.M)


def best_loop(asms) -> tuple[list[str], str | None]:
    """The hottest FMA loop over several kernels' assembly (most FMAs per instruction, then
    most FMAs), and the assembly it came from; ``([], None)`` when none has one."""
    best, best_key, src = [], (0.0, 0), None
    for asm in asms:
        loop = mca.hot_loop(asm)
        key = mca.loop_rank(loop)
        if key[1] and key > best_key:
            best, best_key, src = loop, key, asm
    return best, src


def row_report(asms, mcpu: str, gflops: float | None, threads: int, ghz: float | None,
               bound: float | None) -> dict:
    """``row["mca"]``: predicted and achieved FLOP per cycle per core of the hottest loop of
    ``asms`` (``prediction`` None with ``reason`` when llvm-mca cannot answer or there is no
    FMA loop); ``*_pct_bound``: each as a percentage of ``bound`` FLOP/cycle/core."""
    if any(_TILE_PRODUCT.search(asm) for asm in asms):
        return {"mcpu": mcpu, "prediction": None,
                "reason": "AMX tile products (tdpbf16ps / tdpbusd), which llvm-mca does not "
                          "model; the row's % of roof is against the AMX roof"}
    loop, src = best_loop(asms)
    if src is None:
        return {"mcpu": mcpu, "prediction": None, "reason": "no loop with FMA instructions"}
    per_core = gflops / threads if gflops and threads else None
    rep = mca.kernel_report(src, mcpu, per_core, ghz)
    pred = rep.pop("prediction")
    out = {**rep, "prediction": None}
    if pred is not None:
        out.update(prediction="ok", cycles_per_iter=pred.cycles_per_iter,
                   block_rthroughput=pred.block_rthroughput, ipc=pred.ipc)
    if bound:
        out["bound_flops_per_cycle"] = bound
        for key in ("predicted", "achieved"):
            if f"{key}_flops_per_cycle" in out:
                out[f"{key}_pct_bound"] = 100 * out[f"{key}_flops_per_cycle"] / bound
    return out


def add_mca(rows, threads_of, target, asms_of, out=None) -> None:
    """Give each GFLOP/s row ``row["mca"]`` (see :func:`row_report`); print llvm-mca's reason
    once when it cannot answer. ``threads_of(row)``: the row's thread count; ``asms_of(row)``:
    the assembly of the kernels the row built."""
    from targets import roof

    out = out or sys.stdout
    reasons = []
    for r in rows:
        if r.get("error") or r.get("unit") == "GB/s":
            continue
        n = threads_of(r)
        try:
            peak = roof.measured_peak("float32", n)
            ghz, bound = peak.ghz, peak.flops_per_cycle
        except roof.RoofError:
            ghz = bound = None
        r["mca"] = row_report(asms_of(r), target.mcpu, r.get("ours_gflops"), n, ghz, bound)
        if r["mca"]["prediction"] is None and "FMA" not in r["mca"]["reason"]:
            reasons.append(r["mca"]["reason"])
    for reason in dict.fromkeys(reasons):
        print(f"# llvm-mca skipped: {reason}", file=out)
    if any("mca" in r for r in rows):
        print(f"# mca: llvm-mca -mcpu={target.mcpu} cycles/iter of the hot FMA loop; pred and "
              f"ach FLOP/cycle/core (ach = ours GFLOP/s / threads / measured GHz), "
              f"% of the issue bound", file=out)


def cell(r: dict) -> str:
    """The table's ``mca`` cell: ``cyc/it pred ach (pred% ach% of bound)`` or ``-``."""
    m = r.get("mca")
    if not m:
        return ""
    if m.get("prediction") is None:
        ach = m.get("achieved_flops_per_cycle")
        return "  mca -" + (f" ach {ach:.1f}" if ach else "")
    text = (f"  mca {m['cycles_per_iter']:.2f}cyc pred {m['predicted_flops_per_cycle']:.1f}")
    if "achieved_flops_per_cycle" in m:
        text += f" ach {m['achieved_flops_per_cycle']:.1f}"
    if "predicted_pct_bound" in m:
        text += f" ({m['predicted_pct_bound']:.0f}%"
        text += (f"/{m['achieved_pct_bound']:.0f}%" if "achieved_pct_bound" in m else "")
        text += " bound)"
    return text
