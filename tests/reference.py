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
    ho*sh + kh*dh, wo*sw + kw*dw] over the terms whose x element is real (not padding),
    float64."""
    x = np.asarray(x, np.float64)
    dy = np.asarray(dy, np.float64)
    cout, cin_g, kh, kw = w_shape
    (sh, sw), (dh, dw) = stride, dilation
    _, _, ho, wo = dy.shape
    cout_g = cout // groups
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], max(pads[1], 0) + sh * ho + dh * kh),
                    (pads[2], max(pads[3], 0) + sw * wo + dw * kw)))
    h, wd = x.shape[2:]
    dw_ = np.zeros(w_shape)
    for g in range(groups):
        xs = xp[:, g * cin_g:(g + 1) * cin_g]
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i * dh:i * dh + sh * (ho - 1) + 1:sh,
                           j * dw:j * dw + sw * (wo - 1) + 1:sw]
                # only (ho, wo) whose tap reads a real x element: the padding is not
                # multiplied in (a NaN / inf dy never meets it)
                rows = np.arange(ho) * sh - pads[0] + i * dh
                cols = np.arange(wo) * sw - pads[2] + j * dw
                real = ((rows >= 0) & (rows < h))[:, None] & ((cols >= 0) & (cols < wd))[None]
                dys = np.where(real, dy[:, g * cout_g:(g + 1) * cout_g], 0.0)
                dw_[g * cout_g:(g + 1) * cout_g, :, i, j] = np.einsum("nohw,nchw->oc", dys, patch)
    return dw_


def round_hf32(a):
    """float32 -> HF32 (10 explicit mantissa bits, round-to-nearest-even), as float32.

    Bit arithmetic in numpy, independent of the kernels: inf / NaN are returned unchanged."""
    a = np.ascontiguousarray(np.asarray(a, np.float32))
    bits = a.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0xFFF + ((bits >> 13) & 1)) & 0xFFFFE000).astype(np.uint32)
    special = (bits & 0x7F800000) == 0x7F800000
    out = np.where(special, bits.astype(np.uint32), rounded)
    return out.view(np.float32)


def _contract(a, b):
    """``sum_{n, spatial} a[n, i, ...] * b[n, j, ...]`` -> ``[i, j]``."""
    red = [0, *range(2, a.ndim)]
    return np.tensordot(a, b, axes=(red, red))


def convolution_backward(grad_output, x, w, stride, pads, dilation, transposed,
                         output_padding, groups):
    """(grad_input, grad_weight, grad_bias) of an N-d convolution in float64, from the math.

    ``pads`` is one ``(before, after)`` pair per spatial axis. Plain forward (``w`` is
    ``[Cout, Cin/g, *k]``): ``y[n, co, o] = sum x[n, g*Cin_g+ci, o*s - pb + k*d] w[co, ci, k]``.
    Transposed forward (``w`` is ``[Cin, Cout/g, *k]``): ``x[n, ci, i]`` scatters into
    ``y_full[n, g*Cout_g+co, i*s + k*d]`` with weight ``w[ci, co, k]``, and ``y`` is
    ``y_full[pb : pb + So]`` (rows past ``y_full`` are zero). Both are written per kernel tap
    with strided slices; the plain grad_input is in scatter form.
    """
    import itertools

    dy = np.asarray(grad_output, np.float64)
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    ks = w.shape[2:]
    db = dy.sum(axis=(0, *range(2, dy.ndim)))

    def tap_slices(k, count):
        return tuple(slice(kk * d, kk * d + s * (c - 1) + 1, s)
                     for kk, d, s, c in zip(k, dilation, stride, count))

    def real(k, count, offsets, sizes):
        """Which of the ``count`` rows tap ``k`` reads are real data (not padding), as a
        broadcastable ``[1, 1, *count]`` mask: padding is skipped, never multiplied in."""
        m = np.ones((1, 1), bool)
        for kk, d, s, c, off, n in zip(k, dilation, stride, count, offsets, sizes):
            rows = np.arange(c) * s + kk * d
            m = m[..., None] & ((rows >= off) & (rows < off + n))
        return m

    if not transposed:
        cout, cin_g = w.shape[:2]
        cout_g = cout // groups
        so = dy.shape[2:]
        full = [max(n + pb + pa, s * (o - 1) + d * (k - 1) + 1)
                for n, (pb, pa), s, o, d, k in zip(x.shape[2:], pads, stride, so, dilation, ks)]
        xp = np.zeros((*x.shape[:2], *full))
        xp[(slice(None), slice(None), *(slice(pb, pb + n) for (pb, _), n in
                                         zip(pads, x.shape[2:])))] = x
        dxp = np.zeros_like(xp)
        dw = np.zeros(w.shape)
        for g in range(groups):
            cs, os_ = slice(g * cin_g, (g + 1) * cin_g), slice(g * cout_g, (g + 1) * cout_g)
            for k in itertools.product(*(range(kk) for kk in ks)):
                sl = (slice(None), cs, *tap_slices(k, so))
                dxp[sl] += np.einsum("no...,oc->nc...", dy[:, os_], w[(os_, slice(None), *k)])
                ok = real(k, so, [pb for pb, _ in pads], x.shape[2:])
                dw[(os_, slice(None), *k)] = _contract(np.where(ok, dy[:, os_], 0.0), xp[sl])
        dx = dxp[(slice(None), slice(None), *(slice(pb, pb + n) for (pb, _), n in
                                               zip(pads, x.shape[2:])))]
        return dx, dw, db

    cin, cout_g = w.shape[:2]
    cin_g = cin // groups
    si, so = x.shape[2:], dy.shape[2:]
    for i, o, s, (pb, pa), d, k, op in zip(si, so, stride, pads, dilation, ks, output_padding):
        assert o == (i - 1) * s - pb - pa + d * (k - 1) + op + 1, "inconsistent test shapes"
    full = [max(s * (i - 1) + d * (k - 1) + 1, pb + o)
            for s, i, d, k, (pb, _), o in zip(stride, si, dilation, ks, pads, so)]
    dyp = np.zeros((*dy.shape[:2], *full))
    dyp[(slice(None), slice(None), *(slice(pb, pb + o) for (pb, _), o in zip(pads, so)))] = dy
    dx = np.zeros(x.shape)
    dw = np.zeros(w.shape)
    for g in range(groups):
        cs, os_ = slice(g * cin_g, (g + 1) * cin_g), slice(g * cout_g, (g + 1) * cout_g)
        for k in itertools.product(*(range(kk) for kk in ks)):
            patch = dyp[(slice(None), os_, *tap_slices(k, si))]
            ok = real(k, si, [pb for pb, _ in pads], so)
            dx[:, cs] += np.where(ok, np.einsum("no...,co->nc...", patch,
                                                w[(cs, slice(None), *k)]), 0.0)
            dw[(cs, slice(None), *k)] = _contract(np.where(ok, x[:, cs], 0.0), patch)
    return dx, dw, db


def avg_pool2d_out_size(n_in, kernel, stride, pad, ceil_mode):
    """Pooled size of one axis as PyTorch defines it (dilation 1): ceil or floor of
    (n_in + 2*pad - kernel) / stride, plus one; in ceil mode a last window that would start
    at or past n_in + pad (entirely in the right padding) is dropped."""
    span = n_in + 2 * pad - kernel
    if span < 0:
        return 0
    n_out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (n_out - 1) * stride >= n_in + pad:
        n_out -= 1
    return n_out


def avg_pool2d_backward(dy, x_shape, kernel, stride, pad, ceil_mode, count_include_pad,
                        divisor_override):
    """dx of avg_pool2d in NCHW or CHW, float64, scatter form: each window (oh, ow) pushes
    dy[..., oh, ow] / divisor into the input rows/columns it covers. kernel/stride/pad are
    (H, W) pairs; divisor_override 0 means none. Windows end at min(start + k, size + pad);
    with count_include_pad the divisor is that padded extent, else only the in-input part."""
    dy = np.asarray(dy, np.float64)
    h, w = x_shape[-2:]
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, pad
    dx = np.zeros(x_shape)
    for oh in range(dy.shape[-2]):
        h0 = oh * sh - ph
        h1 = min(h0 + kh, h + ph)
        for ow in range(dy.shape[-1]):
            w0 = ow * sw - pw
            w1 = min(w0 + kw, w + pw)
            hs, he, ws, we = max(h0, 0), min(h1, h), max(w0, 0), min(w1, w)
            if divisor_override:
                div = divisor_override
            elif count_include_pad:
                div = (h1 - h0) * (w1 - w0)
            else:
                div = (he - hs) * (we - ws)
            dx[..., hs:he, ws:we] += (dy[..., oh, ow] / div)[..., None, None]
    return dx


def deconv_grad_filter(dy, x, kernel, stride, pad, dilation, group):
    """dW[g, oc, kh, kw, ic] of the NHWC transposed conv (DeconvGradFilter), float64.

    Forward: ``y[b, ih*sh - pad_u + kh*dh, iw*sw - pad_l + kw*dw, g*OCg + oc] +=
    x[b, ih, iw, g*ICg + ic] * W[g, oc, kh, kw, ic]``, taps outside ``y`` dropped; so per tap
    the gradient pairs every x position whose target lands inside dy with that dy element.
    """
    dy = np.asarray(dy, np.float64)
    x = np.asarray(x, np.float64)
    _, in_h, in_w, in_c = x.shape
    _, out_h, out_w, out_c = dy.shape
    (kh_, kw_), (sh, sw), (pu, pl), (dh, dw) = kernel, stride, pad, dilation
    icg, ocg = in_c // group, out_c // group
    res = np.zeros((group, ocg, kh_, kw_, icg))
    for i in range(kh_):
        oh = np.arange(in_h) * sh - pu + i * dh
        vh = (oh >= 0) & (oh < out_h)
        for j in range(kw_):
            ow = np.arange(in_w) * sw - pl + j * dw
            vw = (ow >= 0) & (ow < out_w)
            xs = x[:, vh][:, :, vw]
            ys = dy[:, oh[vh]][:, :, ow[vw]]
            for g in range(group):
                res[g, :, i, j, :] = np.einsum("bhwo,bhwi->oi", ys[..., g * ocg:(g + 1) * ocg],
                                               xs[..., g * icg:(g + 1) * icg])
    return res
