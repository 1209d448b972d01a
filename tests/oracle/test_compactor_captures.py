"""compactor's real server captures: our counts equal those in its .info files.

knot-live: every figure equal. nsd-live: one documented difference, checked exactly: three queries
(frames 11109, 15402, 17767) carry a QNAME longer than the 255-byte limit of RFC 1035. dpkt and
tshark reject those names ("name longer than 255 bytes", "<Name too long>"), and so do we: the three
queries are malformed, and the server's answers to two of them become response-only. compactor
counts one malformed message and matches two of those pairs. So for nsd-live:
malformed = compactor + 2, response_only = compactor + 2, matched = compactor - 2.

Non-DNS: compactor reports ICMP/ICMPv6 destination-unreachable errors as address events rather than
non-DNS packets; we count them apart (icmp_unreachable), and non_dns then equals compactor's figure.
"""

import json
import re

import dpkt
import pytest
from support.data import COMPACTOR_DATA, needs_shared
from support.dnsprobe import read_output, run_dnsprobe

from probe.capture.pcapfile import read_capture

INFO_FIELDS = {
    "packets": r"Total Packets received\s*:\s*(\d+)",
    "matched": r"Matched DNS query/response pairs \(C-DNS\)\s*:\s*(\d+)",
    "query_only": r"Unmatched DNS queries\s+\(C-DNS\)\s*:\s*(\d+)",
    "response_only": r"Unmatched DNS responses\s+\(C-DNS\)\s*:\s*(\d+)",
    "malformed": r"Malformed DNS messages\s+\(C-DNS\)\s*:\s*(\d+)",
    "non_dns": r"Non-DNS packets\s*:\s*(\d+)",
}


def _info(name):
    text = (COMPACTOR_DATA / name).read_text()
    return {key: int(re.search(rx, text).group(1)) for key, rx in INFO_FIELDS.items()}


def _icmp_events(name):
    text = (COMPACTOR_DATA / name).read_text()
    return sum(int(n) for n in re.findall(r"Code:\s*\d+\s+Count:\s*(\d+)", text))


def _run(pcap, out_dir):
    run_dnsprobe("read", pcap, "-o", out_dir, "-q", "--no-progress")
    stats = json.loads(next(out_dir.glob("*.stats.json")).read_text())["counters"]
    return stats, read_output(out_dir)


@needs_shared
def test_knot_live_counts_equal_compactor(out_dir):
    info = _info("knot-live.info")
    stats, table = _run(COMPACTOR_DATA / "knot-live.raw.pcap.xz", out_dir)
    for key, want in info.items():
        assert stats[key] == want, key
    assert stats["icmp_unreachable"] == _icmp_events("knot-live.info")
    assert table.num_rows == info["matched"] + info["query_only"] + info["response_only"] + info["malformed"]


@needs_shared
def test_nsd_live_counts_equal_compactor_but_overlong_names(out_dir):
    info = _info("nsd-live.info")
    stats, table = _run(COMPACTOR_DATA / "nsd-live.raw.pcap.xz", out_dir)
    assert stats["packets"] == info["packets"]
    assert stats["non_dns"] == info["non_dns"]
    assert stats["query_only"] == info["query_only"]
    assert stats["malformed"] == info["malformed"] + 2
    assert stats["response_only"] == info["response_only"] + 2
    assert stats["matched"] == info["matched"] - 2
    assert stats["icmp_unreachable"] == _icmp_events("nsd-live.info")
    malformed = table.filter(table["malformed"]).to_pylist()
    assert len(malformed) == 3
    assert all(r["query_present"] and r["qname"] is None for r in malformed)


@needs_shared
def test_nsd_live_malformed_frames_are_overlong_names_for_dpkt():
    """The independent evidence for the difference above: dpkt refuses exactly those frames."""
    frames = {}
    n = 0
    for batch in read_capture(COMPACTOR_DATA / "nsd-live.raw.pcap.xz"):
        for data in batch.data:
            n += 1
            if n in (11109, 15402, 17767):
                frames[n] = data
    assert sorted(frames) == [11109, 15402, 17767]
    for data in frames.values():
        udp = dpkt.ethernet.Ethernet(data).data.data
        with pytest.raises(dpkt.UnpackError, match="longer than 255"):
            dpkt.dns.DNS(udp.data)


@needs_shared
def test_gold_capture_all_matched(out_dir):
    info = _info("gold.pcap.info")
    stats, table = _run(COMPACTOR_DATA / "gold.pcap.xz", out_dir)
    assert stats["packets"] == info["packets"] == 1998
    assert stats["matched"] == info["matched"] == 999
    assert stats["query_only"] == stats["response_only"] == stats["malformed"] == 0
    assert table.num_rows == 999
