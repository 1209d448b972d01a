"""Resource bounds under attack, short (benchmarks/floods.py runs each flood for 60 s at the highest rate and
reports peak RSS): each flood's frames, as trafgen makes them for the benchmark, with normal traffic mixed in
(support.captures.build_traffic's transactions: UDP, TCP, IPv6, VLAN, fragmented responses; one normal frame after every
few flood frames), replayed into `dnsprobe capture` with small bounds. The bound is reached and its evictions
counted; every normal transaction is still exported, query and response matched, as `dnsprobe read` of the
normal traffic alone exports it; nothing is lost or restarted.

- queries: unanswered UDP queries with random IDs, match.max_pending 500 (match_evicted);
- tcp: connections that never finish a message, decode.tcp_max_bytes 200,000 (tcp_evicted: the oldest go
  first, so a normal connection survives while fewer connections than the bound holds follow it);
- fragments: first fragments that never complete, decode.fragment_max_datagrams 100 (fragments_dropped);
- transfers: UDP pairs of an AXFR query and a response that leaves the transfer open, match.max_transfers 100
  (transfers_evicted: the transfers beyond the bound are closed early, oldest first, and exported).
"""

import os
import shutil
import struct

import floods  # (benchmarks/, on the path through support)
import pytest
from support.captures import build_traffic
from support.dnsprobe import rows_of, run_dnsprobe

from probe.capture.pcapfile import read_capture

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("trafgen"),
                                reason="needs root, iproute2 and trafgen")

FLOODS = {  # kind: (flood frames, flood frames between two normal ones, bound, counter, at least evicted)
    "queries": (6000, 10, "match.max_pending=500", "match_evicted", 5000),
    "tcp": (2000, 4, "decode.tcp_max_bytes=200000", "tcp_evicted", 400),
    "fragments": (3000, 6, "decode.fragment_max_datagrams=100", "fragments_dropped", 2800),
    "transfers": (3000, 6, "match.max_transfers=100", "transfers_evicted", 1350),
}


@pytest.fixture(scope="module")
def normal(tmp_path_factory):
    """The normal traffic and the transactions `dnsprobe read` exports from it (QNAME, both present)."""
    tmp = tmp_path_factory.mktemp("normal")
    build_traffic(tmp / "normal.pcap", 1, 120)
    (tmp / "out").mkdir()
    run_dnsprobe("read", tmp / "normal.pcap", "-o", tmp / "out", "-q", "--no-progress")
    return tmp / "normal.pcap", sorted((r["qname"], r["query_present"], r["response_present"])
                                       for r in rows_of(tmp / "out"))


def mixed(flood, normal, every, path):
    """The flood's frames with a normal frame after every `every` of them (the rest of the normal ones after)."""
    frames = [f for b in read_capture(flood) for f in b.data]
    extra = [f for b in read_capture(normal) for f in b.data]
    out = []
    for i, f in enumerate(frames):
        out.append(f)
        if i % every == every - 1 and extra:
            out.append(extra.pop(0))
    out += extra
    with open(path, "wb") as fh:
        fh.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
        for i, f in enumerate(out):
            fh.write(struct.pack("<IIII", 1_700_000_000, i, len(f), len(f)) + f)
    return path


@pytest.mark.parametrize("kind", FLOODS)
def test_flood_is_bounded_and_normal_traffic_exported(kind, testbed, probes, out_dir, tmp_path, normal):
    count, every, bound, counter, evicted = FLOODS[kind]
    pcap = mixed(floods.flood_pcap(kind, count, tmp_path / "flood.pcap"), normal[0], every, tmp_path / "mixed.pcap")
    probe = probes(testbed, out_dir, "--set", bound)
    probe.wait_ready()
    testbed.send(pcap, pps=10000)
    running = probe.wait_for(lambda d: (c := d["counters"])["kernel_received"] > count
                             and c["packets"] + c["kernel_drops"] >= c["kernel_received"], "every frame read")
    assert probe.stop() == 0, probe.stderr
    c = probe.stats()["counters"]
    assert c["kernel_drops"] == 0 and c["worker_restarts"] == 0 and c["lost_in_dead_worker"] == 0
    # Evicted while running (at the stop, what is held is flushed and counted too).
    assert running["counters"][counter] >= evicted, (counter, running["counters"][counter])
    rows = rows_of(out_dir)
    assert len(rows) == c["records"]
    got = sorted((r["qname"], r["query_present"], r["response_present"]) for r in rows
                 if r["qname"] != "flood.example.com")
    assert got == normal[1]
