"""The benchmark harness end to end (`dnsprobe bench --smoke`), and the traffic generator's determinism.

The smoke run proves the harness works, not how fast anything is: no figure of speed is asserted here.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import traffic  # noqa: E402

TOOLS = ("dnsprobe parquet", "dnsprobe cdns", "dnsprobe dpdk-parquet", "dnscap pcap", "netsniff-ng pcap",
         "tcpdump pcap (baseline)")


def test_generator_is_deterministic(tmp_path):
    a, b, c = tmp_path / "a.pcap", tmp_path / "b.pcap", tmp_path / "c.pcap"
    traffic.write_pcap("standard", 3000, 11, a)
    traffic.write_pcap("standard", 3000, 11, b, workers=1)  # also whatever the number of build processes
    traffic.write_pcap("standard", 3000, 12, c)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()


@pytest.mark.skipif(os.geteuid() != 0, reason="dnsprobe bench needs root (network namespace, veth, packet sockets)")
@pytest.mark.skipif(not shutil.which("ip") or not shutil.which("tcpreplay"), reason="needs iproute2 and tcpreplay")
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs: a generator core and a worker core")
def test_bench_smoke(tmp_path):
    res_dir = tmp_path / "results"
    proc = subprocess.Popen([sys.executable, "-m", "probe", "bench", "--smoke", "--no-install", "--results",
                             str(res_dir)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out
    # The testbed is gone: namespace and veth are named after the bench's pid.
    tag = proc.pid % 100000
    assert f"dnsprobe-b{tag}" not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not Path(f"/sys/class/net/dpbc{tag}").exists()

    res = json.loads((res_dir / "suite.json").read_text())
    md = (res_dir / "suite.md").read_text()
    assert "| tool × format | 1 worker |" in md and "| tool × format | 1 worker |" in out
    for key in ("cpu_model", "logical_cpus", "kernel"):
        assert res["machine"][key]
    ran = {s["label"]: s for s in res["series"]}
    for label in TOOLS:  # every tool ran, or was skipped with its reason
        assert label in ran or res["skipped"].get(label), (label, res["skipped"])
    assert "dnsprobe parquet" in ran and "dnsprobe cdns" in ran
    for label, s in ran.items():
        f = s["fixed"]
        assert f["sent"] == f["expected"] == 2000, (label, f)
        assert f["captured"] + f["kernel_drops"] == f["received"] == f["sent"], (label, f)
        assert f["lost"] == f["sent"] - f["captured"]
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
    assert res["plot"] is None or (res_dir / "suite.png").stat().st_size > 0
