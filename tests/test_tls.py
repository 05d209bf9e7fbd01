"""TLS: two real daemons sharing one self-signed certificate serve HTTPS, join and exchange
models over it; plain HTTP is not answered."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from nodes import STUB, wait_for


def make_cert(folder: Path) -> tuple[Path, Path]:
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=p2pnode-test", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=60)
    return cert, key


def https_status(addr: str, cert: Path) -> dict:
    ctx = ssl.create_default_context(cafile=str(cert))
    with urllib.request.urlopen(f"https://{addr}/v1/status", timeout=3, context=ctx) as resp:
        return json.load(resp)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_tls_cluster(cluster, tmp_path: Path) -> None:
    cert, key = make_cert(tmp_path)
    tls = [*STUB, "--set", f"node.tls_cert={cert}", "--set", f"node.tls_key={key}"]
    a = cluster("a", extra=tls)
    wait_for(lambda: https_status(a.addr, cert)["joined"], 40, "a to serve HTTPS")
    b = cluster("b", seeds=[a.addr], extra=tls)
    ids = {a.addr: https_status(a.addr, cert)["node_id"]}
    ids[b.addr] = wait_for(lambda: https_status(b.addr, cert)["node_id"], 40, "b to serve HTTPS")
    for n in (a, b):
        wait_for(lambda n=n: {m["node_id"] for m in https_status(n.addr, cert)["members"]
                              if m["state"] == "alive"} == set(ids.values()), 20, f"{n.name} to see both")
        wait_for(lambda n=n: https_status(n.addr, cert)["exchanges"]["done"] >= 2, 30, f"{n.name} to exchange")
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(f"http://{a.addr}/v1/status", timeout=3).read()
