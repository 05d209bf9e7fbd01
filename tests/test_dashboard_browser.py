"""The dashboard in a real headless Chromium, against a real 3-node cluster.

Debian's ``chromium`` (``/usr/bin/chromium``, or ``$P2PNODE_CHROMIUM``) driven by Playwright's
Python client; the browser Playwright would download is never used (``playwright install``
cannot work offline). Skipped, saying why, where either is missing: ``scripts/setup.sh``
installs both where it can. The run writes a screenshot under pytest's tmp dir (path printed).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nodes import STUB, NodeProc, wait_for

pytestmark = pytest.mark.slow

CHROMIUM = os.environ.get("P2PNODE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.fixture
def browser() -> Iterator[Any]:
    if not (Path(CHROMIUM).is_file() or shutil.which(CHROMIUM)):
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium, or set P2PNODE_CHROMIUM)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the playwright Python client is not installed (pip install -e '.[test]')")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, timeout=60_000)
        try:
            yield b
        finally:
            b.close()


def three_nodes(cluster: Any) -> list[NodeProc]:
    """Three real daemons with the torch-free worker (nodes.STUB): the page is the point, and the
    stub reports loss, accuracy, rate and bytes as the torch worker does."""
    a = cluster("a", extra=STUB)
    a.wait_ready()
    nodes = [a, cluster("b", seeds=[a.addr], extra=STUB), cluster("c", seeds=[a.addr], extra=STUB)]
    ids = {n.wait_ready()["node_id"] for n in nodes}
    for n in nodes:
        wait_for(lambda n=n: {m["node_id"] for m in n.status()["members"] if m["state"] == "alive"} == ids, 30,
                 f"{n.name} to see all three members")
        wait_for(lambda n=n: n.status()["exchanges"]["done"] >= 2, 40, f"{n.name} to exchange")
    return nodes


def points(page: Any, chart: str) -> int:
    return int(page.eval_on_selector(f"#{chart}", "e => Number(e.dataset.points || 0)"))


def wait_js(page: Any, expression: str, timeout: float, what: str, arg: Any = None) -> None:
    """Poll a JavaScript expression until true. Not ``page.wait_for_function``: its polling
    compiles the predicate inside the page, which the page's CSP (no 'unsafe-eval') forbids."""
    wait_for(lambda: page.evaluate(expression, arg), timeout, what)


@pytest.mark.timeout(240)
def test_dashboard_shows_the_cluster_live(cluster: Any, browser: Any, tmp_path: Path) -> None:
    nodes = three_nodes(cluster)
    ids = [n.status()["node_id"] for n in nodes]
    page = browser.new_page(viewport={"width": 1280, "height": 960})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning")
            else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url} {r.failure}"))
    page.on("response", lambda r: problems.append(f"HTTP {r.status} for {r.url}") if r.status >= 400 else None)
    page.on("request", lambda r: problems.append(f"request off this node: {r.url}")
            if not r.url.startswith(f"http://{nodes[0].addr}/") else None)

    page.goto(f"http://{nodes[0].addr}/", wait_until="load")
    # All three nodes: a row each in the cluster table and a circle each in the exchange graph.
    wait_js(page, "document.querySelectorAll('#cluster tbody tr').length === 3", 20, "three rows")
    table = page.inner_text("#cluster tbody")
    for node_id in ids:
        assert node_id[:8] in table
        assert page.locator(f'#graph g.node[data-node="{node_id}"]').count() == 1
    assert "unreachable" not in table
    # Charts gain points while we watch (one a second on the node, fetched every two).
    charts = ["chart-loss", "chart-accuracy", "chart-rate", "chart-bytes"]
    before = {c: points(page, c) for c in charts}
    wait_js(page, "([names, before]) => names.every((n, i) => Number(document.getElementById(n).dataset.points) "
            ">= before[i] + 2)", 20, "two more points on every chart", [charts, [before[c] for c in charts]])
    assert page.locator("#chart-loss polyline.series").count() == 1
    # The nodes exchange models: the graph has edges between them.
    wait_js(page, "document.querySelectorAll('#graph line.edge').length >= 2", 20, "edges in the graph")
    assert page.locator("#members tbody tr").count() == 3
    # the mode and why: "auto" without a cluster secret picks gossip (config/mode_rule.py)
    assert page.inner_text("#node-mode").startswith("mode: gossip (exchange.sync = auto: no cluster secret")
    assert page.is_hidden("#problem")
    shot = tmp_path / "dashboard.png"
    page.screenshot(path=str(shot), full_page=True)
    print(f"dashboard screenshot: {shot}")
    assert shot.stat().st_size > 10_000
    assert problems == []
