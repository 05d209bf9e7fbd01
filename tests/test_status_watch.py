"""``p2pnode status --watch`` in a real terminal: a tmux pane, read back as the screen shows it.

tmux is the terminal emulator: the command runs in a detached pane of fixed size on a private
tmux server (``-L``), and ``capture-pane`` returns the rendered screen (scroll-back included),
so the test sees what a person over SSH would: the table, redrawn in place, not appended.
Skipped, saying why, where tmux is missing (``scripts/setup.sh`` installs it where it can).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from nodes import STUB, wait_for

pytestmark = pytest.mark.slow


RICH_SWITCHES = ("COLUMNS", "LINES", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "FORCE_COLOR", "NO_COLOR", "FORCE_TERMINAL")


class Pane:
    """One detached tmux session on a private server; ``screen()`` is what it shows."""

    def __init__(self, tmux: str, command: list[str], width: int = 80, height: int = 24) -> None:
        self.tmux = tmux
        self.server = f"p2pnode-test-{os.getpid()}"
        # The command as separate arguments: tmux runs it directly, not through ``$SHELL -c``. A
        # /bin/sh (dash) there stays the pane's process and dies of the Ctrl-C itself (SIGINT),
        # whatever the watch does with it; bash would exec the command, so it passed where SHELL
        # was bash and failed in CI.
        # PYTHONFAULTHANDLER: a watch that hangs prints every thread's stack on SIGABRT (diagnose)
        self._run("new-session", "-d", "-s", "w", "-x", str(width), "-y", str(height),
                  "-e", "PYTHONFAULTHANDLER=1", *command)
        self._run("set-option", "-t", "w", "remain-on-exit", "on")
        self.pid = int(self._run("display-message", "-p", "-t", "w", "#{pane_pid}").strip())

    def _run(self, *args: str) -> str:
        # The pane inherits the environment of whoever starts the tmux server: a COLUMNS or LINES
        # there (pytest may set them) would override the pane's real size, and the switches Rich
        # reads (a CI runner may set TTY_INTERACTIVE=0, FORCE_COLOR...) would make it draw as if
        # to a file, whatever the pane is.
        env = {k: v for k, v in os.environ.items() if k not in RICH_SWITCHES and not k.startswith("JUPYTER_")}
        return subprocess.run([self.tmux, "-L", self.server, *args], check=True, capture_output=True, text=True,
                              timeout=10, env=env).stdout

    def screen(self, history: bool = False) -> str:
        return self._run("capture-pane", "-p", "-t", "w", *(["-S", "-"] if history else []))

    def keys(self, *keys: str) -> None:
        self._run("send-keys", "-t", "w", *keys)

    def exit_status(self) -> int | None:
        """None while the command runs; its exit status once it ended, 128 + N if signal N killed it
        (tmux leaves ``pane_dead_status`` empty then, and while the pane lives; both stay empty for a
        moment after the pane is marked dead, until tmux has reaped the process)."""
        dead, status, signal = self._run("display-message", "-p", "-t", "w",
                                         "#{pane_dead}:#{pane_dead_status}:#{pane_dead_signal}").strip().split(":")
        if dead == "1" and (status or signal):
            return int(status) if status else 128 + int(signal)
        return self._zombie_status()

    def _zombie_status(self) -> int | None:
        """The exit status of a command that ended but that tmux has not reaped yet, from the kernel.

        A CI run saw the watch a zombie (it had exited) for the whole 30 s the test waited while
        tmux still showed the pane alive: whether the command ended is the kernel's word, not
        tmux's. ``/proc/PID/stat``'s last field is the exit code as ``waitpid`` reports it."""
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return None  # reaped between tmux's answer and ours: tmux has the status now
        if fields[0] != "Z":
            return None  # still running
        code = int(fields[-1])
        return 128 + (code & 0x7F) if code & 0x7F else code >> 8

    def diagnose(self) -> str:
        """If the command still runs: its kernel state and signal masks, then its Python stacks
        (SIGABRT with the fault handler on), which land on the screen: what a hang was doing."""
        try:
            with open(f"/proc/{self.pid}/status") as f:
                wanted = ("State", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")
                state = " ".join(line.strip() for line in f if line.startswith(wanted))
            with open(f"/proc/{self.pid}/wchan") as f:
                state += f" wchan={f.read().strip()}"
        except OSError:
            return "the process is gone"
        os.kill(self.pid, signal.SIGABRT)
        time.sleep(1.0)
        return state

    def close(self) -> None:
        subprocess.run([self.tmux, "-L", self.server, "kill-server"], capture_output=True, timeout=10)


@pytest.fixture
def tmux() -> Iterator[str]:
    path = shutil.which("tmux")
    if path is None:
        pytest.skip("tmux is not installed (apt-get install tmux): it is the terminal this test reads")
    yield path


def step_of(screen: str, node_id: str) -> int | None:
    """The step column of a node's row: the first number after its state."""
    for line in screen.splitlines():
        if node_id[:8] in line:
            m = re.search(r"\b(?:alive|suspect)\b\D*?(\d+)", line)
            return int(m.group(1)) if m else None
    return None


@pytest.mark.timeout(180)
def test_watch_redraws_the_cluster_table_in_place(cluster: Any, tmux: str) -> None:
    a = cluster("a", extra=STUB)  # the torch-free worker: the terminal is the point; it steps on
    a.wait_ready()
    b = cluster("b", seeds=[a.addr], extra=STUB)
    ids = [n.wait_ready()["node_id"] for n in (a, b)]
    wait_for(lambda: all(m["state"] == "alive" for m in a.status()["members"]) and len(a.status()["members"]) == 2,
             30, "a to see b")
    pane = Pane(tmux, [sys.executable, "-m", "p2pnode", "status", "--watch", a.addr, "--interval", "0.5"])
    try:
        watch_and_stop(pane, a.addr, ids)
    except AssertionError as exc:  # what the terminal showed is the whole story: say it
        status = pane.exit_status()
        process = pane.diagnose() if status is None else f"exit status {status}"
        raise AssertionError(f"{exc}\n--- the process: {process}\n--- the screen:\n"
                             f"{pane.screen(history=True)}") from None
    finally:
        pane.close()


def watch_and_stop(pane: Pane, addr: str, ids: list[str]) -> None:
    def both_rows() -> str | None:
        screen = pane.screen()
        return screen if all(step_of(screen, i) is not None for i in ids) else None

    first = wait_for(both_rows, 45, "both nodes' rows on the screen")
    assert "p2pnode cluster via " + addr in first
    # An 80-column terminal, as over SSH: the narrow layout, every row on one line.
    for column in ("node", "state", "step", "smp/s", "loss", "acc", "exch", "in", "out"):
        assert column in first
    assert f"{ids[0][:8]} *" in first  # the node asked is marked
    step0 = step_of(first, ids[0])
    assert step0 is not None
    # Training goes on and the table follows, redrawn over itself: one header in the whole
    # scroll-back, however many refreshes happened.
    wait_for(lambda: (step_of(pane.screen(), ids[0]) or 0) > step0, 45, "the table to refresh")
    whole = pane.screen(history=True)
    assert whole.count("p2pnode cluster via") == 1, "the header drawn more than once"
    assert whole.count("smp/s") == 1, "the column names drawn more than once"
    pane.keys("C-c")
    wait_for(lambda: pane.exit_status() is not None, 30, "the watch to end on Ctrl-C")  # a loaded CI machine took over 10 s once
    assert pane.exit_status() == 0
    assert step_of(pane.screen(), ids[1]) is not None, "the last table did not stay on screen"
