"""``p2pnode status --watch``: the dashboard's cluster table, redrawn in place in a terminal.

One request per refresh, ``GET /v1/cluster`` on the node named (it asks its members, with its
own timeouts), so the view over SSH costs what one browser does. Drawn with ``rich``'s ``Live``
(cursor movement, no full-screen mode: the last table stays on screen after Ctrl-C). A failed
refresh keeps the last table and says what went wrong above it.
"""

from __future__ import annotations

import json
import signal
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from types import FrameType
from typing import Any

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

STATE_STYLE = {"alive": "green", "suspect": "yellow", "dead": "red", "left": "dim"}


@dataclass
class Target:
    """Where and how to ask: ``addr`` is HOST:PORT or an http(s):// URL of the node."""

    addr: str
    timeout: float = 5.0
    secret: bytes | None = None
    token: str | None = None
    cafile: str | None = None

    def url(self, path: str) -> str:
        base = self.addr if "://" in self.addr else f"http://{self.addr}"
        return base.rstrip("/") + path


def fetch_json(target: Target, path: str) -> dict[str, Any]:
    """GET a JSON object from the node, signed with the secret or carrying the read-only token."""
    headers: dict[str, str] = {}
    if target.secret:
        from p2pnode.net.auth import sign

        headers.update(sign(target.secret, "GET", path, b""))
    elif target.token:
        headers["Authorization"] = f"Bearer {target.token}"
    ctx = None
    if target.url(path).startswith("https://"):
        ctx = ssl.create_default_context(cafile=target.cafile)
        ctx.check_hostname = False  # nodes are addressed by IP, like peers address each other
    req = urllib.request.Request(target.url(path), headers=headers)
    with urllib.request.urlopen(req, timeout=target.timeout, context=ctx) as resp:
        data = json.load(resp)
    if not isinstance(data, dict):
        raise ValueError(f"{path} did not answer a JSON object")
    return data


