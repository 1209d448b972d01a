"""DNS Probe's own test pcaps and expected Parquet files: our rows must equal theirs.

DNS Probe's test compares every column but unixtime, time, time_micro and tcp_hs_rtt (it stamps rows
with the wall clock); we compare the same columns, row by row in order, and in addition check that our
time columns hold the capture timestamp of the query, taken from tshark as an independent reader.
"""

import subprocess

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.data import DNSPROBE_DATA
from support.dnsprobe import assert_rows_equal_dnsprobe, dnsprobe_read

from export.parquet.schema import DNSPROBE_COLUMNS, SCHEMA

NAMES = ["udp_simple", "tcp_simple", "tcp_axfr_zone_transfer", "edns_dnssec_nsid"]


@pytest.mark.parametrize("name", NAMES)
def test_rows_equal_dnsprobe_expected(name, out_dir):
    rows = dnsprobe_read(DNSPROBE_DATA / "test_pcaps" / f"{name}.pcap", out_dir)
    assert_rows_equal_dnsprobe(DNSPROBE_DATA / "test_parquets" / "base" / f"{name}.parquet", rows, name)


def test_first_55_columns_are_dnsprobe_schema():
    expected = pq.read_table(DNSPROBE_DATA / "test_parquets" / "base" / "udp_simple.parquet").schema
    ours = pa.schema([SCHEMA.field(i) for i in range(55)])
    assert ours.names == expected.names
    for field in expected:
        want = pa.float64() if field.name == "tcp_hs_rtt" else field.type  # int64 in their older files
        assert ours.field(field.name).type == want, field.name
    assert len(DNSPROBE_COLUMNS) == 55


def _tshark_query_times(pcap):
    out = subprocess.run(
        ["tshark", "-r", str(pcap), "-Y", "dns.flags.response == 0", "-T", "fields",
         "-e", "dns.id", "-e", "udp.srcport", "-e", "tcp.srcport", "-e", "ip.dst", "-e", "ipv6.dst",
         "-e", "frame.time_epoch"],
        capture_output=True, text=True, check=True,
    ).stdout
    times = {}
    for line in out.splitlines():
        dns_id, udp_port, tcp_port, dst4, dst6, epoch = line.split("\t")
        key = (int(dns_id.split(",")[0], 0), int(udp_port or tcp_port), dst4 or dst6)
        sec, _, frac = epoch.partition(".")
        times.setdefault(key, int(sec) * 1_000_000 + int((frac + "000000")[:6]))
    return times


@pytest.mark.parametrize("name", NAMES)
def test_time_columns_are_query_capture_time(name, out_dir):
    pcap = DNSPROBE_DATA / "test_pcaps" / f"{name}.pcap"
    times = _tshark_query_times(pcap)
    rows = dnsprobe_read(pcap, out_dir)
    for row in rows:
        want = times[(row["id"], row["srcp"], row["dst"])]
        assert row["time"] == want
        assert row["unixtime"] == want // 1_000_000
        assert row["time_micro"] == want % 1_000_000
        assert row["query_time"] // 1000 == want and row["timestamp"] == row["query_time"]
