"""``p2pnode install-service``: put the systemd unit, the reference configuration and the docs
where the unit expects them, from an installed wheel or from a checkout.

The unit is the one truth for the paths: its ``ExecStart=`` names the config file
(``--config /etc/p2pnode/node.toml``) and its ``Documentation=`` the docs folder
(``/usr/share/doc/p2pnode``), so those are read from it, not repeated here. ``--root`` installs
under another directory (a package build's staging root, a test); an existing node.toml is
kept (it is the operator's), the unit and the docs are replaced (they are the release's).
Torch-free and stdlib-only: it runs before the service's dependencies matter.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

UNIT_NAME = "p2pnode.service"
UNIT_DIR = "/etc/systemd/system"
DEFAULT_EXEC = "/usr/local/bin/p2pnode"


@dataclass
class Shipped:
    """Where this installation's operator files are: ``p2pnode/_dist`` in a wheel (setup.py's
    build hook copies them there), the repository's top level in a checkout."""

    unit: Path
    config: Path
    docs: list[Path]


def shipped() -> Shipped:
    dist = Path(__file__).resolve().parent / "_dist"
    if dist.is_dir():
        return Shipped(dist / "systemd" / UNIT_NAME, dist / "conf" / "node.toml", sorted((dist / "doc").iterdir()))
    top = Path(__file__).resolve().parents[1]
    docs = [top / "README.md", top / "LICENSE", top / "CHANGELOG.md", top / "conf" / "p2pnode-alerts.yml",
            top / "conf" / "grafana-dashboard.json", *sorted((top / "docs").glob("*.md"))]
    return Shipped(top / "systemd" / UNIT_NAME, top / "conf" / "node.toml", [d for d in docs if d.exists()])


def default_exec() -> str:
    """The ``p2pnode`` script of this installation when it runs from a virtual environment
    (``/opt/p2pnode/bin/p2pnode``), else the unit's own ``/usr/local/bin/p2pnode``."""
    script = Path(sys.executable).with_name("p2pnode")
    return str(script) if sys.prefix != sys.base_prefix and script.exists() else DEFAULT_EXEC


def unit_paths(unit_text: str) -> tuple[str, str]:
    """(config file, docs folder) as the unit names them."""
    config = re.search(r"^ExecStart=\S+ start .*--config (\S+)", unit_text, re.M)
    docs = re.search(r"^Documentation=file:(\S+)", unit_text, re.M)
    if not config or not docs:
        raise ValueError("the unit names no --config in ExecStart= or no file: Documentation=")
    return config.group(1), str(Path(docs.group(1)).parent)


def _write(path: Path, data: bytes) -> None:
    """Atomically: a half-written unit or config must never be what systemd reads."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def install(root: Path, exe: str) -> list[str]:
    """Install under ``root``; one line per file saying what happened."""
    src = shipped()
    unit = src.unit.read_text().replace(f"ExecStart={DEFAULT_EXEC} ", f"ExecStart={exe} ")
    config, docs = unit_paths(unit)
    done = []
    _write(root / UNIT_DIR.lstrip("/") / UNIT_NAME, unit.encode())
    done.append(f"unit    {root / UNIT_DIR.lstrip('/') / UNIT_NAME}  (ExecStart={exe})")
    target = root / config.lstrip("/")
    if target.exists():
        done.append(f"config  {target}  kept (yours); the release's reference is in {docs}")
    else:
        _write(target, src.config.read_bytes())
        done.append(f"config  {target}  (edit it: node.listen, node.seeds, node.secret_file)")
    for doc in src.docs:
        _write(root / docs.lstrip("/") / doc.name, doc.read_bytes())
    _write(root / docs.lstrip("/") / "node.toml.example", src.config.read_bytes())
    done.append(f"docs    {root / docs.lstrip('/')}/  ({len(src.docs) + 1} files)")
    return done


def main(root: str, exe: str | None) -> int:
    try:
        lines = install(Path(root), exe or default_exec())
    except (OSError, ValueError) as exc:
        print(f"p2pnode: install-service: {exc}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    if Path(root).resolve() == Path("/"):
        print("next: systemd-analyze verify /etc/systemd/system/p2pnode.service && systemctl daemon-reload "
              "&& systemctl enable --now p2pnode")
    return 0
