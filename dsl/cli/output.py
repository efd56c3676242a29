"""How commands print results: a table for people by default, JSON for machines.

``--json FILE`` writes the results to FILE and still prints the table; ``--json -`` writes
JSON to stdout *instead of* the table (progress and notes go to stderr, so stdout is exactly
one JSON document).
"""

from __future__ import annotations

import json
import math
import sys


def add_json_arg(parser) -> None:
    parser.add_argument("--json", default=None, metavar="FILE",
                        help="also write the results as JSON to FILE; '-' writes JSON to "
                             "stdout instead of the table")


def cell(value, spec: str = "") -> str:
    """One table cell: None (and NaN) print as '-', numbers with ``spec``."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, (int, float)) and not isinstance(value, bool) and spec:
        return format(value, spec)
    return str(value)


def format_table(header, rows) -> str:
    """Columns padded to their widest cell; text left-aligned, numbers right-aligned.

    ``header`` is a sequence of titles, ``rows`` sequences of cells (already strings, or
    values passed through :func:`cell`).
    """
    rows = [[c if isinstance(c, str) else cell(c) for c in row] for row in rows]
    header = list(header)
    widths = [max([len(header[i])] + [len(r[i]) for r in rows]) for i in range(len(header))]
    numeric = [bool(rows) and all(_is_number(r[i]) for r in rows) for i in range(len(header))]

    def line(cells):
        out = [c.rjust(w) if num else c.ljust(w) for c, w, num in zip(cells, widths, numeric)]
        return "  ".join(out).rstrip()

    return "\n".join([line(header), *(line(r) for r in rows)])


def _is_number(text: str) -> bool:
    if text == "-":
        return True
    try:
        float(text.rstrip("%x"))
    except ValueError:
        return False
    return True


def json_to_stdout(dest: str | None) -> bool:
    """True when ``--json -``: the table must not be printed (stdout is the JSON)."""
    return dest == "-"


def write_json(data, dest: str | None, stdout=None, stderr=None) -> None:
    """Write ``data`` to ``dest`` ('-': stdout; None: nothing), and say where it went."""
    if not dest:
        return
    text = json.dumps(data, indent=1, default=_jsonable)
    if dest == "-":
        (stdout or sys.stdout).write(text + "\n")
        return
    with open(dest, "w") as f:
        f.write(text + "\n")
    print(f"wrote {dest}", file=stderr or sys.stderr)


def _jsonable(value):
    """Fallback for values json cannot write (paths, numpy scalars, targets): their text."""
    item = getattr(value, "item", None)
    return item() if callable(item) else str(value)
