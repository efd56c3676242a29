"""Child process for the tuning-database tests: ``python rel_dbwriter.py MODE PATH TAG [N]``.

``append``: wait for PATH.go, append N lines; ``forever``: print "ready", append until killed.
Lines carry a payload of varying size (up to ~200 KiB) so a write is not trivially atomic, and
a checksum of it so a reader can tell a whole line from a spliced one.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path

from dsl import tuning_db


def line(tag: str, i: int) -> dict:
    payload = (f"{tag}:{i}:" * (1 + (i * 7919) % 12000))[:200_000]
    return {"format": tuning_db.FORMAT, "kind": "record", "tag": tag, "i": i,
            "payload": payload, "sha": hashlib.sha256(payload.encode()).hexdigest()}


def main(mode: str, path: str, tag: str, n: str = "0") -> None:
    p = Path(path)
    if mode == "append":
        print("waiting", flush=True)
        deadline = time.monotonic() + 120  # a test that died before "go" must not leave us
        while not os.path.exists(path + ".go"):
            if time.monotonic() > deadline:
                raise SystemExit(f"no {path}.go within 120 s; giving up")
            time.sleep(0.005)
        for i in range(int(n)):
            tuning_db.append_line(p, line(tag, i))
    elif mode == "forever":
        print("ready", flush=True)
        i = 0
        deadline = time.monotonic() + 120  # the test SIGKILLs us long before; bound it anyway
        while time.monotonic() < deadline:
            tuning_db.append_line(p, line(tag, i))
            i += 1
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main(*sys.argv[1:])
