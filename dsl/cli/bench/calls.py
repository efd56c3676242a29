"""``python -m dsl.cli.bench.calls``: what a call of a loaded kernel costs beyond the kernel.

Times, on one bandwidth-bound kernel (avg_pool2d backward, float32 by default), medians of
alternating samples (:func:`dsl.cli.bench.runner.measure_alternating`), each way of calling
next to ``kernel.func`` (the generated function alone) on the very same memory, so that only
the call differs:

* ``tvm``: TVM tensors (``tvm.runtime.tensor``); ``raw`` here is the baseline of every ratio;
* ``numpy``: numpy arrays 64-byte aligned (``k(dy)`` allocates its result so);
* ``numpy np.empty``: arrays from ``np.empty`` (numpy guarantees 16 bytes, so large arrays
  usually start 16 bytes past a 64-byte boundary);
* ``numpy +4 B``: views deliberately 4 bytes past a 64-byte boundary (the kernels assume only
  element alignment: any address runs in place);
* ``torch``: torch tensors;

With ``--per-call ROUNDS`` single calls are timed instead: each ``out=`` call takes turns with
``raw`` on the same memory, call by call, for ROUNDS rounds (a burst of load hits both alike),
and the median and the minimum of the single calls are printed: steadier than a few long
samples on a shared machine.

``out=`` is ``kernel(dy, out=dx)`` (the zero-copy path: DLPack, results written into ``dx``),
``bind`` is ``run = kernel.bind(dy, out=dx)`` made once, then ``run()`` (the arguments
checked and converted once), ``raw`` is ``kernel.func`` on DLPack views of the same arrays.
Also ``numpy alloc`` (``kernel(dy)``, allocating its result) and ``copying (old)``: what every
call did before the zero-copy path (inputs copied into TVM tensors, the result copied back
into numpy).
"""

from __future__ import annotations

import argparse
import functools


