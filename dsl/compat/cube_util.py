"""TBE's ``cube_util`` helpers that scripts call while preparing ``para_dict``."""

from dsl.errors import ceil_div as ceil  # noqa: F401
from dsl.ops.group import _lcm as lcm  # noqa: F401
from dsl.ops.group import calculate_group  # noqa: F401
