"""The benchmark harness end to end (`dnsprobe bench --smoke`, with tcpreplay and with trafgen), the traffic
generator's determinism, and the trafgen configuration made from a pcap (same bytes, same frames on the wire).

The smoke runs prove the harness works, not how fast anything is: no figure of speed is asserted here.
"""

import argparse
import json
import math
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import live  # noqa: E402
import pytest
import scaling  # noqa: E402
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


def test_core_plan_one_generator_per_pair_of_workers():
    """The bench's core plans on a 16-CPU host: ceil(N/2) generator cores first, the workers on the next cores;
    a plan that does not fit says how many cores it needs (workers + generators)."""
    cpus = range(16)
    plans = {n: scaling.core_plan(n, cpus) for n in (1, 2, 4, 8, 10, 11, 16)}
    assert plans[1] == {"workers": 1, "generators": 1, "needs": 2, "short": 0, "generator_cores": [0],
                        "worker_cores": [1]}
    assert plans[8]["generator_cores"] == [0, 1, 2, 3] and plans[8]["worker_cores"] == list(range(4, 12))
    assert plans[10]["needs"] == 15 and not plans[10]["short"]  # the largest that fits 16 CPUs
    assert (plans[11]["needs"], plans[11]["short"], plans[11]["worker_cores"]) == (17, 1, [])
    assert plans[16]["needs"] == 24 and plans[16]["generators"] == 8
    assert "needs 24 cores (this machine has 16)" in scaling.plan_text(plans[16], 16)
    # --generator-core 5 and --cores 8-11: generators on 5 then the lowest free cores; an external generator: none.
    p = scaling.core_plan(4, cpus, generator_core=5, worker_cores=[8, 9, 10, 11])
    assert (p["generator_cores"], p["worker_cores"], p["short"]) == ([5, 0], [8, 9, 10, 11], 0)
    assert scaling.core_plan(4, [1, 2, 3], generators=0)["needs"] == 4
    assert scaling.core_plan(3, [1, 2, 3], generators=0)["worker_cores"] == [1, 2, 3]
    # The model: the workers' bound grows with N, the generators' with ceil(N/2); the lower one is the rate.
    assert scaling.predict(1, 1.0, generator_us=0.5) == (1_000_000, "workers")
    rate, bound = scaling.predict(4, 1.0, generator_us=1.0, imbalance=1.0, corun=0.0)
    assert (rate, bound) == (2_000_000, "generators")
    assert scaling.predict(4, 1.0, generators=0, imbalance=1.0, corun=0.0) == (4_000_000, "workers")


def test_bench_plan_refuses_what_the_cores_do_not_allow():
    """`dnsprobe bench --plan --workers 1,2,4,8`: the plan of each count, run nothing (no root needed); the counts
    whose workers and generators do not fit this machine's CPUs are `not measured: needs K cores`."""
    usable = len(os.sched_getaffinity(0))
    proc = subprocess.run([sys.executable, "-m", "probe", "bench", "--plan", "--workers", "1,2,4,8"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for n, gens in ((1, 1), (2, 1), (4, 2), (8, 4)):
        head = f"{n} worker{'s' if n > 1 else ''}, {gens} generator{'s' if gens > 1 else ''}: "
        if n + gens > usable:
            assert f"{head}not measured: needs {n + gens} cores (this machine has {usable})" in proc.stdout
        else:
            assert head + "generator cores [" in proc.stdout
    assert "model (reference figures): parquet " in proc.stdout


@needs_testbed
@pytest.mark.skipif(not shutil.which("tcpreplay"), reason="needs tcpreplay")
def test_bench_smoke_needs_cores_rows(tmp_path):
    """`dnsprobe bench --smoke --workers 1,2,4,8`: the counts that fit run, the others are rows `not measured:
    needs K cores` in the table, the JSON and the table beside DNS Probe's (with the model's prediction)."""
    out, res, md = run_bench(tmp_path, "--workers", "1,2,4,8", "--tools", "dnsprobe", "--formats", "parquet",
                             "--generator", "tcpreplay", "--offline-mixes", "")
    usable = len(os.sched_getaffinity(0))
    short = {n for n in (1, 2, 4, 8) if n + math.ceil(n / 2) > usable}
    assert set(map(int, res["not_measured"])) == short and 1 not in short
    assert {s["workers"] for s in res["series"]} == {1, 2, 4, 8} - short
    for n in short:
        k = n + math.ceil(n / 2)
        assert res["not_measured"][str(n)].startswith(f"needs {k} cores")
        assert res["core_plans"][str(n)]["needs"] == k
        assert f"not measured: needs {k} cores" in md and f"not measured: needs {k} cores" in out
    one = next(s for s in res["series"] if s["workers"] == 1)
    assert one["fixed"]["cores"] == res["core_plans"]["1"]["worker_cores"]
    assert one["model"]["pps"] > 0 and one["model"]["worker_us"] == one["fixed"]["cpu_us_per_packet"]
    assert "| threads (workers) | pkts/s | pkts/s per thread | format |" in md
    assert "| DNS Probe, per thread | 487,000 |" in md and "| 1 | " in md


@needs_testbed
@pytest.mark.skipif(not shutil.which("tcpreplay"), reason="needs tcpreplay")
def test_parallel_generators_send_every_frame(tmp_path):
    """Two generators (one per pair of workers on a bigger host), each on its own core, send the pcap split by
    client: every frame arrives once, each part in its order, and a client's frames are all in one part."""
    pcap = tmp_path / "standard.pcap"
    traffic.write_pcap("standard", 600, 7, pcap, workers=1)
    want = list(traffic.pcap_frames(pcap))
    parts = [list(traffic.pcap_frames(p)) for p in scaling.split_pcap(pcap, 2)]
    assert sorted(parts[0] + parts[1]) == sorted(want) and parts[0] and parts[1]
    assert all(scaling.flow_part(f, 2) == i for i, part in enumerate(parts) for f in part)
    cores = sorted(os.sched_getaffinity(0))[:2]
    opts = argparse.Namespace(generator="tcpreplay", generator_cmd=None, tcpreplay_max=None, trafgen_frames=None,
                              generator_cores=cores)
    with Veth() as bed:
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))  # ETH_P_ALL
        try:
            sock.setsockopt(socket.SOL_SOCKET, 33, 16 << 20)  # SO_RCVBUFFORCE: hold every frame
            sock.bind((bed.iface, 0))
            sent, gen = suite.run_generator(bed, pcap, 20_000, len(want), opts)
            sock.settimeout(2)
            got = [sock.recv(65535) for _ in range(sent)]
        finally:
            sock.close()
    assert sent == gen["veth_rx"] == len(want) and gen["failed"] == 0 and gen["cores"] == cores
    assert [g["mode"] for g in gen["parts"]] == [f"{round(20_000 * len(p) / len(want)):,} pkts/s" for p in parts]
    assert sorted(got) == sorted(want)
    for i, part in enumerate(parts):
        assert [f for f in got if scaling.flow_part(f, 2) == i] == part


def test_docs_have_the_models_table():
    """docs/performance.md's "Scaling model" table is what scaling.model_lines() gives for the reference figures."""
    doc = (ROOT / "docs" / "performance.md").read_text()
    section = doc[doc.index("## Scaling model"):doc.index("## Reproducing them")]
    assert "\n".join(scaling.model_lines()) in section