def _kernel(shape, dtype):
    from dsl.api.aclnn import avg_pool2d_backward_kernel

    n, c, h, w = shape
    return avg_pool2d_backward_kernel((n, c, h // 2, w // 2), dtype, shape, dtype, [2, 2], [],
                                      [0, 0], False, True, 0)


def _off_by(shape, dtype: str, offset: int):
    """An uninitialised C-contiguous numpy array starting ``offset`` bytes past a 64-byte
    boundary."""
    import math

    import numpy as np

    from dsl.runtime.kernel import _empty

    dt = np.dtype(dtype)
    buf = _empty((math.prod(shape) * dt.itemsize + offset,), "uint8", "numpy")
    return buf[offset:].view(dt).reshape(shape)


_KINDS = ("tvm", "numpy", "numpy np.empty", "numpy +4 B", "torch")


def _memories(dy, dx_shape, dtype: str) -> dict:
    """kind -> (dy, dx): the same data in each kind of memory the bench calls with."""
    import numpy as np
    import tvm

    from dsl.runtime.kernel import _empty

    mem = {"tvm": (tvm.runtime.tensor(dy), tvm.runtime.empty(dx_shape, dtype, tvm.cpu())),
           "numpy": (_empty(dy.shape, dtype, "numpy"), _empty(dx_shape, dtype, "numpy")),
           "numpy np.empty": (np.empty(dy.shape, dtype), np.empty(dx_shape, dtype)),
           "numpy +4 B": (_off_by(dy.shape, dtype, 4), _off_by(dx_shape, dtype, 4))}
    for kind in ("numpy", "numpy np.empty", "numpy +4 B"):
        mem[kind][0][...] = dy
    try:
        import torch

        mem["torch"] = (torch.from_numpy(dy.copy()),
                        torch.empty(dx_shape, dtype=getattr(torch, dtype)))
    except ImportError:
        pass
    return mem


def candidates(kernel, dtype: str) -> dict:
    """name -> zero-argument callable running the kernel once that way."""
    import numpy as np
    import tvm
    import tvm_ffi

    rng = np.random.default_rng(0)
    dy = rng.standard_normal(kernel.inputs[0]["shape"]).astype(dtype)
    dx_shape = tuple(kernel.outputs[0]["shape"])
    mem = _memories(dy, dx_shape, dtype)
    fns = {}
    for kind, (a, b) in mem.items():
        ra, rb = (a, b) if kind == "tvm" else (tvm_ffi.from_dlpack(a), tvm_ffi.from_dlpack(b))
        # a partial, not a lambda: no Python frame of ours around the raw call
        fns[f"raw {kind}"] = functools.partial(kernel.func, ra, rb)
        fns[f"{kind} out="] = lambda a=a, b=b: kernel(a, out=b)
        fns[f"{kind} bind"] = kernel.bind(a, out=b)
    fns["numpy alloc"] = lambda a=mem["numpy"][0]: kernel(a)
    dx = np.empty(dx_shape, dtype)

    def copying():
        out = tvm.runtime.tensor(np.empty(dx_shape, dtype))
        kernel.func(tvm.runtime.tensor(np.ascontiguousarray(dy)), out)
        dx[...] = out.numpy()

    fns["copying (old)"] = copying
    return fns


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m dsl.cli.bench.calls", description=__doc__)
    p.add_argument("--shape", default="8,64,112,112", help="N,C,H,W of the pooled input")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--repeat", type=int, default=15, help="alternating samples (median)")
    p.add_argument("--min-time", type=float, default=0.05, help="seconds per sample")
    p.add_argument("--per-call", type=int, default=0, metavar="ROUNDS",
                   help="time single calls, the ways taking turns call by call, ROUNDS rounds")
    args = p.parse_args(argv)
    import numpy as np

    shape = tuple(int(v) for v in args.shape.split(","))
    kernel = _kernel(shape, args.dtype)
    fns = candidates(kernel, args.dtype)
    # dx + dy (a quarter of dx's size)
    mb = 1.25 * np.dtype(args.dtype).itemsize * (shape[0] * shape[1] * shape[2] * shape[3]) / 1e6
    if args.per_call > 0:
        times = _per_call(fns, args.per_call)
        how = f"single calls in turn, {args.per_call} rounds: median (min)"
    else:
        from dsl.cli.bench.runner import measure_alternating

        times = {name: (t, None) for name, t in zip(fns, measure_alternating(
            list(fns.values()), args.repeat, args.min_time))}
        how = f"median of {args.repeat} alternating samples"
    print(f"# {kernel.name}: avg_pool2d backward {shape} {args.dtype}, ~{mb:.1f} MB moved; "
          f"{how}")
    _print(times)
    return 0


def _per_call(fns: dict, rounds: int) -> dict:
    """name -> (median, min) seconds of single calls: each way of calling takes turns with
    ``raw`` on the same memory (one memory at a time: turns across all of them let each way
    find the memory of another in cache or TLB), every timed call after an untimed one."""
    import statistics
    import time

    groups = [[n for n in (f"raw {kind}", f"{kind} out=", f"{kind} bind") if n in fns]
              for kind in _KINDS]
    groups += [[n] for n in fns if not any(n in g for g in groups)]
    out = {}
    for group in groups:
        samples: dict = {name: [] for name in group}
        for _ in range(rounds):
            for name in group:
                fns[name]()
                t0 = time.perf_counter()
                fns[name]()
                samples[name].append(time.perf_counter() - t0)
        out.update({name: (statistics.median(v), min(v)) for name, v in samples.items()})
    return {name: out[name] for name in fns}


def _print(times: dict) -> None:
    raw = times["raw tvm"][0]
    print(f"{'call':<22s} {'median':>10s}  {'vs raw tvm':>10s}  {'vs raw, same memory':>19s}")
    for name, (t, low) in times.items():
        kind = name.rsplit(" ", 1)[0]
        own = times.get(f"raw {kind}") if name.endswith((" out=", " bind")) else None
        mine = f"{t / own[0]:18.3f}x" if own else " " * 19
        extra = f"   (min {low * 1e6:.1f} us)" if low is not None else ""
        print(f"{name:<22s} {t * 1e6:7.1f} us  {t / raw:9.3f}x  {mine}{extra}")


if __name__ == "__main__":
    raise SystemExit(main())
