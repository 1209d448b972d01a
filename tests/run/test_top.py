"""`dnsprobe top` against a live capture on a veth pair: its JSON snapshot's figures and top lists checked against
the exact counts of the traffic sent, and its screen (rich, in a tmux session) showing the top names."""

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw
from scapy.utils import wrpcap
from support.data import ROOT
from support.dnsprobe import run_dnsprobe
from support.live import CLIENT_MAC, SERVER_MAC, Probe, VethBed
from support.messages import q_dns, r_dns

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"), reason="needs root and iproute2")

# QNAME → transactions: skewed, with names of one registered domain under two QNAMEs and a multi-label suffix
NAMES = {"www.example.com": 120, "mail.example.com": 60, "shop.example.co.uk": 90, "a.example.org": 30,
         "b.example.org": 25, "rare.example.net": 5}
SERVER = "198.51.100.53"


def client(i):
    return f"192.0.2.{1 + i % 7 if i % 3 else 100}"


@pytest.fixture(scope="module")
def traffic(tmp_path_factory):
    """A pcap of the NAMES' transactions (query and NOERROR response), and the exact counts of what it holds."""
    frames, qnames, clients = [], Counter(), Counter()
    order = [name for name, n in NAMES.items() for _ in range(n)]
    for i, name in enumerate(order[i] for i in sorted(range(len(order)), key=lambda i: (i * 7919) % len(order))):
        c, port, qid = client(i), 20000 + i, i & 0xFFFF
        frames.append(Ether(src=CLIENT_MAC, dst=SERVER_MAC) / IP(src=c, dst=SERVER) / UDP(sport=port, dport=53)
                      / Raw(q_dns(qid, name)))
        frames.append(Ether(src=SERVER_MAC, dst=CLIENT_MAC) / IP(src=SERVER, dst=c) / UDP(sport=53, dport=port)
                      / Raw(r_dns(qid, name)))
        qnames[name] += 1
        clients[c] += 1
    path = tmp_path_factory.mktemp("top") / "top.pcap"
    wrpcap(str(path), frames)
    domains = Counter()
    for name, n in qnames.items():
        domains[".".join(name.split(".")[-3 if name.endswith(".co.uk") else -2:])] += n
    return path, {"qnames": qnames, "registered_domains": domains, "clients": clients}


@pytest.fixture(scope="module")
def captured(traffic, tmp_path_factory):
    """A running capture that has written every transaction of the traffic."""
    pcap, expected = traffic
    out = tmp_path_factory.mktemp("top-out")
    with VethBed() as bed:
        probe = Probe(bed, out, "--set", "capture.top=true", "--set", "export.flush_seconds=0.5")
        try:
            probe.wait_ready()
            bed.send(pcap, pps=2000)
            total = sum(expected["qnames"].values())
            snapshot = None
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                snapshot = json.loads(run_dnsprobe("top", "-o", out, "--json", "-n", "60").stdout)
                if snapshot["transactions"] >= total:
                    break
                time.sleep(0.3)
            yield probe, out, snapshot, expected
        finally:
            assert probe.stop() == 0, probe.stderr
            probe.kill()
    assert not (out / "_dnsprobe.top.sock").exists(), "the socket is removed at the end"


def test_json_snapshot_counts_exactly(captured):
    probe, out, snapshot, expected = captured
    total = sum(expected["qnames"].values())
    assert snapshot["transactions"] == total
    assert snapshot["packets"] >= 2 * total
    assert [(m["name"], m["count"]) for m in snapshot["rcode"]] == [("NOERROR", total)]
    assert [(m["name"], m["count"]) for m in snapshot["qtype"]] == [("A", total)]
    assert snapshot["delay"]["count"] == total
    for key, counts in expected.items():
        got = {e["value"]: e["count"] for e in snapshot[key]}
        assert got == dict(counts), key
        assert all(e["error"] == 0 for e in snapshot[key])
        # ranked: largest first
        assert [e["count"] for e in snapshot[key]] == sorted(got.values(), reverse=True)


def test_socket_mode(captured):
    _, out, _, _ = captured
    assert (out / "_dnsprobe.top.sock").stat().st_mode & 0o777 == 0o660


def test_same_top_lists_as_inspect_summary(captured):
    """The figures of the files written (inspect --summary) are the same as top's."""
    _, out, snapshot, _ = captured
    probe_files = sorted(str(p) for p in out.glob("*.parquet*")) or sorted(str(p) for p in out.glob("*.arrow*"))
    if not probe_files:
        pytest.skip("no file finished yet to summarise")
    summary = json.loads(run_dnsprobe("inspect", "--summary", "--json", *probe_files).stdout)
    for key, column in (("qnames", "qname"), ("clients", "src")):
        top = [(e["value"], e["count"]) for e in snapshot[key]][:5]
        assert [(e[column], e["count"]) for e in summary[key]["top"]][:5] == top


