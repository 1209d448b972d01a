"""Fixtures the tests of several stages share (a stage's own are in its folder's conftest.py); helpers are in the
support package."""

import pytest
from support.captures import build_traffic, edge_traffic
from support.live import Probe, VethBed


@pytest.fixture
def out_dir(tmp_path):
    d = tmp_path / "out"
    d.mkdir()
    return d


@pytest.fixture(scope="module")
def testbed():
    bed = VethBed()
    bed.up()
    yield bed
    bed.down()


@pytest.fixture(scope="session")
def traffic_pcap(tmp_path_factory):
    """The live-capture test's traffic (build_traffic, 400 transactions), built once: the decoding, filter, columnar
    and parallel-read tests only read it."""
    pcap = tmp_path_factory.mktemp("traffic") / "traffic.pcap"
    build_traffic(pcap, 1, 400)
    return pcap


@pytest.fixture(scope="session")
def edge_pcap(tmp_path_factory):
    """support.captures.edge_traffic's pcap and its number of frames, built once (the tests only read it)."""
    pcap = tmp_path_factory.mktemp("edge") / "edge.pcap"
    return pcap, edge_traffic(pcap)


@pytest.fixture
def probes():
    started = []
    yield lambda *a, **kw: started.append(Probe(*a, **kw)) or started[-1]
    for p in started:
        p.kill()
