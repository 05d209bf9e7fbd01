"""``p2pnode status`` as an operator meets it: a TLS node asked over https with its CA, a node
with a secret asked without one (a hint about --secret-file, not a bare 401), and something
that is not a p2pnode answering JSON (one line, exit 1, never a traceback). Real processes."""

from __future__ import annotations

import http.server
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodes import STUB, free_port, wait_for

SECRET = "status-cli-secret"


def status(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "p2pnode", "status", *args], capture_output=True, text=True,
                          timeout=60)


def one_line(proc: subprocess.CompletedProcess[str], code: int, fragment: str) -> None:
    assert proc.returncode == code, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.fixture
def foreign() -> Iterator[str]:
    """A server on loopback that answers every GET with JSON that is not a p2pnode status."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            body = b'{"status": "ok", "training": 3}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_foreign_json_is_one_line_not_a_traceback(foreign: str) -> None:
    one_line(status(foreign), 1, f"{foreign} did not answer a p2pnode status document")
    raw = status(foreign, "--json")
    assert raw.returncode == 0 and '"training": 3' in raw.stdout


def test_missing_cafile_is_a_usage_error(tmp_path: Path) -> None:
    one_line(status("127.0.0.1:1", "--cafile", str(tmp_path / "ca.pem")), 2, f"--cafile: {tmp_path / 'ca.pem'} does not exist")


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_https_with_ca_and_the_secret_hint(cluster, tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=p2pnode-test", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=60)
    secret = tmp_path / "secret"
    secret.write_text(SECRET + "\n")
    a = cluster("a", extra=[*STUB, "--set", f"node.tls_cert={cert}", "--set", f"node.tls_key={key}",
                            "--set", f"node.secret_file={secret}"])
    ok = wait_for(lambda: (p := status(f"https://{a.addr}", "--cafile", str(cert), "--secret-file", str(secret)))
                  .returncode == 0 and p, 40, "a to answer over https")
    assert ok.stdout.startswith("node ") and a.addr in ok.stdout
    same = status(a.addr, "--cafile", str(cert), "--secret-file", str(secret))  # a CA implies https
    assert same.returncode == 0, same.stderr

    one_line(status(f"https://{a.addr}", "--cafile", str(cert)), 1, "HTTP 401")
    assert "--secret-file" in status(f"https://{a.addr}", "--cafile", str(cert)).stderr
    wrong = tmp_path / "wrong"
    wrong.write_text("not the secret\n")
    one_line(status(f"https://{a.addr}", "--cafile", str(cert), "--secret-file", str(wrong)), 1,
             "a different secret or token")
    one_line(status(a.addr, "--secret-file", str(secret)), 1, "(a TLS node? give https://HOST:PORT and --cafile")
    one_line(status(f"https://{a.addr}", "--secret-file", str(secret)), 1, "(give --cafile FILE")