@pytest.mark.skipif(not shutil.which("tmux"), reason="needs tmux")
def test_screen_in_tmux(captured):
    _, out, _, _ = captured
    session = f"dnsprobe-top-{os.getpid()}"
    cmd = f"cd {ROOT} && {sys.executable} -m probe top -o {out} -n 60"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "200", "-y", "60"], check=True)
    try:
        subprocess.run(["tmux", "send-keys", "-t", session, cmd, "Enter"], check=True)
        screen = ""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            time.sleep(0.5)
            screen = subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True,
                                    text=True, check=True).stdout
            if "www.example.com" in screen and "example.co.uk" in screen and "192.0.2.100" in screen:
                break
        for text in ("transactions/s", "www.example.com", "shop.example.co.uk", "example.co.uk", "192.0.2.100",
                     "NOERROR", "top QNAMEs"):
            assert text in screen, f"{text!r} not on the screen:\n{screen}"
        subprocess.run(["tmux", "send-keys", "-t", session, "C-c"], check=True)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], check=False)


def test_no_capture_is_one_line_exit_2(tmp_path):
    proc = run_dnsprobe("top", "-o", tmp_path, "--json", check=False)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "no running capture" in proc.stderr


def screen_text(snapshot):
    import io

    from rich.console import Console

    from probe.cli.top import render

    console = Console(width=200, record=True, file=io.StringIO())
    console.print(render(snapshot, "top.sock"))
    return console.export_text()


def top_json(out):
    return json.loads(run_dnsprobe("top", "-o", out, "--json", "-n", "60").stdout)


def test_on_demand_counts_from_attach_until_idle(traffic, tmp_path):
    """The default capture.top (on-demand): nothing counted before a `top` asks; from its first request on, the
    traffic sent exactly; once none asked for capture.top_idle_seconds, nothing again (what was counted dropped);
    a first request while traffic flows waits for a complete second of it (a `top --json` run once)."""
    pcap, expected = traffic
    total = sum(expected["qnames"].values())
    with VethBed() as bed:
        probe = Probe(bed, tmp_path, "--set", "capture.top_idle_seconds=2", "--set", "export.flush_seconds=0.3")
        try:
            probe.wait_ready()
            bed.send(pcap, pps=4000)
            probe.wait_counter("records", total)  # written before any client: counted by none
            first = top_json(tmp_path)  # the counting starts; no traffic now: it waits its 3 s
            assert first["counting"] and first["counting_since"] is None, first
            assert (first["transactions"], first["packets"]) == (0, 0), "counted before a client asked"
            deadline = time.monotonic() + 10
            while first["counting_workers"] < 1 and time.monotonic() < deadline:
                first = top_json(tmp_path)
            assert first["counting_workers"] == 1
            bed.send(pcap, pps=4000)
            deadline = time.monotonic() + 30
            while (snapshot := top_json(tmp_path))["transactions"] < total and time.monotonic() < deadline:
                time.sleep(0.3)
            assert snapshot["transactions"] == total and snapshot["packets"] == 2 * total
            assert snapshot["delay"]["count"] == total and snapshot["counting_since"] is not None
            for key, counts in expected.items():
                assert {e["value"]: e["count"] for e in snapshot[key]} == dict(counts), key
            assert "counting since" in screen_text(snapshot)  # fewer than its 60 s counted yet
            time.sleep(3.5)  # no request for longer than capture.top_idle_seconds: the workers stop counting
            bed.send(pcap, pps=4000)
            probe.wait_counter("records", 3 * total)
            again = top_json(tmp_path)  # (starts the counting again, after that traffic)
            assert (again["transactions"], again["packets"], again["counting_since"]) == (0, 0, None), again
            # once more idle, then one request while traffic flows: it waits for a complete second of it
            time.sleep(3.5)
            sender = threading.Thread(target=bed.send, args=(pcap,), kwargs={"pps": 200})
            sender.start()
            time.sleep(0.3)
            once = top_json(tmp_path)
            sender.join()
            assert once["transactions"] > 0 and once["last_second"] >= once["counting_since"] + 1, once
        finally:
            assert probe.stop() == 0, probe.stderr
            probe.kill()


def test_top_false_is_one_line_exit_2(tmp_path):
    with VethBed() as bed:
        probe = Probe(bed, tmp_path, "--set", "capture.top=false")
        try:
            probe.wait_ready()
            proc = run_dnsprobe("top", "-o", tmp_path, "--json", check=False)
        finally:
            assert probe.stop() == 0, probe.stderr
            probe.kill()
    assert proc.returncode == 2, proc.stdout
    assert proc.stderr.count("\n") == 1 and "capture.top is false" in proc.stderr


def test_on_demand_costs_a_cdns_worker_no_arrow(traffic, tmp_path):
    """A C-DNS worker writes without Arrow: capture.top on-demand, while nobody asks, must not load it either (its
    import of the counting once took 27 MB of every C-DNS worker's memory through the enrichment package)."""
    pcap, expected = traffic
    with VethBed() as bed:
        probe = Probe(bed, tmp_path, "--set", "export.format=cdns", "--set", "export.flush_seconds=0.3")
        try:
            probe.wait_ready()
            bed.send(pcap, pps=4000)
            probe.wait_counter("records", sum(expected["qnames"].values()))
            pids = {w["pid"] for w in probe.stats()["workers"].values()}
            assert pids
            for pid in pids:
                maps = open(f"/proc/{pid}/maps").read()
                assert "libarrow" not in maps, f"worker {pid} loaded Arrow while nobody asked for top"
        finally:
            assert probe.stop() == 0, probe.stderr
            probe.kill()
