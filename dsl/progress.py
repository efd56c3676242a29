"""Progress of long loops (benchmark workloads, tuning trials), one look for every command.

On a terminal a :mod:`tqdm` bar redraws in place. Anywhere else (a CI log, a pipe, a file,
pytest's capture) redrawing would leave carriage returns and half-lines behind, so each step
prints one whole line instead::

    [tune dx] 4/64 trials  best 12.30 GFLOP/s  ETA 01:12

Progress goes to stderr by default: stdout carries the results (a table, or JSON with
``--json -``).
"""

from __future__ import annotations

import math
import sys
import time


def is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def _clock(seconds: float) -> str:
    if math.isnan(seconds) or math.isinf(seconds):
        return "--:--"
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else \
        f"{s // 60:02d}:{s % 60:02d}"


class Steps:
    """Progress over ``total`` steps of ``unit`` labelled ``desc``.

    Parameters
    ----------
    total : int
        Steps expected (the bar's length; the ETA assumes steps of equal cost).
    desc : str
        Label, e.g. ``"[tune dx]"`` or ``"[bench]"``.
    unit : str
        What a step is ("trial", "workload"); plural gets an ``s``.
    stream : file, optional
        Where progress goes (default ``sys.stderr``).
    enabled : bool
        False: print nothing (``dsl.tune(progress=False)``).
    """

    def __init__(self, total: int, desc: str, *, unit: str = "step", stream=None,
                 enabled: bool = True):
        self.total, self.desc, self.unit = max(0, int(total)), desc, unit
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.done, self.text, self.t0 = 0, "", time.perf_counter()
        self._bar = None
        if enabled and is_terminal(self.stream):
            from tqdm import tqdm

            self._bar = tqdm(total=self.total, desc=desc, unit=unit, file=self.stream,
                             dynamic_ncols=True, leave=True)

    def update(self, n: int = 1, text: str = "") -> None:
        """``n`` more steps are done; ``text`` describes the latest (e.g. the best so far)."""
        self.done += n
        self.text = text
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=False)
            self._bar.update(n)
        else:
            self.stream.write(self.line() + "\n")
            self.stream.flush()

    def note(self, message: str) -> None:
        """A whole line of its own (above the bar on a terminal)."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(message, file=self.stream)
        else:
            self.stream.write(message + "\n")
            self.stream.flush()

    def eta(self) -> float:
        """Seconds left, assuming the remaining steps cost what the done ones did."""
        if not self.done:
            return float("nan")
        return (time.perf_counter() - self.t0) / self.done * max(0, self.total - self.done)

    def line(self) -> str:
        unit = self.unit if self.total == 1 else self.unit + "s"
        text = f"  {self.text}" if self.text else ""
        return f"{self.desc} {self.done}/{self.total} {unit}{text}  ETA {_clock(self.eta())}"

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Steps:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
