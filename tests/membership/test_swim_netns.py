"""A real network partition: two groups of daemons in two Linux network namespaces.

Topology (names carry the test's pid, so parallel runs do not collide)::

    [ns A: a1, a2 @ 10.213.X.1] ==cluster veth== [ns B: b1, b2 @ 10.213.X.2]
          |  mgmt veth 10.214.X.0/24                  |  mgmt veth 10.215.X.0/24
          +------------------ host (the test polls /v1/status) ------------------+

The cluster link is cut for 30 s (``tc netem loss 100%`` where the kernel has netem, else
``ip link set down``) and restored; afterwards every node must see every other alive again
within one push-pull interval (30 s) plus 5 s. Needs root and iproute2; skipped otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nodes import FAST, get_json, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.netns]

SWIM = ["--set", "membership.protocol=swim", "--set", "training.max_samples=128"]
PUSH_PULL_INTERVAL = 30.0  # SwimConfig.lan()
CUT_SECONDS = 30.0


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), check=check, capture_output=True, text=True, timeout=20)


class Topology:
    def __init__(self) -> None:
        tag = os.getpid() % 10000
        x = os.getpid() % 250 + 1
        self.ns = (f"swimA{tag}", f"swimB{tag}")
        self.cluster_if = (f"sc{tag}a", f"sc{tag}b")
        self.mgmt_if = ((f"sm{tag}a", f"sm{tag}A"), (f"sm{tag}b", f"sm{tag}B"))  # (host end, ns end)
        self.cluster_ip = (f"10.213.{x}.1", f"10.213.{x}.2")
        self.mgmt_ip = (f"10.214.{x}.1", f"10.215.{x}.1")
        self.host_ip = (f"10.214.{x}.254", f"10.215.{x}.254")
        self.cut_with = ""

    def up(self) -> None:
        for ns in self.ns:
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "link", "add", self.cluster_if[0], "type", "veth", "peer", "name", self.cluster_if[1])
        for side in (0, 1):
            ns, ifname = self.ns[side], self.cluster_if[side]
            sh("ip", "link", "set", ifname, "netns", ns)
            sh("ip", "-n", ns, "addr", "add", f"{self.cluster_ip[side]}/24", "dev", ifname)
            sh("ip", "-n", ns, "link", "set", ifname, "up")
            host_end, ns_end = self.mgmt_if[side]
            sh("ip", "link", "add", host_end, "type", "veth", "peer", "name", ns_end)
            sh("ip", "link", "set", ns_end, "netns", ns)
            sh("ip", "addr", "add", f"{self.host_ip[side]}/24", "dev", host_end)
            sh("ip", "link", "set", host_end, "up")
            sh("ip", "-n", ns, "addr", "add", f"{self.mgmt_ip[side]}/24", "dev", ns_end)
            sh("ip", "-n", ns, "link", "set", ns_end, "up")

    def cut(self) -> None:
        ns, ifname = self.ns[0], self.cluster_if[0]
        if sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", ifname, "root", "netem", "loss", "100%",
              check=False).returncode == 0:
            sh("ip", "netns", "exec", self.ns[1], "tc", "qdisc", "add", "dev", self.cluster_if[1], "root", "netem",
               "loss", "100%")
            self.cut_with = "tc netem loss 100%"
        else:
            sh("ip", "-n", ns, "link", "set", ifname, "down")
            self.cut_with = "ip link set down"

    def heal(self) -> None:
        if self.cut_with.startswith("tc"):
            for side in (0, 1):
                sh("ip", "netns", "exec", self.ns[side], "tc", "qdisc", "del", "dev", self.cluster_if[side], "root")
        else:
            sh("ip", "-n", self.ns[0], "link", "set", self.cluster_if[0], "up")

    def down(self) -> None:
        for host_end, _ in self.mgmt_if:
            sh("ip", "link", "del", host_end, check=False)
        for ns in self.ns:
            sh("ip", "netns", "del", ns, check=False)


class NsNode:
    def __init__(self, topo: Topology, side: int, port: int, name: str, root: Path, seeds: list[str]) -> None:
        self.name = name
        self.ns = topo.ns[side]
        self.addr = f"{topo.cluster_ip[side]}:{port}"  # what peers use
        self.mgmt = f"{topo.mgmt_ip[side]}:{port}"  # what the test polls
        self.log_path = root / f"{name}.log"
        cmd = ["ip", "netns", "exec", self.ns, sys.executable, "-m", "p2pnode", "start",
               "--listen", f"0.0.0.0:{port}", "--advertise", self.addr, "--state-dir", str(root / name),
               *FAST, *SWIM]
        for s in seeds:
            cmd += ["--seed", s]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})

    def view(self) -> dict[str, str]:
        return {m["node_id"]: m["state"] for m in get_json(self.mgmt)["members"]}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _can_use_netns() -> str:
    if sys.platform != "linux":
        return "needs Linux"
    if os.geteuid() != 0:
        return "needs root for network namespaces"
    if shutil.which("ip") is None:
        return "needs iproute2 (ip)"
    probe = f"swimprobe{os.getpid() % 10000}"
    if sh("ip", "netns", "add", probe, check=False).returncode != 0:
        return "cannot create network namespaces here"
    sh("ip", "netns", "del", probe, check=False)
    return ""


@pytest.mark.timeout(300)
def test_partition_of_two_namespaces_heals(tmp_path: Path) -> None:
    reason = _can_use_netns()
    if reason:
        pytest.skip(reason)
    topo = Topology()
    nodes: list[NsNode] = []
    try:
        topo.up()
        a1 = NsNode(topo, 0, 7101, "a1", tmp_path, [])
        nodes.append(a1)
        wait_for(lambda: get_json(a1.mgmt)["joined"], 60, "a1 to start")
        for side, port, name in ((0, 7102, "a2"), (1, 7101, "b1"), (1, 7102, "b2")):
            nodes.append(NsNode(topo, side, port, name, tmp_path, [a1.addr]))
        ids = {n.name: wait_for(lambda n=n: get_json(n.mgmt)["joined"] and get_json(n.mgmt)["node_id"], 90,
                                f"{n.name} to join") for n in nodes}
        for n in nodes:
            wait_for(lambda n=n: set(n.view().values()) == {"alive"} and len(n.view()) == 4, 20,
                     f"{n.name} to see all four alive")

        topo.cut()
        time.sleep(CUT_SECONDS)
        side_a, side_b = nodes[:2], nodes[2:]
        during = {n.name: n.view() for n in nodes}
        for n in side_a:
            assert all(during[n.name][ids[m.name]] in ("suspect", "dead") for m in side_b), during
            assert all(during[n.name][ids[m.name]] == "alive" for m in side_a), during
        for n in side_b:
            assert all(during[n.name][ids[m.name]] in ("suspect", "dead") for m in side_a), during

        topo.heal()
        healed = time.monotonic()
        for n in nodes:
            remaining = PUSH_PULL_INTERVAL + 5 - (time.monotonic() - healed)
            wait_for(lambda n=n: set(n.view().values()) == {"alive"} and len(n.view()) == 4, max(remaining, 0.1),
                     f"{n.name} to see all four alive after the heal ({topo.cut_with})", interval=0.25)
        took = time.monotonic() - healed
        print(f"\npartition by {topo.cut_with}: states during the cut {sorted({s for v in during.values() for s in v.values()})}; "
              f"healed in {took:.1f} s")
    except BaseException:
        for n in nodes:
            sys.stderr.write(f"\n----- {n.name} -----\n{n.log_path.read_text(errors='replace')[-4000:]}\n")
        raise
    finally:
        for n in nodes:
            n.stop()
        topo.down()
