"""``python healthz_probe.py ADDR... SECONDS OUT``: ask each node's ``/healthz`` every 20 ms for
SECONDS and write the seconds every answer took, per address, to OUT (JSON; an answer that did
not come counts as 5 s). A process of its own, so that tests can run it at the priority they
give the nodes it probes: what it measures is then the node, not the machine's other load."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request


def main() -> None:
    *addrs, seconds, out = sys.argv[1:]
    took: dict[str, list[float]] = {a: [] for a in addrs}
    end = time.monotonic() + float(seconds)
    while time.monotonic() < end:
        for a in addrs:
            started = time.monotonic()
            try:
                urllib.request.urlopen(f"http://{a}/healthz", timeout=5).read()
                took[a].append(time.monotonic() - started)
            except OSError:
                took[a].append(5.0)
        time.sleep(0.02)
        write(out + ".tmp", took)  # so far, for a reader that cannot wait for the end
    write(out, took)


def write(path: str, took: dict[str, list[float]]) -> None:
    """Whole or not at all: the test stops this process at any moment and reads what it wrote
    (a plain write, stopped between truncating and writing, left it empty)."""
    with open(path + ".part", "w") as fh:
        json.dump(took, fh)
    os.replace(path + ".part", path)


if __name__ == "__main__":
    main()
