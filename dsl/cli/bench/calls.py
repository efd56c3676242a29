"""``python -m dsl.cli.bench.calls``: what a call of a loaded kernel costs beyond the kernel.

Times, on one bandwidth-bound kernel (avg_pool2d backward, float32 by default), medians of
alternating samples (:func:`dsl.cli.bench.runner.alternating_medians`):

* ``raw``: ``kernel.func`` on TVM tensors, the generated function alone;
* ``numpy out=`` / ``torch out=`` / ``tvm out=``: ``kernel(dy, out=dx)`` through the zero-copy
  path (DLPack, results written into the given array);
* ``numpy alloc``: ``kernel(dy)`` allocating its result;
* ``copying (old)``: what every call did before the zero-copy path: inputs copied into TVM
  tensors, the result copied back into numpy.

Each is printed with its ratio to ``raw``.
"""

from __future__ import annotations

import argparse


def _kernel(shape, dtype):
    from dsl.api.aclnn import avg_pool2d_backward_kernel

    n, c, h, w = shape
    return avg_pool2d_backward_kernel((n, c, h // 2, w // 2), dtype, shape, dtype, [2, 2], [],
                                      [0, 0], False, True, 0)


def candidates(kernel, dtype: str) -> dict:
    """name -> zero-argument callable running the kernel once that way."""
    import numpy as np
    import tvm

    spec_in, spec_out = kernel.inputs[0], kernel.outputs[0]
    rng = np.random.default_rng(0)
    dy = rng.standard_normal(spec_in["shape"]).astype(dtype)
    dx = np.empty(spec_out["shape"], dtype)
    t_dy, t_dx = tvm.runtime.tensor(dy), tvm.runtime.tensor(dx)
    from dsl.runtime.kernel import _empty

    a_dy, a_dx = _empty(dy.shape, dtype, "numpy"), _empty(dx.shape, dtype, "numpy")
    a_dy[...] = dy

    def copying():
        out = tvm.runtime.tensor(np.empty(dx.shape, dtype))
        kernel.func(tvm.runtime.tensor(np.ascontiguousarray(dy)), out)
        dx[...] = out.numpy()

    fns = {"raw (kernel.func)": lambda: kernel.func(t_dy, t_dx),
           "tvm out=": lambda: kernel(t_dy, out=t_dx),
           "numpy out=": lambda: kernel(a_dy, out=a_dx),
           "numpy alloc": lambda: kernel(a_dy),
           "copying (old)": copying}
    try:
        import torch

        g_dy, g_dx = torch.from_numpy(a_dy), torch.empty(dx.shape, dtype=getattr(torch, dtype))
        fns["torch out="] = lambda: kernel(g_dy, out=g_dx)
    except ImportError:
        pass
    return fns


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m dsl.cli.bench.calls", description=__doc__)
    p.add_argument("--shape", default="8,64,112,112", help="N,C,H,W of the pooled input")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--repeat", type=int, default=15, help="alternating samples (median)")
    p.add_argument("--min-time", type=float, default=0.05, help="seconds per sample")
    args = p.parse_args(argv)
    from dsl.cli.bench.runner import measure_alternating

    shape = tuple(int(v) for v in args.shape.split(","))
    kernel = _kernel(shape, args.dtype)
    fns = candidates(kernel, args.dtype)
    times = dict(zip(fns, measure_alternating(list(fns.values()), args.repeat, args.min_time)))
    raw = times["raw (kernel.func)"]
    mb = 1.25 * 4 * (shape[0] * shape[1] * shape[2] * shape[3]) / 1e6  # dx + dy/4, float32
    print(f"# {kernel.name}: avg_pool2d backward {shape} {args.dtype}, ~{mb:.0f} MB moved; "
          f"median of {args.repeat} alternating samples")
    for name, t in times.items():
        print(f"{name:<20s} {t * 1e6:10.1f} us  {t / raw:6.3f}x raw")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
