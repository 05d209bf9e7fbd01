"""Build hook: ship the operator's files inside the package.

``conf/node.toml``, ``systemd/p2pnode.service``, ``docs/*.md``, README, LICENSE and CHANGELOG
live at the top of the repository (where people and tests read them) but package data must be
inside a package, so the build copies them into ``p2pnode/_dist/`` of the wheel, where
``p2pnode install-service`` finds them (docs/OPERATIONS.md). Everything else is pyproject.toml.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
#: repository path -> path under p2pnode/_dist/
SHIPPED = {"conf/node.toml": "conf/node.toml", "systemd/p2pnode.service": "systemd/p2pnode.service",
           "README.md": "doc/README.md", "LICENSE": "doc/LICENSE", "CHANGELOG.md": "doc/CHANGELOG.md",
           "conf/p2pnode-alerts.yml": "doc/p2pnode-alerts.yml", "conf/grafana-dashboard.json": "doc/grafana-dashboard.json"}


class BuildWithOperatorFiles(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:  # an editable install reads the files from the checkout
            return
        dist = Path(self.build_lib) / "p2pnode" / "_dist"
        files = {**SHIPPED, **{f"docs/{p.name}": f"doc/{p.name}" for p in sorted((ROOT / "docs").glob("*.md"))}}
        for src, dst in files.items():
            target = dist / dst
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / src, target)


setup(cmdclass={"build_py": BuildWithOperatorFiles})
