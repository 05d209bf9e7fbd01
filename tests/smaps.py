"""Resident bytes of one file's mapping in this process, from /proc/self/smaps (Linux)."""

from __future__ import annotations

from pathlib import Path


def mapped_rss(path: Path) -> int:
    """Bytes of ``path``'s mapping in this process's resident set; 0 when it is not mapped."""
    lines = Path("/proc/self/smaps").read_text().splitlines()
    for i, line in enumerate(lines):
        if line.endswith(str(path)):
            for follow in lines[i + 1:i + 30]:
                if follow.startswith("Rss:"):
                    return 1024 * int(follow.split()[1])
    return 0
