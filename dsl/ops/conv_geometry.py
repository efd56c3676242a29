"""Geometry of one spatial axis of a convolution, shared by every conv-backward operator.

Forward convolution along one axis (input ``x`` of size ``n_in``, output ``y`` of ``n_out``)::

    y[o] = sum_k x[o*stride - pad_before + k*dilation] * w[k],   0 <= k < kernel
    n_out = (n_in + pad_before + pad_after - ((kernel-1)*dilation + 1)) // stride + 1

The weight gradient reads ``x`` at ``o*stride + k*dilation`` in a zero-padded copy of ``x``.
The input gradient is the adjoint: input position ``i`` receives from every ``(o, k)`` with
``o*stride = i + pad_before - k*dilation``. Only the taps ``k`` in one residue class modulo
``stride / gcd(stride, dilation)`` can satisfy that, so :meth:`ConvAxis.dx_taps` enumerates just
those: a strided dx does ``ceil(kernel / step)`` taps per position, not ``kernel`` (and never
multiplies zeros inserted between dy rows).

:meth:`ConvAxis.cropped` builds the same axis for a transposed convolution whose output was
cropped (``DeconvGradFilter``): there the read tensor is dy, taps outside it are dropped, and
``n_in`` is free as long as some tap lands inside.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dsl.errors import E_GEOMETRY_IN, E_GEOMETRY_OUT, fail


@dataclass(frozen=True)
class ConvAxis:
    """One spatial axis: sizes, kernel, stride, padding, dilation (all plain ints)."""

    n_in: int
    n_out: int
    kernel: int
    stride: int
    pad_before: int
    pad_after: int
    dilation: int

    @staticmethod
    def out_size(n_in, kernel, stride, pad_before, pad_after, dilation) -> int:
        return (n_in + pad_before + pad_after - ((kernel - 1) * dilation + 1)) // stride + 1

    @classmethod
    def checked(cls, axis: str, n_in: int, n_out: int, kernel: int, stride: int,
                pad_before: int, pad_after: int, dilation: int, *,
                out_param: str = "out_backprop") -> ConvAxis:
        """Build an axis, raising E60025 / E60024 when the sizes do not fit together."""
        span = (kernel - 1) * dilation + 1
        if n_in + pad_before + pad_after < span:
            raise fail(E_GEOMETRY_OUT, f"kernel {axis}", kernel,
                       f"dilated kernel extent {span} exceeds padded input {axis} "
                       f"{n_in}+{pad_before}+{pad_after}; shrink the kernel or dilation, or pad")
        expect = cls.out_size(n_in, kernel, stride, pad_before, pad_after, dilation)
        if n_out != expect:
            raise fail(E_GEOMETRY_IN, f"{out_param} {axis}", n_out,
                       f"must be (in + pad_before + pad_after - ((k-1)*dilation+1)) // stride + 1"
                       f" = ({n_in} + {pad_before} + {pad_after} - {span}) // {stride} + 1"
                       f" = {expect}")
        return cls(n_in, n_out, kernel, stride, pad_before, pad_after, dilation)

    @classmethod
    def cropped(cls, axis: str, n_in: int, n_out: int, kernel: int, stride: int,
                pad_before: int, dilation: int, *, in_param: str) -> ConvAxis:
        """An axis whose taps outside ``[0, n_in)`` are dropped instead of forcing ``n_out``.

        Position ``o*stride - pad_before + k*dilation`` of the read tensor (size ``n_in``) is
        used when it lies in ``[0, n_in)`` and read as zero otherwise, for every
        ``0 <= o < n_out``; this is a transposed convolution whose output (size ``n_in`` here)
        was cropped, as in ``DeconvGradFilter``. ``pad_after`` is whatever makes the padded
        tensor cover every tap. Raises E60025 naming ``in_param`` when no tap lands inside.
        """
        for k in range(kernel):
            lo = pad_before - k * dilation  # o*stride must be in [lo, lo + n_in)
            o = max(0, -(-lo // stride))
            if o < n_out and o * stride < lo + n_in:
                break
        else:
            raise fail(E_GEOMETRY_OUT, in_param, n_in,
                       f"no tap o*stride - pad + k*dilation (o < {n_out}, k < {kernel}, "
                       f"stride {stride}, pad {pad_before}, dilation {dilation}) lands in "
                       f"[0, {n_in}) along {axis}; every contribution would be dropped")
        span = (n_out - 1) * stride + (kernel - 1) * dilation + 1
        return cls(n_in, n_out, kernel, stride, pad_before,
                   max(0, span - n_in - pad_before), dilation)

    # --- weight gradient / forward: x read at o*stride + k*dilation of padded x --------------
    @property
    def tap_extent(self) -> int:
        """Rows of the padded x that some ``o*stride + k*dilation`` reads (a prefix of it)."""
        return (self.n_out - 1) * self.stride + (self.kernel - 1) * self.dilation + 1

    @property
    def x_padded_size(self) -> int:
        """Length of the zero-padded x that every ``o*stride + k*dilation`` indexes."""
        return max(self.n_in + self.pad_before,
                   (self.n_out - 1) * self.stride + (self.kernel - 1) * self.dilation + 1)

    # --- input gradient: taps that hit input position i ----------------------------------------
    @property
    def tap_step(self) -> int:
        """Distance between consecutive taps ``k`` that hit the same input position."""
        return self.stride // math.gcd(self.stride, self.dilation)

    @property
    def n_taps(self) -> int:
        """Taps enumerated per input position: ``ceil(kernel / tap_step)``."""
        return -(-self.kernel // self.tap_step)

    @property
    def padded_kernel(self) -> int:
        """Kernel extent rounded up to a multiple of ``tap_step`` (the extra taps are zero)."""
        return self.n_taps * self.tap_step

    @property
    def dy_pad_before(self) -> int:
        """Zero rows dy needs before row 0 so every enumerated tap reads in bounds."""
        lowest = -((self.padded_kernel - 1) * self.dilation - self.pad_before)
        return max(0, -(lowest // self.stride))

    @property
    def dy_padded_size(self) -> int:
        highest = (self.n_in - 1 + self.pad_before) // self.stride
        return self.dy_pad_before + max(self.n_out, highest + 1)

    def dx_taps(self, i, j):
        """For input position ``i`` and tap number ``j`` (``0 <= j < n_taps``): the kernel tap
        ``k`` and the row of the *padded* dy it reads, plus a condition (None when always true)
        that is False where no tap of that residue exists (only when gcd(stride, dilation) > 1).

        Works on ints and TE expressions (``//`` and ``%`` are floor operations in both).
        """
        s, d, step = self.stride, self.dilation, self.tap_step
        gsd = s // step
        t = i + self.pad_before
        if step == 1:
            k0 = 0
        else:
            inv = pow(d // gsd, -1, step)  # d/gsd is invertible modulo step
            k0 = ((t // gsd) * inv) % step
        k = k0 + j * step
        row = (t - k * d) // s + self.dy_pad_before
        cond = None if gsd == 1 else (t % gsd == 0)
        return k, row, cond


def clamp_index(i, n: int):
    """Index ``i`` (a TE expression) clamped into ``[0, n)``: a read of padding that a select
    discards still stays in bounds (a vectorised select may evaluate both arms)."""
    from tvm import te

    return te.max(te.min(i, n - 1), 0)
