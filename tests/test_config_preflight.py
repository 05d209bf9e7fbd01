"""Configuration-class failures of ``p2pnode start``: each is one line naming the key (and the
file or address), exit code 2 (systemd's RestartPreventExitStatus=2 does not restart it), and
nothing is written — the state directory is not even created. Real ``p2pnode start``
processes; where a daemon is needed it is a real one with the stub worker."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from nodes import STUB


def start(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "p2pnode", "start", "--state-dir", str(tmp_path / "state"),
                           "--listen", "127.0.0.1:0", *STUB, *args], capture_output=True, text=True, timeout=60)


def assert_refused(proc: subprocess.CompletedProcess[str], tmp_path: Path, fragment: str) -> None:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and fragment in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "state").exists(), "a refused start must write nothing"


@pytest.mark.parametrize("args, fragment", [
    (["--set", "training.lr=inf"], "training.lr: expected a finite number, got 'inf'"),
    (["--set", "training.lr=nan"], "training.lr: expected a finite number"),
    (["--set", "exchange.timeout=inf"], "exchange.timeout: expected a finite number"),
    (["--set", "checkpoint.interval=inf"], "checkpoint.interval: expected a finite number"),
    (["--set", "checkpoint.interval=1e9"], "checkpoint.interval: 1e+09 s is more than a day"),
    (["--set", "exchange.timeout=-1"], "exchange.timeout: must be > 0"),
    (["--set", "training.max_samples=99999999999999999999"], "training.max_samples: 99999999999999999999 is out of range"),
    (["--set", "compression.publish=topk:density=inf"], "compression.publish: 'topk:density=inf': topk: density"),
    (["--seed", "http://10.0.0.1:7070"], "node.seeds: 'http://10.0.0.1:7070' is not HOST:PORT (no scheme"),
    (["--seed", "a:1,b:2"], "node.seeds: 'a:1,b:2' is not HOST:PORT (one address each"),
    (["--seed", "::1:7070"], "node.seeds: '::1:7070' is not HOST:PORT (an IPv6 address goes in brackets"),
    (["--seed", "host:99999"], "node.seeds: 'host:99999' is not HOST:PORT"),
    (["--advertise", "node a:7070"], "node.advertise: 'node a:7070' is not HOST:PORT"),
])
def test_bad_values_exit_2_with_one_line(tmp_path: Path, args: list[str], fragment: str) -> None:
    assert_refused(start(tmp_path, *args), tmp_path, fragment)


def test_toml_inf_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "n.toml"
    f.write_text("[training]\nlr = inf\n")
    assert_refused(start(tmp_path, "--config", str(f)), tmp_path, "training.lr: expected a finite number")


@pytest.mark.parametrize("key", ["secret_file", "dashboard_token_file", "tls_ca"])
def test_missing_files_are_named(tmp_path: Path, key: str) -> None:
    missing = tmp_path / "nowhere" / "file"
    extra = []
    if key == "tls_ca":  # a CA only with a certificate: give a real-looking pair that exists
        (tmp_path / "c.pem").write_text("x")
        extra = ["--set", f"node.tls_cert={tmp_path / 'c.pem'}", "--set", f"node.tls_key={tmp_path / 'c.pem'}"]
    proc = start(tmp_path, "--set", f"node.{key}={missing}", *extra)
    assert_refused(proc, tmp_path, f"node.{key}: {missing} does not exist")


def test_missing_tls_key_and_garbage_certificate(tmp_path: Path) -> None:
    cert = tmp_path / "cert.pem"
    cert.write_text("-----BEGIN CERTIFICATE-----\nnot one\n-----END CERTIFICATE-----\n")
    proc = start(tmp_path, "--set", f"node.tls_cert={cert}", "--set", f"node.tls_key={tmp_path / 'key.pem'}")
    assert_refused(proc, tmp_path, f"node.tls_key: {tmp_path / 'key.pem'} does not exist")
    proc = start(tmp_path, "--set", f"node.tls_cert={cert}", "--set", f"node.tls_key={cert}")
    assert_refused(proc, tmp_path, f"node.tls_cert: {cert} with key {cert} does not load")


def test_empty_secret_file_and_a_directory(tmp_path: Path) -> None:
    empty = tmp_path / "secret"
    empty.write_text("\n")
    assert_refused(start(tmp_path, "--set", f"node.secret_file={empty}"), tmp_path,
                   f"node.secret_file: {empty} is empty")
    assert_refused(start(tmp_path, "--set", f"node.secret_file={tmp_path}"), tmp_path,
                   f"node.secret_file: {tmp_path} is not a file")


def test_state_dir_that_is_a_file(tmp_path: Path) -> None:
    f = tmp_path / "afile"
    f.write_text("")
    proc = subprocess.run([sys.executable, "-m", "p2pnode", "start", "--state-dir", str(f / "state"), *STUB],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"node.state_dir: {f / 'state'} cannot be written" in proc.stderr


def test_busy_listen_port_is_named_before_anything_is_written(tmp_path: Path, cluster) -> None:
    a = cluster("a", extra=STUB)
    a.wait_ready()
    proc = subprocess.run([sys.executable, "-m", "p2pnode", "start", "--state-dir", str(tmp_path / "state"),
                           "--listen", a.addr, *STUB], capture_output=True, text=True, timeout=60)
    assert_refused(proc, tmp_path, f"node.listen: {a.addr} is already in use by another process")
    assert a.status()["node_id"]  # the node that holds the port is untouched


def test_missing_data_dir_is_named_for_the_torch_worker(tmp_path: Path) -> None:
    """Refused before the worker (and torch) start; the stub worker reads no data."""
    args = ["--set", f"training.data_dir={tmp_path / 'nowhere'}", "--set", "training.worker=torch"]
    proc = subprocess.run([sys.executable, "-m", "p2pnode", "start", "--state-dir", str(tmp_path / "state"),
                           "--listen", "127.0.0.1:0", *args], capture_output=True, text=True, timeout=60)
    assert_refused(proc, tmp_path, f"training.data_dir: {tmp_path / 'nowhere'} does not exist")
    from p2pnode import data, preflight

    assert str(data.DEBIAN_FASHION_MNIST) == preflight.DEBIAN_FASHION_MNIST  # one place the worker reads
