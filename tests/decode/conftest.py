"""Fixtures of the decoding tests."""

import pytest
from scapy.utils import wrpcap
from support.data import DATA_CAPTURES, ROOT
from support.edge_frames import edge_frames, tcp_frames


@pytest.fixture(scope="session")
def generated_captures(tmp_path_factory, traffic_pcap):
    """Captures made by the tests: the live-capture test's traffic, the decoders' edge frames and TCP traffic."""
    d = tmp_path_factory.mktemp("decode")
    wrpcap(str(d / "edge.pcap"), edge_frames())
    wrpcap(str(d / "tcp.pcap"), [f for f, _ in tcp_frames()])
    return [traffic_pcap, d / "edge.pcap", d / "tcp.pcap"]


@pytest.fixture(scope="session")
def decode_captures(generated_captures):
    """Every capture the decoders are compared on: the oracle data's, the sample, the generated ones."""
    return DATA_CAPTURES + [ROOT / "samples" / "sample-mix.pcap.xz"] + generated_captures
