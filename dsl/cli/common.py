"""What every ``python -m dsl`` command shares: its name, usage errors, workload selection.

* :func:`prog` names the command as the user typed it: ``dsl bench`` from the console script,
  ``python -m dsl bench`` from the module (``dsl/__main__.py`` sets :data:`PROG`).
* :class:`UsageError` is a mistake on the command line (an unknown command, suite, workload or
  example): the command prints it, with the valid choices, and exits with status 2.
* :func:`add_selection_args` / :func:`select_workloads`: ``--suite`` and ``--filter`` mean the
  same in ``bench`` and ``tune`` (:func:`workload_matcher`).
"""

from __future__ import annotations

import re
import sys

# How the user started us; "dsl" when run as the console script (set by dsl/__main__.py).
PROG = "python -m dsl"


def prog(command: str | None = None) -> str:
    """``"python -m dsl bench"`` or ``"dsl bench"``, as the user typed it."""
    return f"{PROG} {command}" if command else PROG


class UsageError(Exception):
    """A mistake on the command line; ``valid`` lists what would have been accepted."""

    def __init__(self, message: str, valid=()):
        super().__init__(message)
        self.valid = list(valid)

    def report(self, command: str | None = None, stream=None) -> int:
        """Print ``<prog>: error: <message>`` and the valid choices; return exit status 2."""
        stream = stream or sys.stderr
        print(f"{prog(command)}: error: {self}", file=stream)
        if self.valid:
            print("valid choices:\n" + "\n".join(f"  {v}" for v in self.valid), file=stream)
        return 2


def split_list(values) -> list[str]:
    """``["a,b", "c"]`` -> ``["a", "b", "c"]`` (a repeatable option whose values may also be
    comma-separated)."""
    return [v for item in values or () for v in str(item).split(",") if v]


def add_selection_args(parser) -> None:
    """``--suite`` (repeatable, comma-separated; default all; aliases such as ``ops``) and
    ``--filter``, the same in every command that runs benchmark workloads."""
    from dsl.cli.bench import ALIASES, SUITES

    aliases = "; ".join(f"{k} = {','.join(v)}" for k, v in ALIASES.items())
    parser.add_argument("--suite", action="append", metavar="SUITE",
                        help=f"benchmark suite(s), repeatable or comma-separated (default: "
                             f"all): {', '.join(SUITES)}; {aliases}")
    parser.add_argument("--filter", default="", metavar="REGEX",
                        help="only workloads whose 'suite/name/kind' matches this regular "
                             "expression (re.search: a plain substring works)")


def workload_matcher(pattern: str | None):
    """The one rule ``--filter`` follows: ``re.search(pattern, "suite/name/kind")``; an empty
    pattern matches everything. Raises UsageError for an invalid regular expression."""
    if not pattern:
        return lambda w: True
    try:
        rx = re.compile(pattern)
    except re.error as exc:
        raise UsageError(f"--filter {pattern!r} is not a regular expression ({exc})") from None
    return lambda w: rx.search(workload_id(w)) is not None


def workload_id(w) -> str:
    """``suite/name/kind``: what ``--filter`` matches and what the tables print."""
    return f"{w.suite}/{w.name}/{w.kind}"


def select_workloads(suites, pattern: str | None) -> list:
    """The benchmark workloads of ``suites`` (names or aliases, :data:`dsl.cli.bench.ALIASES`;
    None or empty: all) matching ``pattern``.

    Raises UsageError naming the valid suites for an unknown suite, and listing the
    workloads that exist when the filter matches none.
    """
    from dsl.cli.bench import ALIASES, SUITES, WORKLOADS, expand_suites, load_suites

    names = expand_suites(split_list(suites)) or list(SUITES)
    workloads = load_suites(names)
    known = list(dict.fromkeys([*SUITES, *ALIASES, *(w.suite for w in WORKLOADS)]))
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"unknown suite {', '.join(map(repr, unknown))}", known)
    match = workload_matcher(pattern)
    selected = [w for w in workloads if match(w)]
    if not selected:
        raise UsageError(f"no workload of suite(s) {', '.join(names)} matches --filter "
                         f"{pattern!r}", [workload_id(w) for w in workloads])
    return selected
