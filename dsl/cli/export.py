"""``python -m dsl export``: build benchmark kernels for another machine and pack them to go.

A server without the TVM compiler (``TVM_USE_RUNTIME_LIB=1``, the ~16 MB runtime-only Python
tree) can still run our kernels: this command cross-compiles the conv2d suite's dx/dw kernels
for a named target (``--target sapphirerapids``) at each requested core count and writes, per
kernel, the ``.so``, its packed inputs and the index map that unpacks its output to NCHW, plus
a manifest. ``dsl/cli/remote_run.py`` (standalone: numpy, TVM's runtime and optionally PyTorch)
then times ours and that machine's PyTorch, each in its own process, and checks every result
against PyTorch at full size::

    python -m dsl export --target sapphirerapids --cores 1,16 out/
    # on the server, with the repository (or just out/ and remote_run.py) copied over:
    TVM_USE_RUNTIME_LIB=1 python dsl/cli/remote_run.py out/ --threads 1,16

Inputs are drawn from multiples of 1/8 in [-1, 1): exact in float32, so the check measures
summation order only, and they compress well in the ``.npz`` files.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

import numpy as np


def _inputs(rng, shape) -> np.ndarray:
    return (rng.integers(-8, 8, size=shape) / 8).astype(np.float32)


def _unpack_index(out_shape, unpack) -> np.ndarray:
    """Flat indices ``idx`` with ``unpack(y) == y.ravel()[idx]`` for any ``y`` of ``out_shape``."""
    size = int(np.prod(out_shape))
    return unpack(np.arange(size, dtype=np.float64).reshape(out_shape)).astype(np.int32)


def _graph(layer, kind: str):
    """(placeholders, output, nchw arrays, packed arrays, unpack index, torch call spec)."""
    from tvm import te

    from dsl.ops.conv2d_backprop_filter import conv2d_backprop_filter
    from dsl.ops.conv2d_backprop_input import conv2d_backprop_input
    from dsl.ops.group import GroupLayout
    from dsl.ops.layout import fracz_to_weight, nc1hwc0_to_nchw, nchw_to_5hd, weight_to_fracz

    rng = np.random.default_rng(0)
    ho, c1 = layer.out, -(-layer.cout // 16)
    dy = _inputs(rng, (layer.n, layer.cout, ho, ho))
    dy_t = te.placeholder((layer.n, c1, ho, ho, 16), name="out_backprop", dtype="float32")
    if kind == "dx":
        w = _inputs(rng, layer.w_shape())
        fz = GroupLayout.from_weight(layer.w_shape(), layer.groups).fracz_shape
        w_t = te.placeholder(fz, name="filters", dtype="float32")
        out = conv2d_backprop_input(w_t, dy_t, layer.w_shape(),
                                    (layer.n, layer.cin, layer.hw, layer.hw),
                                    layer.para(res_dtype="float32"))
        shape = [int(d) for d in out.shape]
        idx = _unpack_index(shape, lambda y: nc1hwc0_to_nchw(y, layer.cin))
        return ([w_t, dy_t], out, {"weight": w, "grad_output": dy},
                [weight_to_fracz(w, layer.groups), nchw_to_5hd(dy)], idx)
    x = _inputs(rng, (layer.n, layer.cin, layer.hw, layer.hw))
    x_t = te.placeholder((layer.n, -(-layer.cin // 16), layer.hw, layer.hw, 16), name="fmap",
                         dtype="float32")
    out = conv2d_backprop_filter(x_t, dy_t, layer.w_shape(),
                                 layer.para(res_dtype="float32", groups=layer.groups))
    shape = [int(d) for d in out.shape]
    idx = _unpack_index(shape, lambda y: fracz_to_weight(y, layer.w_shape(), layer.groups))
    return ([x_t, dy_t], out, {"input": x, "grad_output": dy},
            [nchw_to_5hd(x), nchw_to_5hd(dy)], idx)


def export_kernel(layer, kind: str, target, out_dir: Path) -> dict:
    """Build one kernel for ``target`` into ``out_dir`` and return its manifest entry."""
    from dsl.runtime.build import build
    from dsl.runtime.schedule import auto_schedule

    ins, out, nchw, packed, idx = _graph(layer, kind)
    name = f"{kind}_{layer.name}_c{target.cores}"
    with tempfile.TemporaryDirectory(prefix="dsl-export-") as tmp:
        meta = build(auto_schedule([out], target=target),
                     {"name": name, "tensor_list": [*ins, out], "kernel_meta_parent_dir": tmp})
        so = Path(tmp) / "kernel_meta" / f"{name}.so"
        (out_dir / f"{name}.so").write_bytes(so.read_bytes())
    data = out_dir / f"{kind}_{layer.name}.npz"  # the same for every core count
    if not data.exists():
        np.savez_compressed(data, *packed, unpack_index=idx, **nchw)
    return {"name": name, "data": data.name, "layer": dataclasses.asdict(layer), "kind": kind,
            "flops": layer.flops, "cores": target.cores,
            "out_shape": [int(d) for d in out.shape], "out_dtype": str(out.dtype),
            "inputs": len(packed), "rule": meta["schedule"]["rule"] if isinstance(meta, dict)
            else None}


def main(argv: list[str] | None = None) -> int:
    import targets
    from dsl.cli.bench.conv2d import LAYERS

    p = argparse.ArgumentParser(prog="python -m dsl export", description=__doc__.split("\n")[0])
    p.add_argument("out", help="directory to write (created)")
    p.add_argument("--target", default="host", help="target name (see targets/)")
    p.add_argument("--cores", default="1", help="comma-separated core counts to build for")
    p.add_argument("--filter", default="", help="only layers whose name contains this")
    args = p.parse_args(argv)
    base = targets.get(args.target)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    entries = []
    layers = [layer for layer in LAYERS if args.filter in layer.name]
    jobs = [(layer, kind, int(c)) for c in args.cores.split(",") for layer in layers
            for kind in ("dx", "dw")]
    for i, (layer, kind, cores) in enumerate(jobs, 1):
        print(f"[{i}/{len(jobs)}] {kind} {layer.name} for {base.name} x{cores}", flush=True)
        entries.append(export_kernel(layer, kind, base.with_cores(cores), out_dir))
    manifest = {"target": base.as_json(), "kernels": entries}
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1))
    print(f"wrote {len(entries)} kernels to {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
