"""The ``targets`` package seen from ``dsl``: its lookups with ``DslError`` for a bad name.

``targets`` depends on nothing in ``dsl`` and raises its own :class:`targets.UnknownTarget`;
every ``dsl`` entry point that takes a target name looks it up here, so a user still gets the
project's one error type (``E60012``, parameter ``target``, the valid names).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import targets
from dsl.errors import E_VALUE, fail


def get(name) -> targets.CpuTarget:
    """:func:`targets.get`, raising ``DslError`` for an unknown name."""
    try:
        return targets.get(name)
    except targets.UnknownTarget as err:
        raise fail(E_VALUE, err.param, err.value, err.rule) from None


@contextlib.contextmanager
def use(name) -> Iterator[targets.CpuTarget]:
    """``with dsl.target("x86-avx2"):`` — :func:`targets.use` with ``DslError``."""
    with targets.use(get(name)) as tgt:
        yield tgt
