"""A release an operator can install: the wheel carries the unit, the reference config, the
docs and the LICENSE, and ``p2pnode install-service`` run from a fresh virtual environment
holding only that wheel (no source tree, no dependencies: it is stdlib-only) puts the unit,
node.toml and the docs where the unit says they are."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import p2pnode

ROOT = Path(__file__).resolve().parents[1]

#: both tests on one xdist worker, sharing one wheel: built on two workers at once, setuptools'
#: two builds in the checkout's build/ raced, and one of them now and then failed
pytestmark = pytest.mark.xdist_group("release_wheel")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(ROOT),
                    "-w", str(out)], check=True, capture_output=True, timeout=300)
    (whl,) = out.glob("p2pnode-*.whl")
    return whl


def test_wheel_carries_operator_files_and_one_version(wheel: Path) -> None:
    assert wheel.name.startswith(f"p2pnode-{p2pnode.__version__}-")
    names = set(zipfile.ZipFile(wheel).namelist())
    for need in ("p2pnode/_dist/systemd/p2pnode.service", "p2pnode/_dist/conf/node.toml",
                 "p2pnode/_dist/doc/OPERATIONS.md", "p2pnode/_dist/doc/README.md", "p2pnode/_dist/doc/LICENSE",
                 "p2pnode/_dist/doc/CHANGELOG.md", "p2pnode/install.py", "p2pnode/dashboard/static/index.html"):
        assert need in names, need
    assert not [n for n in names if n.startswith("benchlib/")], "benchlib is the benchmarks' library, not the package's"
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert f"## {p2pnode.__version__.removesuffix('.dev0')}" in (ROOT / "CHANGELOG.md").read_text()
    assert "Apache License" in (ROOT / "LICENSE").read_text() and "Version 2.0" in (ROOT / "LICENSE").read_text()


def test_install_service_from_a_fresh_venv(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--no-deps", "--no-index", str(wheel)], check=True, capture_output=True, timeout=300)
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import p2pnode; print(p2pnode.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, check=True, timeout=60).stdout
    assert where.startswith(str(venv)), where  # the wheel's copy, not the checkout

    root = tmp_path / "root"
    proc = subprocess.run([str(venv / "bin" / "p2pnode"), "install-service", "--root", str(root)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    unit = (root / "etc/systemd/system/p2pnode.service").read_text()
    exec_start = re.search(r"^ExecStart=(\S+) start .*--config (\S+)", unit, re.M)
    docs = re.search(r"^Documentation=file:(\S+)", unit, re.M)
    assert exec_start and docs
    assert exec_start.group(1) == str(venv / "bin" / "p2pnode")  # the unit runs this installation
    config = root / exec_start.group(2).lstrip("/")
    assert config.read_text() == (ROOT / "conf/node.toml").read_text()
    assert (root / docs.group(1).lstrip("/")).read_text() == (ROOT / "docs/OPERATIONS.md").read_text()
    doc_dir = (root / docs.group(1).lstrip("/")).parent
    assert {"README.md", "LICENSE", "CHANGELOG.md", "node.toml.example", "p2pnode-alerts.yml",
            "grafana-dashboard.json"} <= {p.name for p in doc_dir.iterdir()}

    # Again: the operator's edited node.toml is kept, the unit is the release's.
    config.write_text("# mine\n")
    proc = subprocess.run([str(venv / "bin" / "p2pnode"), "install-service", "--root", str(root), "--exec",
                           "/usr/local/bin/p2pnode"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "kept" in proc.stdout, proc.stdout + proc.stderr
    assert config.read_text() == "# mine\n"
    assert "ExecStart=/usr/local/bin/p2pnode start" in (root / "etc/systemd/system/p2pnode.service").read_text()
