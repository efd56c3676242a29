"""Independent checks of gradient kernels, for examples and users: the adjoint identity.

A kernel that claims to compute dx = J^T dy (or dW) of a convolution y = conv(x, W) must
satisfy, for any probe v,

    <dx, v> = <dy, conv(v, W)>          and          <dW, V> = <dy, conv(x, V)>

This needs only a float64 *forward* convolution, so it checks the backward kernels without a
second implementation of them. The returned error is relative to ``|lhs| + |rhs|`` plus the
norms, so it is comparable across shapes.
"""

from __future__ import annotations

import numpy as np


def conv2d_forward(x, w, stride, pads, dilation, groups):
    """``y = conv2d(x, w)`` in NCHW, float64. ``pads = (top, bottom, left, right)``."""
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    _, _, h, wd = x.shape
    cout, cin_g, kh, kw = w.shape
    (sh, sw), (dh, dw) = stride, dilation
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[1]), (pads[2], pads[3])))
    ho = (h + pads[0] + pads[1] - ((kh - 1) * dh + 1)) // sh + 1
    wo = (wd + pads[2] + pads[3] - ((kw - 1) * dw + 1)) // sw + 1
    cout_g = cout // groups
    y = np.zeros((x.shape[0], cout, ho, wo))
    for g in range(groups):
        xs, ws = xp[:, g * cin_g:(g + 1) * cin_g], w[g * cout_g:(g + 1) * cout_g]
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i * dh:i * dh + sh * (ho - 1) + 1:sh,
                           j * dw:j * dw + sw * (wo - 1) + 1:sw]
                y[:, g * cout_g:(g + 1) * cout_g] += np.einsum("nchw,oc->nohw", patch,
                                                               ws[:, :, i, j])
    return y


def _adjoint_error(grad, probe_shape, dy, forward, probes: int, seed: int) -> float:
    """Largest relative violation of ``<grad, v> = <dy, forward(v)>`` over random probes."""
    rng = np.random.default_rng(seed)
    grad, dy = np.asarray(grad, np.float64), np.asarray(dy, np.float64)
    worst = 0.0
    for _ in range(probes):
        v = rng.standard_normal(probe_shape)
        lhs, rhs = float((grad * v).sum()), float((dy * forward(v)).sum())
        scale = max(np.linalg.norm(grad) * np.linalg.norm(v), 1e-30)
        worst = max(worst, abs(lhs - rhs) / scale)
    return worst


def dx_adjoint_error(dx, dy, w, stride, pads, dilation, groups, probes=3, seed=0) -> float:
    """Largest relative violation of ``<dx, v> = <dy, conv(v, w)>`` over random probes."""
    return _adjoint_error(dx, np.shape(dx), dy,
                          lambda v: conv2d_forward(v, w, stride, pads, dilation, groups),
                          probes, seed)


def dw_adjoint_error(dw, x, dy, stride, pads, dilation, groups, probes=3, seed=0) -> float:
    """Largest relative violation of ``<dw, V> = <dy, conv(x, V)>`` over random probes."""
    return _adjoint_error(dw, np.shape(dw), dy,
                          lambda v: conv2d_forward(x, v, stride, pads, dilation, groups),
                          probes, seed)
