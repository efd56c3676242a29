"""Parsing and checking of the TBE ``para_dict`` shared by the cube backprop operators."""

from __future__ import annotations

import re
from dataclasses import dataclass

from dsl.errors import E_NAME, E_RANGE, E_TYPE, E_VALUE, check_dtype, check_int, check_ints, fail

KERNEL_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
KERNEL_NAME_MAX = 200
# Strides, pads and dilations enter the index arithmetic as 32-bit TIR constants. TBE's own
# bounds (strides <= 63: the Ascend load3d instruction; pads, dilations <= 255) are limits of
# the chip, not of the math, and are not copied; the geometry checks refuse what is inconsistent.
PARAM_MAX = 2**31 - 1


def check_kernel_name(param: str, name: object) -> str:
    """A name that is safe as a file stem and a C symbol: ``^[A-Za-z_][A-Za-z0-9_]*$``, <= 200."""
    if not isinstance(name, str):
        raise fail(E_NAME, param, name, "must be a str")
    if len(name) > KERNEL_NAME_MAX:
        raise fail(E_NAME, param, name, f"must be at most {KERNEL_NAME_MAX} characters")
    if not KERNEL_NAME_RE.fullmatch(name):  # not match(): "$" also matches before a final "\n"
        raise fail(E_NAME, param, name,
                   "must match ^[A-Za-z_][A-Za-z0-9_]*$ (letters, digits, underscore; no paths)")
    return name


@dataclass(frozen=True)
class Conv2dPara:
    """A checked ``para_dict``: spatial parameters in (H, W) order."""

    strides: tuple[int, int]
    pads: tuple[int, int, int, int]  # top, bottom, left, right
    dilations: tuple[int, int]
    res_dtype: str
    kernel_name: str
    extras: dict

    def as_json(self) -> dict:
        return {"strides": list(self.strides), "padding": list(self.pads),
                "dilations": [1, 1, *self.dilations], "res_dtype": self.res_dtype,
                "kernel_name": self.kernel_name, **self.extras}


def parse_conv2d_para(para_dict: object, *, op: str, allowed: tuple[str, ...],
                      default_res_dtype: str,
                      res_dtypes: tuple[str, ...] = ("float16", "float32")) -> Conv2dPara:
    """Check the keys common to conv2d_backprop_input / _filter. Unknown keys are refused so a
    typo (``"stride"``) cannot silently fall back to a default."""
    if not isinstance(para_dict, dict):
        raise fail(E_TYPE, "para_dict", para_dict, "must be a dict")
    known = ("strides", "padding", "dilations", "res_dtype", "kernel_name", *allowed)
    for key in para_dict:
        if key not in known:
            raise fail(E_VALUE, f"para_dict['{key}']", para_dict[key],
                       f"is not a parameter of {op}; allowed keys: {', '.join(known)}")
    strides = check_ints("para_dict['strides']", para_dict.get("strides", (1, 1)), 2, lo=1,
                         hi=PARAM_MAX)
    pads = check_ints("para_dict['padding']", para_dict.get("padding", (0, 0, 0, 0)), 4, lo=0,
                      hi=PARAM_MAX)
    dil = check_ints("para_dict['dilations']", para_dict.get("dilations", (1, 1, 1, 1)), 4,
                     lo=1, hi=PARAM_MAX)
    if dil[0] != 1 or dil[1] != 1:
        raise fail(E_RANGE, "para_dict['dilations']", list(dil),
                   "must be [1, 1, dilation_h, dilation_w]: N and C dilations are 1")
    res_dtype = check_dtype("para_dict['res_dtype']",
                            para_dict.get("res_dtype", default_res_dtype), res_dtypes)
    kernel_name = check_kernel_name("para_dict['kernel_name']",
                                    para_dict.get("kernel_name", op))
    return Conv2dPara(strides, pads, (dil[2], dil[3]), res_dtype, kernel_name, {})


def check_offset_x(value: object) -> int:
    """offset_x is the int8 quantisation offset of the input; float kernels take only 0."""
    value = check_int("para_dict['offset_x']", value)
    if value != 0:
        raise fail(E_RANGE, "para_dict['offset_x']", value,
                   "must be 0: it offsets int8 inputs, and only float16/float32 are supported")
    return value
