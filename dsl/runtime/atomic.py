"""Crash-safe file publishing shared by the kernel build and the tuning database.

Writers put their bytes in a private temporary file beside the target, named
``.<stem>.<pid>.<random>.tmp``, and ``os.replace`` it into place, so readers see the old file or
the new one, never half of one. A writer killed mid-write (SIGKILL, OOM) leaves its temporary;
the pid in the name lets the next writer of the same stem recognise it as dead and remove it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def tmp_prefix(stem: str) -> str:
    return f".{stem}.{os.getpid()}."


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, owned by someone else
        return True
    return True


def sweep_dead_temps(directory: Path, stem: str) -> None:
    """Remove temporaries of ``stem`` left in ``directory`` by writers (and loaders'
    private library copies, ``*.tmp.so``) that died."""
    for tmp in [*directory.glob(f".{stem}.*.tmp"), *directory.glob(f".{stem}.*.tmp.so")]:
        pid = tmp.name[len(stem) + 2:].split(".", 1)[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()


def write_text_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically (fsynced before the rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep_dead_temps(path.parent, path.name)
    fd, tmp = tempfile.mkstemp(prefix=tmp_prefix(path.name), suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