def _num(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    return f"{v:.{digits}f}" if isinstance(v, float) and not float(v).is_integer() else str(int(v))


def _bytes(n: Any) -> str:
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


#: (name, justify, heading in a narrow terminal or None: left out there); the dashboard's columns
COLUMNS = (("node", "left", "node"), ("address", "left", None), ("state", "left", "state"),
           ("step", "right", "step"), ("samples/s", "right", "smp/s"), ("loss", "right", "loss"),
           ("accuracy", "right", "acc"), ("exchanges", "right", "exch"), ("skipped", "right", None),
           ("in", "right", "in"), ("out", "right", "out"), ("worker", "left", None),
           ("skew", "right", None))
#: below this many columns the address, skipped, worker and skew columns are left out (80 fits)
WIDE = 140


def cluster_table(view: dict[str, Any], width: int = WIDE) -> Table:
    """The cluster table: one row per node, the dashboard's columns (fewer when narrow)."""
    wide = width >= WIDE
    table = Table(box=box.SIMPLE_HEAD, header_style="bold", pad_edge=False, padding=(0, 1, 0, 0) if wide else 0)
    shown = [(name, justify, name if wide else narrow) for name, justify, narrow in COLUMNS if wide or narrow]
    for _, justify, heading in shown:
        table.add_column(heading, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for n in view.get("nodes", []):
        reachable = bool(n.get("reachable"))
        state = str(n.get("state") or "-")
        worker = "-"
        if reachable:
            worker = ("done" if n.get("done") else "training") if n.get("worker_alive") else "DOWN"
        acc = n.get("accuracy")
        cells: dict[str, Text | str] = {
            "node": Text(str(n.get("node_id") or "?")[:16 if wide else 8] + (" *" if n.get("self") else ""),
                         style="bold" if n.get("self") else ""),
            "address": str(n.get("addr") or "-"), "state": Text(state, style=STATE_STYLE.get(state, "")),
            "step": _num(n.get("step")),
            "samples/s": _num(n.get("samples_per_s"), 0), "loss": _num(n.get("loss")),
            "accuracy": "-" if acc is None else f"{100 * acc:.1f} %", "exchanges": _num(n.get("exchanges_done")),
            "skipped": _num(n.get("exchanges_skipped")), "in": _bytes(n.get("bytes_in")),
            "out": _bytes(n.get("bytes_out")), "worker": worker,
            # how far its label distribution is from the others' (0: the same mix, 1: none in common)
            "skew": _num(n.get("label_skew"), 2),
        }
        table.add_row(*(cells[name] for name, _, _ in shown))
    return table


def render(target: Target, view: dict[str, Any] | None, problem: str | None, width: int = WIDE) -> Group:
    nodes = len(view.get("nodes", [])) if view else 0
    omitted = view.get("omitted", 0) if view else 0
    head = Text.assemble(("p2pnode cluster", "bold"), f" via {target.addr}: {nodes} nodes",
                         f" ({omitted} more not shown)" if omitted else "",
                         f"   {time.strftime('%H:%M:%S')}   Ctrl-C to quit", style="")
    parts: list[Any] = [head]
    if problem:
        shown = "  (showing the last view)" if view else ""
        parts.append(Text(f"no answer: {problem}{shown}", style="red"))
    if view:
        parts.append(cluster_table(view, width))
        silent = [f"{str(n.get('node_id'))[:8]} ({n.get('error')})" for n in view.get("nodes", [])
                  if not n.get("reachable") and n.get("error")]
        if silent:
            parts.append(Text("not answering: " + ", ".join(silent), style="yellow"))
        mode: dict[str, Any] = view["mode"] if isinstance(view.get("mode"), dict) else {}
        if mode.get("name"):  # this node's mode and why (exchange.sync = "auto": config/mode_rule.py)
            parts.append(Text(f"mode: {mode['name']} (exchange.sync = {mode.get('setting')}: {mode.get('why')})",
                              style="dim"))
        advice = view.get("advice") or mode.get("advice")
        if advice:
            parts.append(Text(f"advice: {advice}", style="yellow"))
        def moved(e: dict[str, Any]) -> int:
            return int(e.get("bytes_recent") or e.get("bytes_total") or 0)

        edges = sorted((e for e in view.get("edges", []) if moved(e) > 0), key=moved, reverse=True)
        if edges:
            window = view.get("window_s") or 0
            top = ", ".join(f"{str(e['src'])[:8]}→{str(e['dst'])[:8]} {_bytes(moved(e))}" for e in edges[:6])
            when = f"in the last {window:.0f} s" if window else "so far"
            parts.append(Text(f"model bytes {when}: {top}", style="dim"))
    return Group(*parts)


def watch(target: Target, interval: float = 2.0, console: Console | None = None) -> int:
    """Redraw the cluster table every ``interval`` seconds until Ctrl-C (exit 0).

    Ctrl-C only sets a flag (a second one interrupts at once): the loop ends between two
    refreshes, never with ``KeyboardInterrupt`` raised in the middle of a request or a redraw,
    and the last table is drawn whole. The handler is installed explicitly, and SIGINT unblocked,
    so a watch started by a parent that ignored or blocked SIGINT (both inherited through exec)
    still ends on Ctrl-C."""
    console = console or Console()
    asked: list[int] = []  # a plain flag: a handler taking a lock the loop may hold could deadlock

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        if asked:
            raise KeyboardInterrupt
        asked.append(signum)

    previous = signal.signal(signal.SIGINT, on_sigint)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    view: dict[str, Any] | None = None
    try:
        with Live(render(target, None, None), console=console, auto_refresh=False) as live:
            while not asked:
                problem = None
                try:
                    view = fetch_json(target, "/v1/cluster")
                except urllib.error.HTTPError as exc:
                    problem = f"HTTP {exc.code} {exc.reason}" + (" (give --token-file or --secret-file)"
                                                                 if exc.code == 401 else "")
                except (urllib.error.URLError, OSError, ValueError) as exc:
                    problem = str(getattr(exc, "reason", exc))
                live.update(render(target, view, problem, console.width), refresh=True)
                until = time.monotonic() + interval
                while not asked and time.monotonic() < until:
                    time.sleep(min(0.1, interval))
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGINT, previous)
    return 0
