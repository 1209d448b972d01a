"""Fixtures of the decoding tests."""

import pytest
from scapy.utils import wrpcap
from support.captures import build_traffic
from support.data import ROOT, SHARED_CAPTURES
from support.edge_frames import edge_frames, tcp_frames


@pytest.fixture(scope="session")
def generated_captures(tmp_path_factory):
    """Captures made by the tests: the live-capture test's traffic, the decoders' edge frames and TCP traffic."""
    d = tmp_path_factory.mktemp("decode")
    build_traffic(d / "traffic.pcap", 1, 400)
    wrpcap(str(d / "edge.pcap"), edge_frames())
    wrpcap(str(d / "tcp.pcap"), [f for f, _ in tcp_frames()])
    return [d / "traffic.pcap", d / "edge.pcap", d / "tcp.pcap"]


@pytest.fixture(scope="session")
def decode_captures(generated_captures):
    """Every capture the decoders are compared on: the shared data's, the sample, the generated ones."""
    return SHARED_CAPTURES + [ROOT / "samples" / "sample-mix.pcap.xz"] + generated_captures
