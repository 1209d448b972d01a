"""The user's BPF filter expression (filter.expression, `--filter`), compiled by libpcap:

- chained ahead of the kernel DNS filter, the program keeps exactly the frames that libpcap's own interpreter
  (bpf_filter) accepts and the DNS filter keeps, frame by frame, on every capture of the kernel filter's tests;
  a program returning A (not what libpcap writes, but classic BPF) is chained as well;
- the kernel's checker takes the chained programs; one longer than the kernel's 4096 instructions is refused;
- `dnsprobe read --filter` writes what `dnsprobe read` writes of the frames the expression accepts, and counts
  the others (expression_filtered), with one worker or two;
- a bad expression is exit status 2 with libpcap's message, for read, capture and config; DPDK capture (no kernel
  filter) refuses an expression, and `read` refuses --count (it belongs to capture).
"""

import socket

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from support.captures import bench_mix, keys
from support.cbpf import run_cbpf
from support.data import DATA_CAPTURES
from support.dnsprobe import rows_of, run_dnsprobe
from support.frames import MAC_C, MAC_S

from probe.capture.afpacket import attach_filter
from probe.capture.bpf import BPF_MAXINSNS, BPF_RET, dns_filter
from probe.capture.pcapfile import read_capture
from probe.capture.pcapfilter import FrameFilter, compile_filter
from probe.model import LINKTYPE_ETHERNET, FrameBatch

EXPRESSIONS = ("net 192.0.2.0/24", "ip6 or (udp and not src port 53)", "tcp", "vlan", "host 10.1.5.7 or ip6")


@pytest.fixture(scope="module")
def frames(traffic_pcap, edge_pcap):
    paths = [p for p in DATA_CAPTURES if p.stat().st_size < 3_000_000] + [traffic_pcap, edge_pcap[0], bench_mix()]
    out = []
    for path in paths:
        for batch in read_capture(path):
            if batch.linktype == LINKTYPE_ETHERNET:
                out += zip(batch.ts_ns, batch.wirelen, batch.data)
    return out


def libpcap_accepts(expression, frames):
    """The frames libpcap's bpf_filter accepts, by FrameFilter (the `read` path)."""
    ts, wirelen, data = map(list, zip(*frames, strict=True))
    kept = FrameFilter(expression).keep(FrameBatch(LINKTYPE_ETHERNET, ts, wirelen, data))
    return set(kept.data)


@pytest.mark.parametrize("expression", EXPRESSIONS)
def test_chained_program_is_expression_and_dns_filter(frames, expression):
    dns = dns_filter([53])
    chained = dns_filter([53], user_program=compile_filter(expression))
    accepted = libpcap_accepts(expression, frames)
    both = 0
    for _, _, frame in frames:
        expected = frame in accepted and bool(run_cbpf(dns, frame))
        assert bool(run_cbpf(chained, frame)) == expected, frame.hex()
        both += expected
    assert 0 < both < sum(1 for f in frames if run_cbpf(dns, f[2]))  # the expression decided some frames


def test_a_program_returning_a_is_chained():
    # ldb [22] (the IPv4 TTL); ret A: accepts what has a TTL other than 0
    user = [(0x30, 0, 0, 22), (BPF_RET | 0x10, 0, 0, 0)]
    chained = dns_filter([53], user_program=user)
    udp = bytes(Ether(src=MAC_C, dst=MAC_S) / IP(src="10.0.0.1", dst="10.0.0.2", ttl=64) / UDP(sport=1000, dport=53))
    ttl0 = bytes(Ether(src=MAC_C, dst=MAC_S) / IP(src="10.0.0.1", dst="10.0.0.2", ttl=0) / UDP(sport=1000, dport=53))
    other = bytes(Ether(src=MAC_C, dst=MAC_S) / IP(src="10.0.0.1", dst="10.0.0.2", ttl=64) / UDP(sport=1000, dport=80))
    assert run_cbpf(chained, udp) and not run_cbpf(chained, ttl0) and not run_cbpf(chained, other)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        attach_filter(sock, chained)


def test_the_kernel_takes_chained_programs_and_refuses_too_long_ones():
    for expression in EXPRESSIONS:
        for skip in (False, True):
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                attach_filter(sock, dns_filter([53], skip_outgoing=skip, user_program=compile_filter(expression)))
    long_expression = " and ".join(f"len != {n}" for n in range(100, 2000))  # (quick for libpcap's optimiser)
    user = compile_filter(long_expression)
    assert len(user) + len(dns_filter([53])) > BPF_MAXINSNS
    with pytest.raises(ValueError, match="more than the kernel's 4096"):
        dns_filter([53], user_program=user)


def test_read_filter_writes_the_frames_the_expression_accepts(traffic_pcap, tmp_path):
    pcap = traffic_pcap
    expression = "net 10.1.0.0/16 or ip6"
    everything, filtered = tmp_path / "all", tmp_path / "filtered"
    for d in (everything, filtered):
        d.mkdir()
    run_dnsprobe("read", pcap, "-o", everything, "-q", "--no-progress")
    # The expected rows: an IPv4 client in 10.1/16 or IPv6, untagged (tcpdump's `ip6` looks at the untagged
    # ethertype, as libpcap compiles it).
    frames = [(ts, wl, d) for b in read_capture(pcap) for ts, wl, d in zip(b.ts_ns, b.wirelen, b.data)]
    kept = libpcap_accepts(expression, frames)
    rows = rows_of(everything)
    assert 0 < len(kept) < len(frames)
    for workers in ("1", "2"):
        out = filtered / workers
        out.mkdir()
        proc = run_dnsprobe("read", pcap, "-o", out, "--no-progress", "--filter", expression, "--workers", workers)
        got = rows_of(out)
        assert got and len(got) < len(rows)
        assert all(r["src"].startswith(("10.1.", "2001:")) for r in got)
        assert keys(got) <= keys(rows)
        stats = [line for line in proc.stdout.splitlines() + proc.stderr.splitlines() if "expression_filtered" in line]
        assert stats and int(stats[0].split("│")[2].replace(",", "")) == len(frames) - len(kept), stats


@pytest.mark.parametrize("command", ["read", "capture", "config"])
def test_a_bad_expression_is_exit_2_with_libpcaps_message(tmp_path, command):
    where = {"read": [str(DATA_CAPTURES[0])], "capture": ["-i", "lo"], "config": []}[command]
    proc = run_dnsprobe(command, *where, "-o", tmp_path, "--filter", "net 192.0.2.0/33", check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "filter.expression" in lines[0] and "mask length must be <= 32" in lines[0], lines
    proc = run_dnsprobe(command, *where, "-o", tmp_path, "--filter", "port fifty-three", check=False)
    assert proc.returncode == 2 and ("syntax error" in proc.stderr or "unknown port" in proc.stderr), proc.stderr


def test_dpdk_capture_refuses_a_filter(tmp_path):
    proc = run_dnsprobe("capture", "--dpdk", "--filter", "udp", "-o", tmp_path, check=False)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "DPDK" in proc.stderr, proc.stderr


def test_read_refuses_count(tmp_path):
    proc = run_dnsprobe("read", DATA_CAPTURES[0], "-o", tmp_path, "--count", "10", check=False)
    assert proc.returncode == 2 and "capture" in proc.stderr, proc.stderr
