"""The benchmark harness end to end (`dnsprobe bench --smoke`, with tcpreplay and with trafgen), the traffic
generator's determinism, and the trafgen configuration made from a pcap (same bytes, same frames on the wire).

The smoke runs prove the harness works, not how fast anything is: no figure of speed is asserted here.
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import live  # noqa: E402
import pytest
import suite  # noqa: E402
import traffic  # noqa: E402
from support.data import ROOT  # also puts benchmarks/ on sys.path
from support.live import Testbed

TOOLS = ("dnsprobe parquet", "dnsprobe cdns", "dnsprobe dpdk-parquet", "dnscap pcap", "netsniff-ng pcap",
         "tcpdump pcap (baseline)")


def test_generator_is_deterministic(tmp_path):
    a, b, c = tmp_path / "a.pcap", tmp_path / "b.pcap", tmp_path / "c.pcap"
    traffic.write_pcap("standard", 3000, 11, a)
    traffic.write_pcap("standard", 3000, 11, b, workers=1)  # also whatever the number of build processes
    traffic.write_pcap("standard", 3000, 12, c)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()
    # The trafgen configuration: the same frames give the same text, one block per frame.
    cfgs = [traffic.trafgen_config(p) for p in (a, b, c)]
    assert [p.name for p in cfgs] == [f"{x}.trafgen-v{traffic.TRAFGEN_CFG_VERSION}.cfg" for x in "abc"]
    assert cfgs[0].read_bytes() == cfgs[1].read_bytes() != cfgs[2].read_bytes()
    assert cfgs[0].read_text().count("{") == 3000
    assert traffic.trafgen_config(a) == cfgs[0]  # cached: not written again
    mtime = cfgs[0].stat().st_mtime_ns
    traffic.trafgen_config(a)
    assert cfgs[0].stat().st_mtime_ns == mtime
    # Fewer frames than the trial sends (trafgen's load time is quadratic): the first ones, repeated.
    first = traffic.trafgen_config(a, frames=100)
    assert first.name == f"a.trafgen-v{traffic.TRAFGEN_CFG_VERSION}-first100.cfg"
    assert first.read_text().count("{") == 100 and cfgs[0].read_text().startswith(first.read_text()[:-1])
    traffic.repeat_pcap(a, 100, 250, tmp_path / "r.pcap")
    head = list(traffic.pcap_frames(a))[:100]
    assert list(traffic.pcap_frames(tmp_path / "r.pcap")) == head + head + head[:50]


NO_TESTBED = ("needs root (network namespace, veth, packet sockets)" if os.geteuid() != 0 else
              "needs iproute2" if not shutil.which("ip") else
              "needs 2 CPUs: a generator core and a worker core" if len(os.sched_getaffinity(0)) < 2 else None)
needs_testbed = pytest.mark.skipif(NO_TESTBED is not None, reason=str(NO_TESTBED))
needs_trafgen = pytest.mark.skipif(not shutil.which("trafgen"), reason="needs trafgen (Debian package netsniff-ng)")


class Veth(Testbed):
    """The bench's testbed under names of this test's own (other tests use veth pairs at the same time)."""

    def __init__(self):
        super().__init__("s", pairs=1)


@pytest.mark.parametrize("mix,packets", [("standard", 400), ("large", 150)])
@needs_testbed
@needs_trafgen
def test_trafgen_config_sends_the_pcap(tmp_path, mix, packets):
    """trafgen with the configuration made from a pcap puts the pcap's frames on the veth: same bytes, same order."""
    pcap = tmp_path / f"{mix}.pcap"
    traffic.write_pcap(mix, packets, 5, pcap, workers=1)
    want = list(traffic.pcap_frames(pcap))
    with Veth() as bed:
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))  # ETH_P_ALL
        try:
            sock.setsockopt(socket.SOL_SOCKET, 33, 16 << 20)  # SO_RCVBUFFORCE: hold every frame
            sock.bind((bed.iface, 0))
            sent, gen = suite.send(bed, "trafgen", pcap, None, packets)  # as fast as it goes
            sock.settimeout(2)
            got = [sock.recv(65535) for _ in range(sent)]
        finally:
            sock.close()
    assert not Path(f"/sys/class/net/{bed.iface}").exists()
    assert gen["name"] == "trafgen" and gen["mode"] == "topspeed"
    assert sent == gen["reported"] == gen["veth_rx"] == packets and gen["failed"] == 0
    assert got == want


def run_bench(tmp_path, *args):
    """`dnsprobe bench --smoke ARGS`: (printed output, suite.json, suite.md); the testbed must be gone after."""
    res_dir = tmp_path / "results"
    cmd = [sys.executable, "-m", "probe", "bench", "--smoke", "--no-install", "--results", str(res_dir), *args]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out
    # The testbed is gone: namespace and veth are named after the bench's pid.
    tag = proc.pid % 100000
    assert f"dnsprobe-b{tag}" not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not Path(f"/sys/class/net/dpbc{tag}").exists()
    return out, json.loads((res_dir / "suite.json").read_text()), (res_dir / "suite.md").read_text()


