"""Convolution geometries shared by the dx and dw tests (small shapes: the suite stays fast)."""


def C(n, cin, cout, h, w, k, stride, pads, dil, groups):
    kh, kw = (k, k) if isinstance(k, int) else k
    s = (stride, stride) if isinstance(stride, int) else stride
    d = (dil, dil) if isinstance(dil, int) else dil
    return {"n": n, "cin": cin, "cout": cout, "h": h, "w": w, "kh": kh, "kw": kw,
            "stride": s, "pads": pads, "dil": d, "groups": groups}


CONV_CASES = [
    C(1, 16, 16, 7, 7, 1, 1, (0, 0, 0, 0), 1, 1),       # the seed example
    C(2, 20, 24, 8, 9, 3, 1, (1, 1, 1, 1), 1, 1),       # C not multiple of 16, batch 2
    C(1, 16, 32, 9, 10, 3, 2, (1, 0, 0, 1), 1, 1),      # stride 2, asymmetric pad
    C(1, 8, 12, 13, 12, (3, 2), (3, 2), (2, 1, 0, 2), 2, 1),  # stride 3, dilation 2
    C(1, 3, 16, 15, 15, 7, 2, (3, 3, 3, 3), 1, 1),      # 7x7 stem-like
    C(2, 32, 48, 8, 8, 1, 2, (0, 0, 0, 0), 1, 1),       # 1x1 stride 2 projection
    C(1, 16, 16, 11, 11, 3, 2, (2, 2, 2, 2), 2, 1),     # gcd(stride, dilation) > 1
    C(1, 32, 32, 6, 6, 3, 1, (1, 1, 1, 1), 1, 8),       # ResNeXt-like, multiple_extend 4
    C(2, 24, 24, 7, 7, 3, 2, (1, 1, 1, 1), 1, 24),      # depthwise, g_extend 2
    C(1, 8, 16, 6, 6, 3, 1, (0, 1, 1, 0), 1, 8),        # depthwise multiplier 2
    C(1, 12, 20, 5, 5, 2, 1, (0, 0, 0, 0), (2, 1), 4),  # Cin_g 3, Cout_g 5
    C(1, 20, 20, 5, 5, 3, 1, (1, 1, 1, 1), 1, 20),      # depthwise, partial last ext group
    C(1, 6, 4, 5, 7, 3, 3, (1, 2, 0, 1), 1, 2),         # stride 3, tiny grouped
]
