"""Calls of ``dsl.aclnn.convolution_backward`` described as geometry dicts, their data and
their float64 reference: shared by the tests of the API and of its schedule."""

import numpy as np

import dsl
import dsl.api.aclnn

from helpers import rand
from reference import convolution_backward as ref_cb

ALL = (True, True, True)


def geometry(nd, n, cin, cout, size, k, stride=1, pad=0, dil=1, groups=1, transposed=False,
             opad=0):
    """A call as a dict; scalars broadcast over the ``nd`` spatial axes; ``pad`` may be a
    list of (before, after) pairs."""
    def vec(v):
        return tuple(v) if isinstance(v, (tuple, list)) else (v,) * nd

    size, k, stride, dil, opad = map(vec, (size, k, stride, dil, opad))
    pads = tuple(pad) if isinstance(pad, list) else tuple((p, p) for p in vec(pad))
    if transposed:
        out = tuple((i - 1) * s - pb - pa + d * (kk - 1) + op + 1
                    for i, s, (pb, pa), d, kk, op in zip(size, stride, pads, dil, k, opad))
        w = (cin, cout // groups, *k)
    else:
        out = tuple((i + pb + pa - d * (kk - 1) - 1) // s + 1
                    for i, s, (pb, pa), d, kk in zip(size, stride, pads, dil, k))
        w = (cout, cin // groups, *k)
    return {"nd": nd, "x": (n, cin, *size), "w": w, "dy": (n, cout, *out), "stride": stride,
            "pads": pads, "dil": dil, "groups": groups, "transposed": transposed,
            "opad": opad, "cout": cout}


def gid(c):
    return "{}d{}_x{}_w{}_s{}_p{}_d{}_op{}_g{}".format(
        c["nd"], "T" if c["transposed"] else "", "x".join(map(str, c["x"][1:])),
        "x".join(map(str, c["w"][2:])), "".join(map(str, c["stride"])),
        "".join(f"{a}{b}" for a, b in c["pads"]), "".join(map(str, c["dil"])),
        "".join(map(str, c["opad"])), c["groups"])


def padding_arg(c):
    """The API's padding: per-axis when symmetric, else the 2-D [top, bottom, left, right]."""
    if all(a == b for a, b in c["pads"]):
        return [a for a, _ in c["pads"]]
    assert c["nd"] == 2
    return [v for pair in c["pads"] for v in pair]


def data(c, dtypes=("float32",) * 3, seed=0):
    rng = np.random.default_rng(seed)
    return (rand(rng, c["dy"], dtypes[0]), rand(rng, c["x"], dtypes[1]),
            rand(rng, c["w"], dtypes[2]))


def call(c, dy, x, w, mask=ALL, cmt=0):
    return dsl.aclnn.convolution_backward(
        dy, x, w, [c["cout"]], list(c["stride"]), padding_arg(c), list(c["dil"]),
        c["transposed"], list(c["opad"]), c["groups"], list(mask), cmt)


def reference(c, dy, x, w):
    return ref_cb(dy, x, w, c["stride"], c["pads"], c["dil"], c["transposed"], c["opad"],
                  c["groups"])