def check_fixed(f, generator):
    """A fixed-rate trial's figures add up: captured + dropped = received = sent = what the generator sent."""
    what = {k: f.get(k) for k in ("tool", "format", "sent", "expected", "received", "kernel_drops", "captured", "drops",
                                  "frame_kinds", "generator")}
    assert f["sent"] == f["expected"] == 2000, what
    assert f["captured"] + f["kernel_drops"] == f["received"] == f["sent"], what
    assert f["lost"] == f["sent"] - f["captured"]
    assert f["generator"]["name"] == generator and f["generator"]["veth_rx"] == f["sent"], what
    assert f["generator"]["failed"] == 0


@needs_testbed
@needs_trafgen
def test_bench_smoke_trafgen(tmp_path):
    out, res, md = run_bench(tmp_path, "--generator", "trafgen", "--tools", "dnsprobe,tcpdump", "--formats",
                             "parquet", "--offline-mixes", "")
    assert res["generators"]["requested"] == "trafgen" and res["tool_versions"]["trafgen"]
    ran = {s["label"]: s for s in res["series"]}
    assert set(ran) == {"dnsprobe parquet", "tcpdump pcap (baseline)"}, res["skipped"]
    for s in ran.values():
        f = s["fixed"]
        check_fixed(f, "trafgen")
        assert f["generator"]["reported"] == f["sent"] and f["generator"]["mode"] == f"{suite.SMOKE_RATE:,} pkts/s"
        assert f["generator"]["config"] == f"standard-n2000-s1-v2.trafgen-v{traffic.TRAFGEN_CFG_VERSION}.cfg"
        assert s["best_generator"] == "trafgen"
    assert "| dnsprobe parquet | 1 | trafgen | " in md  # the fixed-rate trials' generator column
    assert "Traffic: trafgen for every trial" in md and "(trafgen)" in out


@needs_testbed
@pytest.mark.skipif(not shutil.which("tcpreplay"), reason="needs tcpreplay")
def test_bench_smoke(tmp_path):
    out, res, md = run_bench(tmp_path)
    assert "| tool × format | 1 worker |" in md and "| tool × format | 1 worker |" in out
    # A smoke run's figures are start-up dominated: it says so, and gives no ratios.
    assert suite.SMOKE_NOTE in out and suite.SMOKE_NOTE in md and res["smoke"] and res["ratios"] == []
    assert "loss-free rate ×" not in out + md
    for key in ("cpu_model", "logical_cpus", "kernel"):
        assert res["machine"][key]
    ran = {s["label"]: s for s in res["series"]}
    for label in TOOLS:  # every tool ran, or was skipped with its reason
        assert label in ran or res["skipped"].get(label), (label, res["skipped"])
    assert "dnsprobe parquet" in ran and "dnsprobe cdns" in ran
    gens = res["generators"]  # auto: tcpreplay below its measured reach, which the smoke rate is
    assert gens["requested"] == "auto"
    assert not gens["trafgen"] or gens["tcpreplay_max_pps"] > suite.SMOKE_RATE < gens["tcpreplay_topspeed_pps"]
    for label, s in ran.items():
        f = s["fixed"]
        check_fixed(f, "tcpreplay")
        assert len(f["cpu_seconds_per_worker"]) == len(f["peak_rss_mb_per_worker"]) == 1
        assert f["cpu_us_per_packet"] and f["cpu_us_per_packet"] > 0
        assert label in md
        if s["tool"] != "dnsprobe":
            assert f["written"] <= f["captured"]
    if "dnsprobe parquet" in ran and "dnsprobe cdns" in ran:  # same traffic, same transactions
        assert ran["dnsprobe parquet"]["fixed"]["written"] == ran["dnsprobe cdns"]["fixed"]["written"] > 0
    if "dnscap pcap" in ran:
        assert ran["dnscap pcap"]["fixed"]["expected_written"] == res["dnscap_expected_written"] > 0
    off = {(r["tool"], r["format"]) for r in res["offline"]}
    assert {("dnsprobe read", "parquet"), ("dnsprobe read", "cdns")} <= off
    assert res["plot"] is None or (tmp_path / "results" / "suite.png").stat().st_size > 0


@pytest.mark.parametrize("limit,best,fail,topspeed", [
    (500_000, 330_000, None, True),  # nothing fails: trafgen as fast as it goes passes, a lower bound
    (250_000, 189_000, 330_000, True),  # tcpreplay's reach passes, trafgen's rate fails
    (60_000, 50_000, 75_000, False),  # fails within tcpreplay's reach: bisection there, no trafgen
])
def test_auto_search_stays_within_each_generators_reach(limit, best, fail, topspeed):
    """auto: the search climbs no further than --tcpreplay-max with tcpreplay, then one trafgen trial at its own
    rate; rates between the two (which neither generator can offer) are not bisected."""
    opts = argparse.Namespace(rates=None, ladder="25k,50k,100k,200k,400k", max_rate=1_000_000, resolution=25_000,
                              tcpreplay_max=189_000, generator="auto", generator_cmd=None)

    def trial(rate):  # a capturer that loses nothing up to `limit` pkts/s; trafgen reaches 330k
        actual = 330_000 if suite.pick_generator(rate, opts) == "trafgen" else rate
        return {"offered_pps": rate, "actual_pps": actual, "passed": actual <= limit,
                "generator_limited": actual < live.GENERATOR_SHORTFALL * rate}

    got_best, got_fail, trials = suite.search_rates(trial, opts)
    assert (got_best, got_fail) == (best, fail)
    assert max(trials) == (1_000_000 if topspeed else 100_000)
    assert all(r <= 189_000 for r in trials if r != 1_000_000)
