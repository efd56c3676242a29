"""``python -m dsl bench --plot FILE.png``: ours vs PyTorch, GFLOP/s per workload, as a picture.

One horizontal bar pair per benchmark row (ours, PyTorch), grouped by suite and kind; a second
axis gives the same scale as a percentage of the machine's estimated fp32 peak::

    peak GFLOP/s = threads * (vector_bits / 32) lanes * 2 (FMA) * 2 (FMA pipes) * GHz

(two FMA pipes per core, as on every AVX2/AVX-512 x86 core this project targets; the clock is
the maximum from cpufreq, else the current "cpu MHz" of /proc/cpuinfo; no clock, no percent
axis). Needs matplotlib (``pip install -e ".[plot]"``).
"""

from __future__ import annotations

import os

FMA_PIPES = 2


def cpu_ghz() -> float | None:
    """The CPU clock in GHz (cpufreq maximum, else /proc/cpuinfo), or None."""
    try:
        with open("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq") as f:
            return int(f.read().strip()) / 1e6
    except (OSError, ValueError):
        pass
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("cpu MHz"):
                    return float(line.split(":", 1)[1]) / 1e3
    except (OSError, ValueError):
        pass
    return None


def peak_gflops(vector_bits: int, threads: int, ghz: float | None = None) -> float | None:
    """Estimated fp32 peak of ``threads`` cores (module docstring), or None without a clock."""
    ghz = cpu_ghz() if ghz is None else ghz
    if not ghz:
        return None
    return threads * (vector_bits // 32) * 2 * FMA_PIPES * ghz


def plot_rows(rows: list[dict], path: str, machine: dict | None = None) -> str:
    """Draw ``rows`` (as :func:`dsl.cli.bench.runner.run` returns them) into ``path``.

    Rows that failed are left out. Returns ``path``. Raises ImportError (with the install
    hint) when matplotlib is missing.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError("bench --plot needs matplotlib: pip install -e '.[plot]'") from exc
    machine = machine or {}
    ok = [r for r in rows if not r.get("error") and r.get("ours_gflops")]
    labels = [f"{r['suite']}/{r['name']} {r['kind']}" for r in ok]
    ours = [r["ours_gflops"] for r in ok]
    peer = [r.get("peer_gflops") or 0.0 for r in ok]
    fig, ax = plt.subplots(figsize=(9, 1.4 + 0.32 * max(len(ok), 1)), dpi=80)
    ys = range(len(ok))
    ax.barh([y - 0.2 for y in ys], ours, height=0.4, label="ours (dsl)", color="tab:blue")
    if any(peer):
        ax.barh([y + 0.2 for y in ys], peer, height=0.4, label="PyTorch", color="tab:orange")
    ax.set_yticks(list(ys), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("GFLOP/s (higher is better)")
    ax.legend(loc="lower right", fontsize=8)
    peak = peak_gflops(machine.get("vector_bits") or 256, machine.get("threads") or 1)
    if peak:
        top = ax.secondary_xaxis("top", functions=(lambda g: 100 * g / peak,
                                                   lambda p: p * peak / 100))
        top.set_xlabel(f"% of estimated fp32 peak ({peak:.0f} GFLOP/s)", fontsize=8)
    fig.suptitle(f"dsl vs PyTorch: {machine.get('cpu', 'CPU')}, "
                 f"{machine.get('threads', '?')} threads, load {machine.get('load_avg', '?')}",
                 fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
