"""Linux network namespaces for real networks on one machine: each node in its own namespace,
all on one bridge in the root namespace, which reaches every node (status polling) through it::

    [ns 0: eth0 10.77.0.1] --veth-- +
    [ns 1: eth0 10.77.0.2] --veth-- + bridge (10.77.0.254, the root namespace)
    ...                             +

A link's rate is limited with a token-bucket filter on both ends of its veth (``set_rate``:
upload and download); ``partition`` cuts groups of nodes off from each other with blackhole
routes inside the namespaces (the bridge, hence polling, keeps working) and ``heal`` removes
them. Bytes on the wire come from the veth counters. Needs root and iproute2 (``unavailable``
says why not); names carry a tag so that parallel runs do not collide.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run one ``ip``/``tc`` command; raises with its stderr when ``check`` and it fails."""
    proc = subprocess.run(list(args), capture_output=True, text=True, timeout=30, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {proc.stderr.strip() or f'exit code {proc.returncode}'}")
    return proc


def unavailable() -> str:
    """Why namespaces cannot be used here ("" when they can): not Linux, not root, no iproute2,
    or the kernel refuses."""
    if sys.platform != "linux":
        return "needs Linux"
    if os.geteuid() != 0:
        return "needs root for network namespaces"
    if shutil.which("ip") is None:
        return "needs iproute2 (ip)"
    probe = f"p2pprobe{os.getpid() % 100000}"
    if sh("ip", "netns", "add", probe, check=False).returncode != 0:
        return "cannot create network namespaces here"
    sh("ip", "netns", "del", probe, check=False)
    return ""


class Topology:
    """``n`` namespaces on one bridge. ``tag`` (at most 5 characters) names everything:
    namespaces ``{tag}n{i}``, host veth ends ``{tag}v{i}``, the bridge ``{tag}br``; ``subnet``
    is the first three octets of the /24 the nodes (``.1`` to ``.n``) and the host (``.254``) share."""

    def __init__(self, n: int, tag: str = "p2pb", subnet: str = "10.77.0") -> None:
        if not 1 <= n <= 250 or len(tag) > 5:
            raise ValueError("1 to 250 nodes and a tag of at most 5 characters")
        self.n = n
        self.bridge = f"{tag}br"
        self.ns = [f"{tag}n{i}" for i in range(n)]
        self.veth = [f"{tag}v{i}" for i in range(n)]  # host ends; the namespace end is eth0
        self.ip = [f"{subnet}.{i + 1}" for i in range(n)]
        self.host_ip = f"{subnet}.254"
        self.cuts: list[tuple[int, str]] = []  # (namespace, blackholed address) of a partition

    def up(self) -> Topology:
        self.down()  # leftovers of an interrupted run
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{self.host_ip}/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        for ns, veth, ip in zip(self.ns, self.veth, self.ip):
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            sh("ip", "link", "set", veth, "master", self.bridge)
            sh("ip", "link", "set", veth, "up")
            sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        return self

    def down(self) -> None:
        for ns, veth in zip(self.ns, self.veth):
            sh("ip", "link", "del", veth, check=False)
            sh("ip", "netns", "del", ns, check=False)
        sh("ip", "link", "del", self.bridge, check=False)
        self.cuts = []

    def __enter__(self) -> Topology:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    def place(self, i: int) -> tuple[list[str], str]:
        """Node i's command prefix and address: for ``benchlib.cluster`` and ``benchlib.ddp``."""
        return ["ip", "netns", "exec", self.ns[i]], self.ip[i]

    def set_rate(self, rate: str, nodes: list[int] | None = None) -> None:
        """Limit both directions of the links of ``nodes`` (default: all) to a tc rate such as
        ``100mbit``; ``unlimited`` removes the limit."""
        for i in range(self.n) if nodes is None else nodes:
            for where, dev in ((["ip", "netns", "exec", self.ns[i]], "eth0"), ([], self.veth[i])):
                sh(*where, "tc", "qdisc", "del", "dev", dev, "root", check=False)
                if rate != "unlimited":
                    # burst: a few full-size packets; latency: how long a packet may queue
                    sh(*where, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
                       "burst", "64kb", "latency", "100ms")

    def partition(self, *groups: list[int]) -> None:
        """Cut every group off from the others (no packet crosses between groups; each node
        still reaches its own group and the host)."""
        for g, group in enumerate(groups):
            others = [j for h, other in enumerate(groups) if h != g for j in other]
            for i in group:
                for j in others:
                    sh("ip", "-n", self.ns[i], "route", "add", "blackhole", f"{self.ip[j]}/32")
                    self.cuts.append((i, self.ip[j]))

    def heal(self) -> None:
        """Undo ``partition``."""
        for i, ip in self.cuts:
            sh("ip", "-n", self.ns[i], "route", "del", "blackhole", f"{ip}/32", check=False)
        self.cuts = []

    def counters(self) -> tuple[int, int]:
        """Bytes all nodes sent and received so far, from the host ends of their veths."""
        sent = received = 0
        for veth in self.veth:
            stats = Path(f"/sys/class/net/{veth}/statistics")
            sent += int((stats / "rx_bytes").read_text())
            received += int((stats / "tx_bytes").read_text())
        return sent, received


def link_bytes(topo: Topology | None) -> list[int]:
    """Bytes each namespace's link of ``topo`` has carried so far, both ways (the host veth
    end's counters); empty on loopback (no topology)."""
    if topo is None:
        return []
    out = []
    for veth in topo.veth:
        stats = Path(f"/sys/class/net/{veth}/statistics")
        out.append(int((stats / "rx_bytes").read_text()) + int((stats / "tx_bytes").read_text()))
    return out
