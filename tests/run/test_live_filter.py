"""Live capture with a BPF filter expression and the --count / --duration stops, on a veth pair (as
test_live_capture.py): the expression runs in the kernel ahead of the DNS filter, so the capture keeps what
`dnsprobe read --filter` keeps of the same frames; --count and --duration end the capture by themselves as SIGTERM
does (exit status 0, every file complete)."""

import os
import shutil
import time

import pytest
from scapy.layers.dns import DNS, DNSQR, DNSRR
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.utils import wrpcap
from support.captures import keys
from support.dnsprobe import rows_of, run_dnsprobe

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"), reason="needs root and iproute2")

TRANSACTIONS = 200


@pytest.fixture(scope="module")
def two_nets(tmp_path_factory):
    """TRANSACTIONS untagged UDP transactions, their clients alternately in 10.1/16 and 10.2/16."""
    path = tmp_path_factory.mktemp("filter") / "two-nets.pcap"
    frames = []
    for i in range(TRANSACTIONS):
        client, qname = f"10.{1 + i % 2}.0.{1 + i // 2}", f"q{i}.example.com"
        query = DNS(id=i, rd=1, qd=DNSQR(qname=qname))
        response = DNS(id=i, qr=1, rd=1, ra=1, qd=DNSQR(qname=qname), an=DNSRR(rrname=qname, rdata="192.0.2.1"))
        eth = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:35")
        frames.append(eth / IP(src=client, dst="192.0.2.53") / UDP(sport=20000 + i, dport=53) / query)
        frames.append(eth / IP(src="192.0.2.53", dst=client) / UDP(sport=53, dport=20000 + i) / response)
    wrpcap(str(path), frames)
    return path


def test_capture_filter_keeps_what_read_filter_keeps(testbed, probes, out_dir, tmp_path, two_nets):
    expression = "net 10.1.0.0/16"
    expected = tmp_path / "expected"
    expected.mkdir()
    run_dnsprobe("read", two_nets, "-o", expected, "-q", "--no-progress", "--filter", expression)
    want = keys(rows_of(expected))
    assert len(want) == TRANSACTIONS // 2
    probe = probes(testbed, out_dir, "--filter", expression)
    probe.wait_ready()
    testbed.send(two_nets, pps=2000)
    probe.wait_counter("packets", TRANSACTIONS)  # the query and the response of each transaction kept
    time.sleep(1)  # (what the kernel would wrongly pass would come by now)
    assert probe.stop() == 0, probe.stderr
    assert keys(rows_of(out_dir)) == want
    c = probe.stats()["counters"]
    assert c["kernel_received"] == c["packets"] == TRANSACTIONS  # the other net stopped in the kernel


def test_count_stops_the_capture(testbed, probes, out_dir, two_nets):
    probe = probes(testbed, out_dir, "--count", "100")
    probe.wait_ready()
    testbed.send(two_nets, pps=2000)
    assert probe.proc.wait(60) == 0, probe.stderr  # stopped by itself, as by SIGTERM
    probe.reader.join(5)
    doc = probe.stats()
    assert doc["running"] is False and doc["counters"]["packets"] >= 100
    rows = rows_of(out_dir)
    assert rows and doc["counters"]["records"] == len(rows) and not list(out_dir.glob("*.part"))


def test_duration_stops_the_capture(testbed, probes, out_dir, two_nets):
    began = time.monotonic()
    probe = probes(testbed, out_dir, "--duration", "2")
    probe.wait_ready()
    testbed.send(two_nets, pps=2000)
    assert probe.proc.wait(60) == 0, probe.stderr
    probe.reader.join(5)
    assert time.monotonic() - began >= 2
    doc = probe.stats()
    assert doc["running"] is False and doc["counters"]["records"] == len(rows_of(out_dir)) == TRANSACTIONS
