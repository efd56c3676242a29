"""Float64 references, written directly from the math; one per operator.

These never import the project's computes: dx is written in scatter form (each dy element
pushes into the input positions it came from), the opposite of the kernels' gather form.
"""

from __future__ import annotations

import numpy as np


def conv2d_backprop_input(dy, w, x_shape, stride, pads, dilation, groups):
    """dx[n, g*Cin_g+ci, ho*sh - top + kh*dh, wo*sw - left + kw*dw] +=
    dy[n, g*Cout_g+co, ho, wo] * w[g*Cout_g+co, ci, kh, kw] (scatter form), float64."""
    dy = np.asarray(dy, np.float64)
    w = np.asarray(w, np.float64)
    n, cin, h, wd = x_shape
    cout, cin_g, kh, kw = w.shape
    (sh, sw), (dh, dw) = stride, dilation
    _, _, ho, wo = dy.shape
    cout_g = cout // groups
    hp = max(h + pads[0] + pads[1], sh * (ho - 1) + dh * (kh - 1) + 1)
    wp = max(wd + pads[2] + pads[3], sw * (wo - 1) + dw * (kw - 1) + 1)
    dxp = np.zeros((n, cin, hp, wp))
    for g in range(groups):
        dys = dy[:, g * cout_g:(g + 1) * cout_g]
        ws = w[g * cout_g:(g + 1) * cout_g]
        for i in range(kh):
            for j in range(kw):
                dxp[:, g * cin_g:(g + 1) * cin_g, i * dh:i * dh + sh * (ho - 1) + 1:sh,
                    j * dw:j * dw + sw * (wo - 1) + 1:sw] += np.einsum(
                        "nohw,oc->nchw", dys, ws[:, :, i, j])
    return dxp[:, :, pads[0]:pads[0] + h, pads[2]:pads[2] + wd]


def conv2d_backprop_filter(x, dy, w_shape, stride, pads, dilation, groups):
    """dW[co, ci, kh, kw] = sum_{n,ho,wo} dy[n,co,ho,wo] * xpad[n, g*Cin_g+ci,
    ho*sh + kh*dh, wo*sw + kw*dw], float64."""
    x = np.asarray(x, np.float64)
    dy = np.asarray(dy, np.float64)
    cout, cin_g, kh, kw = w_shape
    (sh, sw), (dh, dw) = stride, dilation
    _, _, ho, wo = dy.shape
    cout_g = cout // groups
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], max(pads[1], 0) + sh * ho + dh * kh),
                    (pads[2], max(pads[3], 0) + sw * wo + dw * kw)))
    dw_ = np.zeros(w_shape)
    for g in range(groups):
        xs = xp[:, g * cin_g:(g + 1) * cin_g]
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i * dh:i * dh + sh * (ho - 1) + 1:sh,
                           j * dw:j * dw + sw * (wo - 1) + 1:sw]
                dw_[g * cout_g:(g + 1) * cout_g, :, i, j] = np.einsum(
                    "nohw,nchw->oc", dy[:, g * cout_g:(g + 1) * cout_g], patch)
    return dw_
