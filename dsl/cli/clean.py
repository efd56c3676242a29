"""``python -m dsl clean``: empty the caches the package writes.

By default only the kernel cache of the numpy-level APIs (``$DSL_CACHE_DIR/kernel_meta``,
default ``~/.cache/dsl/kernel_meta``): everything there is rebuilt on demand. Two things cost
more to lose and go only when asked for:

* ``--tuning-db``: the tuning database (``$DSL_TUNING_DB``, default ``~/.cache/dsl/tuning``),
  hours of measured search;
* ``--kernel-meta``: ``./kernel_meta`` in the working directory, the kernels your own
  scripts built (``dsl.build``'s default output).

``--dry-run`` lists what would go and removes nothing. A symlink is removed, never followed.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

from dsl.cli import output
from dsl.cli.common import prog


def _size(path: Path) -> tuple[int, int]:
    """(files, bytes) under ``path``, not following symlinks."""
    if path.is_symlink() or path.is_file():
        return 1, path.lstat().st_size
    files = size = 0
    for root, _, names in os.walk(path):
        for name in names:
            files += 1
            try:
                size += (Path(root) / name).lstat().st_size
            except OSError:
                pass
    return files, size


def _refuse(path: Path) -> str | None:
    """Why ``path`` must never be removed wholesale (a misdirected variable), or None."""
    resolved = path.resolve()
    if resolved in (Path(resolved.anchor), Path.home().resolve(), Path.cwd().resolve()):
        return f"{path} is the filesystem root, the home or the working directory"
    return None


def targets_to_clean(tuning_db: bool, kernel_meta: bool) -> list[tuple[str, Path | None]]:
    """``[(what, path)]`` selected by the flags; path None when the cache is switched off."""
    from dsl.runtime.kernel_cache import cache_root
    from dsl.tuning import database

    out: list[tuple[str, Path | None]] = [("kernel cache", cache_root() / "kernel_meta")]
    if tuning_db:
        out.append(("tuning database", database.root()))
    if kernel_meta:
        out.append(("kernel_meta/ here", Path.cwd() / "kernel_meta"))
    return out


def remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    else:
        shutil.rmtree(path)


def clean(tuning_db: bool = False, kernel_meta: bool = False, dry_run: bool = False) -> list:
    """Remove the selected caches; one result dict per cache (``what``, ``path``,
    ``files``, ``bytes``, ``action``: removed / would remove / absent / off / refused)."""
    results = []
    for what, path in targets_to_clean(tuning_db, kernel_meta):
        row = {"what": what, "path": str(path) if path else None, "files": 0, "bytes": 0}
        if path is None:
            row["action"] = "off"
        elif not (path.exists() or path.is_symlink()):
            row["action"] = "absent"
        elif (why := _refuse(path)) is not None:
            row["action"] = f"refused: {why}"
        else:
            row["files"], row["bytes"] = _size(path)
            if not dry_run:
                remove(path)
            row["action"] = "would remove" if dry_run else "removed"
        results.append(row)
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=prog("clean"), description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tuning-db", action="store_true",
                   help="also remove the tuning database (measured search results)")
    p.add_argument("--kernel-meta", action="store_true",
                   help="also remove ./kernel_meta in the working directory")
    p.add_argument("--dry-run", action="store_true", help="list what would go; remove nothing")
    output.add_json_arg(p)
    args = p.parse_args(argv)
    rows = clean(args.tuning_db, args.kernel_meta, args.dry_run)
    if not output.json_to_stdout(args.json):
        print(output.format_table(
            ("cache", "action", "files", "MB", "path"),
            [(r["what"], r["action"], str(r["files"]), f"{r['bytes'] / 1e6:.1f}",
              r["path"] or "-") for r in rows]))
    output.write_json({"dry_run": args.dry_run, "caches": rows}, args.json)
    return 1 if any(r["action"].startswith("refused") for r in rows) else 0
