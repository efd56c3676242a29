"""Train a small CNN on scikit-learn's digits with the backward on dsl kernels (dsl.pytorch).

The model has a conv2d, a grouped conv2d, a transposed conv2d and average pooling. It trains
for 50 steps twice from the same seed: once native PyTorch, once after
``dsl.pytorch.convert(model)`` (the forward stays PyTorch's, every convolution and pooling
backward runs this project's aclnn kernels). The two loss curves must agree within 1e-4
relative at every step; the held-out accuracy and the median step time of each run are printed.

    python examples/train_cnn.py --plot docs/train_cnn_loss.png   # also draws the two curves

Needs torch and scikit-learn (``pip install -e ".[torch,plot]"``); without them
``python -m dsl examples`` reports it skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import statistics
import time

STEPS, BATCH, LR, SEED = 50, 256, 0.01, 0
LOSS_RTOL = 1e-4


def missing() -> str | None:
    """What this example needs and cannot import, or None."""
    import importlib.util

    for mod in ("torch", "sklearn"):
        if importlib.util.find_spec(mod) is None:
            return f"needs {mod} (pip install -e '.[torch]')"
    return None


def make_model():
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.Tanh(),                    # 8x8
        nn.Conv2d(8, 16, 3, padding=1, groups=4), nn.Tanh(),         # grouped, 8x8
        nn.AvgPool2d(2),                                             # 4x4
        nn.ConvTranspose2d(16, 8, 2, stride=2), nn.Tanh(),           # transposed, 8x8
        nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False),  # 4x4
        nn.Flatten(), nn.Linear(8 * 4 * 4, 10))


def data():
    """Digits as (N, 1, 8, 8) float32 in [0, 1]: 1497 train, 300 held-out images."""
    import torch
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(d.target, dtype=torch.long)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(SEED))
    x, y = x[perm], y[perm]
    return (x[300:], y[300:]), (x[:300], y[:300])


def train(models, train_set, steps: int):
    """Adam on fixed mini-batches, the models stepped in turn (so load from other processes
    hits each alike); returns (losses, step seconds) per model."""
    import torch

    x, y = train_set
    opts = [torch.optim.Adam(m.parameters(), lr=LR) for m in models]
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(SEED + 1))
    losses, times = [[] for _ in models], [[] for _ in models]
    for step in range(steps):
        idx = order[(step * BATCH) % (len(y) - BATCH):][:BATCH]
        for model, opt, ls, ts in zip(models, opts, losses, times):
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            ts.append(time.perf_counter() - t0)
            ls.append(loss.item())
    return losses, times


def accuracy(model, test_set) -> float:
    import torch

    x, y = test_set
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()


def plot_losses(path: str, native: list, ours: list) -> bool:
    """Both loss curves in one PNG; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.plot(range(1, len(native) + 1), native, label="native PyTorch backward", lw=3, alpha=.5)
    ax.plot(range(1, len(ours) + 1), ours, "--", label="dsl.pytorch backward (dsl kernels)")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy loss")
    ax.set_title("digits CNN: the two loss curves (same seed)")
    ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return True


@contextlib.contextmanager
def _cache_dir(parent: str | None):
    """dsl.pytorch keeps its kernels in the kernel cache; an explicit kernel_meta parent
    directory (``python -m dsl examples --kernel-meta-parent-dir``) takes its place."""
    old = os.environ.get("DSL_CACHE_DIR")
    if parent is not None:
        os.environ["DSL_CACHE_DIR"] = str(parent)
    try:
        yield
    finally:
        if parent is not None:
            if old is None:
                os.environ.pop("DSL_CACHE_DIR", None)
            else:
                os.environ["DSL_CACHE_DIR"] = old


def main(kernel_meta_parent_dir=None, steps: int = STEPS, plot: str | None = None) -> dict:
    why = missing()
    if why:
        return {"skipped": why}
    import torch

    import dsl.pytorch

    train_set, test_set = data()
    torch.manual_seed(SEED)
    native = make_model()
    ours = dsl.pytorch.convert(copy.deepcopy(native))
    calls = dsl.pytorch.STATS["convolution_backward"]
    with _cache_dir(kernel_meta_parent_dir):
        (n_native, n_ours), (t_native, t_ours) = train([native, ours], train_set, steps)
    if dsl.pytorch.STATS["convolution_backward"] - calls != 3 * steps:
        raise RuntimeError("train_cnn: the converted model did not run the dsl backward")
    err = max(abs(a - b) / abs(b) for a, b in zip(n_ours, n_native))
    if err > LOSS_RTOL:
        raise RuntimeError(f"train_cnn: loss curves differ by {err:.3g} relative (> 1e-4)")
    med_native = statistics.median(t_native[2:] or t_native)
    med_ours = statistics.median(t_ours[2:] or t_ours)
    acc_native, acc_ours = accuracy(native, test_set), accuracy(ours, test_set)
    print(f"train_cnn: {steps} steps, batch {BATCH}, {torch.get_num_threads()} threads; "
          f"final loss native {n_native[-1]:.4f}, dsl {n_ours[-1]:.4f}; held-out accuracy "
          f"native {acc_native:.3f}, dsl {acc_ours:.3f}; median step native "
          f"{med_native * 1e3:.2f} ms, dsl {med_ours * 1e3:.2f} ms "
          f"(native/dsl = {med_native / med_ours:.2f}x)")
    if plot and not plot_losses(plot, n_native, n_ours):
        print("train_cnn: matplotlib missing, no plot (pip install -e '.[plot]')")
    return {"kernel": "dsl.pytorch digits CNN", "build_s": t_ours[0] - med_ours,
            "run_s": med_ours, "error": err, "native_step_s": med_native,
            "accuracy": acc_ours, "losses": (n_native, n_ours)}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--plot", metavar="FILE.png", help="save both loss curves as a PNG")
    args = ap.parse_args()
    result = main(steps=args.steps, plot=args.plot)
    if "skipped" in result:
        raise SystemExit(f"train_cnn skipped: {result['skipped']}")
