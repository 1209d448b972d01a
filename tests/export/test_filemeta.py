"""Every file says what it is (export.filemeta): the dnsprobe version, the schema version, what was done to client
addresses (never the key), the server name, the capture source kind and the digest of the configuration, in
Parquet key-value metadata and in the C-DNS file preamble; read back with pyarrow / cbor2 and with
`dnsprobe inspect --meta`, for files read and captured live, anonymised or not."""

import hashlib
import json
import lzma
import os
import shutil
import socket
from pathlib import Path

import cbor2
import pyarrow.parquet as pq
import pytest
from support.data import ROOT
from support.dnsprobe import run_dnsprobe
from support.dnstap import dnstap_frame, fstrm_file

import probe
from export.anonymise import new_key, write_key_file
from export.cdns import format as F
from export.filemeta import META_KEYS
from export.parquet.schema import SCHEMA_VERSION

SAMPLE = ROOT / "samples" / "sample-mix.pcap.xz"
NOT_ANONYMISED = "none: client addresses as captured"


def _key_file(tmp_path):
    key = new_key("aes")
    path = tmp_path / "secret.key"
    write_key_file(path, key)
    return path, key


def _never_the_key(data, key):
    """Neither the key's bytes nor any field of its key file line, in hex of either case, is in data."""
    secrets = [key.key, key.pad, key.iv, key.text().strip().encode()]
    secrets += [s.hex().encode() for s in (key.key, key.pad, key.iv)]
    secrets += [s.hex().upper().encode() for s in (key.key, key.pad, key.iv)]
    for secret in secrets:
        assert secret not in data


def _parquet_meta(path):
    """The dnsprobe keys of a Parquet file's key-value metadata, read with pyarrow alone."""
    kv = pq.read_metadata(path).metadata
    return {k.decode()[len("dnsprobe."):]: v.decode() for k, v in kv.items() if k.startswith(b"dnsprobe.")}


def _cdns_preamble(path):
    data = Path(path).read_bytes()
    if path.suffix == ".xz":
        data = lzma.decompress(data)
    return cbor2.loads(data)[1], data


def _inspect_meta(path):
    proc = run_dnsprobe("inspect", "--meta", "--json", path)
    (line,) = proc.stdout.splitlines()
    meta = json.loads(line)
    assert meta.pop("file") == str(path)
    text = run_dnsprobe("inspect", "--meta", path).stdout
    assert text == f"{path}:\n" + "".join(f"  {k}: {v}\n" for k, v in meta.items())  # the same, for people
    return meta, proc.stdout + text


def _config_digest(*flags):
    """SHA-256 of what `dnsprobe config` prints with these flags and --no-progress's key (the runs here give it):
    the digest the files must record."""
    text = run_dnsprobe("config", *flags, "--set", "run.progress=never").stdout
    return hashlib.sha256(text.encode()).hexdigest()


def _read(inputs, out, *flags):
    out.mkdir()
    run_dnsprobe("read", *inputs, "-o", out, "-q", "--no-progress", *flags)
    files = sorted(p for p in out.iterdir() if not p.name.startswith("_"))
    assert files
    return files


@pytest.mark.parametrize("fmt", ["parquet", "cdns"])
def test_read_files_say_what_they_are(tmp_path, fmt):
    flags = ["--format", fmt, "--set", "export.server_name=ns1.example"]
    (path,) = _read([SAMPLE], tmp_path / "out", *flags)
    meta, _ = _inspect_meta(path)
    assert meta["version"] == probe.__version__
    assert meta["client_privacy"] == NOT_ANONYMISED and meta["client_anonymised"] == "false"
    assert (meta["client_ipv4_prefix"], meta["client_ipv6_prefix"]) == ("32", "128")
    assert meta["server"] == "ns1.example"
    assert meta["source"] == "pcap file"
    assert meta["config_sha256"] == _config_digest("-o", tmp_path / "out", *flags)
    if fmt == "parquet":
        assert _parquet_meta(path) == meta
        assert list(meta) == list(META_KEYS) and meta["schema_version"] == str(SCHEMA_VERSION)
        assert pq.read_table(path).num_rows > 9000  # still a plain Parquet file for any reader
        import duckdb

        rows = duckdb.sql(f"select key, value from parquet_kv_metadata('{path}')").fetchall()
        assert {k.decode()[len("dnsprobe."):]: v.decode() for k, v in rows if k.startswith(b"dnsprobe.")} == meta
        return
    assert meta["schema_version"] == "C-DNS 1.0" and meta["generator"] == f"dnsprobe {probe.__version__}"
    preamble, _ = _cdns_preamble(path)
    params = preamble[F.BLOCK_PARAMETERS][0]
    coll, storage = params[F.COLLECTION_PARAMETERS], params[F.STORAGE_PARAMETERS]
    assert coll[F.HOST_ID] == "ns1.example" and coll[F.GENERATOR_ID] == f"dnsprobe {probe.__version__}"
    assert coll[F.DNSPROBE_ORIGIN] == {"source": "pcap file", "config_sha256": meta["config_sha256"]}
    assert storage[F.STORAGE_FLAGS] == 0 and F.ANONYMIZATION_METHOD not in storage


@pytest.mark.parametrize("fmt", ["parquet", "cdns"])
def test_anonymised_files_say_so_and_never_hold_the_key(tmp_path, fmt):
    key_path, key = _key_file(tmp_path)
    flags = ["--format", fmt, "--anonymize-key", key_path, "--set", "privacy.anonymize=true",
             "--set", "privacy.client_ipv4_prefix=24", "--set", "privacy.client_ipv6_prefix=48"]
    if fmt == "cdns":
        flags += ["--cdns-compression", "xz"]
    (path,) = _read([SAMPLE], tmp_path / "out", *flags)
    meta, printed = _inspect_meta(path)
    assert meta["client_anonymised"] == "true"
    assert meta["client_privacy"] == ("cryptopANT prefix-preserving anonymisation (IPv4 aes, IPv6 aes); client IPv4"
                                      " addresses cut to /24; client IPv6 addresses cut to /48")
    assert (meta["client_ipv4_prefix"], meta["client_ipv6_prefix"]) == ("24", "48")
    assert meta["server"] == ""  # a file read here: the converting host is not the server
    assert meta["config_sha256"] == _config_digest("-o", tmp_path / "out", *flags)
    _never_the_key(printed.encode(), key)
    if fmt == "parquet":
        assert _parquet_meta(path) == meta
        data = path.read_bytes()
    else:
        preamble, data = _cdns_preamble(path)
        storage = preamble[F.BLOCK_PARAMETERS][0][F.STORAGE_PARAMETERS]
        assert storage[F.STORAGE_FLAGS] & F.STORAGE_FLAG_ANONYMIZED_DATA
        assert storage[F.ANONYMIZATION_METHOD] == meta["client_privacy"]
        assert storage[F.CLIENT_ADDRESS_PREFIX_IPV4] == 24 and storage[F.CLIENT_ADDRESS_PREFIX_IPV6] == 48
    _never_the_key(data, key)
    # The digest is of the configuration, not of the key: another key in the same file, the same digest.
    key_path.unlink()
    write_key_file(key_path, new_key("aes"))
    assert _config_digest("-o", tmp_path / "out", *flags) == meta["config_sha256"]


def test_truncated_not_anonymised(tmp_path):
    (path,) = _read([SAMPLE], tmp_path / "out", "--format", "cdns", "--set", "privacy.client_ipv4_prefix=16")
    meta, _ = _inspect_meta(path)
    assert meta["client_anonymised"] == "false" and meta["client_ipv4_prefix"] == "16"
    assert meta["client_privacy"] == "client IPv4 addresses cut to /16"


def test_source_kinds_of_mixed_inputs(tmp_path):
    """A dnstap file and a pcap read together: the files name both kinds, in the order of the inputs."""
    dnstap = tmp_path / "resolver.dnstap"
    dnstap.write_bytes(fstrm_file([dnstap_frame("CLIENT_QUERY"), dnstap_frame("CLIENT_RESPONSE")]))
    files = _read([dnstap, SAMPLE], tmp_path / "out")  # (two files: the inputs are four years apart)
    assert [_parquet_meta(p)["source"] for p in files] == ["dnstap file, pcap file"] * 2
    (only,) = _read([dnstap], tmp_path / "only", "--format", "cdns")
    assert _inspect_meta(only)[0]["source"] == "dnstap file"


def test_inspect_meta_of_another_writer_s_cdns():
    """compactor's gold file: what RFC 8618's fields say; nothing of dnsprobe's own."""
    from support.data import COMPACTOR_DATA

    meta, _ = _inspect_meta(COMPACTOR_DATA / "gold.cbor.xz")
    assert meta["schema_version"] == "C-DNS 1.0" and meta["client_anonymised"] == "false"
    assert not {"version", "config_sha256", "source"} & set(meta)


def test_journal_conversion_keeps_the_metadata(tmp_path):
    """A live journal holds the file's metadata in its schema; the Parquet file made of it (at rotation, or by
    recovery after a crash) has it."""
    from probe.capture.files import open_file_source
    from probe.config import load_config
    from probe.run.pipeline import Pipeline, file_origin

    cfg = load_config(overrides={"export.flush_seconds": 1, "export.server_name": "probe-7"})
    origin = file_origin(cfg, ["af_packet", "dnstap socket"])
    pipeline = Pipeline(cfg, tmp_path, live=True, origin=origin)
    source = open_file_source(SAMPLE, 4096)
    batch = source.read()
    source.close()
    pipeline.feed(batch)  # (the first records open the file: its journal)
    pipeline.exporter.flush()
    (journal,) = tmp_path.glob("*.parquet.journal")
    live_meta, _ = _inspect_meta(journal)
    assert live_meta["source"] == "af_packet, dnstap socket" and live_meta["server"] == "probe-7"
    pipeline.finish()
    (path,) = tmp_path.glob("*.parquet")
    assert _parquet_meta(path) == live_meta
    assert live_meta["config_sha256"] == hashlib.sha256(
        run_dnsprobe("config", "--set", "export.flush_seconds=1", "--set", "export.server_name=probe-7").stdout.encode()
    ).hexdigest()


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"), reason="needs root and iproute2")
@pytest.mark.parametrize("fmt", ["parquet", "cdns"])
def test_live_capture_files_say_what_they_are(tmp_path, fmt):
    """A capture on a veth pair (as tests/run/test_live_capture.py), anonymised: the files (Parquet through its
    journal) record the AF_PACKET source, the host as the server, the privacy and the configuration as given."""
    from support.captures import build_traffic
    from support.live import Probe, VethBed

    key_path, key = _key_file(tmp_path)
    pcap = tmp_path / "traffic.pcap"
    passed = build_traffic(pcap, 0, 50)
    out = tmp_path / "out"
    out.mkdir()
    flags = ["--format", fmt, "--anonymize-key", key_path, "--set", "privacy.anonymize=true"]
    bed = VethBed()
    bed.up()
    probe_proc = None
    try:
        probe_proc = Probe(bed, out, *flags)
        probe_proc.wait_ready()
        bed.send(pcap, pps=2000)
        probe_proc.wait_counter("packets", passed)
        assert probe_proc.stop() == 0, probe_proc.stderr
        digest = _config_digest("--coremask", "0x1", "-i", bed.iface, "-o", out, "--stats-interval", "0.3", *flags)
    finally:
        if probe_proc is not None:
            probe_proc.kill()
        bed.down()
    (path,) = [p for p in out.iterdir() if not p.name.startswith("_")]
    meta, printed = _inspect_meta(path)
    assert meta["source"] == "af_packet" and meta["server"] == socket.gethostname()
    assert meta["client_anonymised"] == "true" and meta["config_sha256"] == digest
    assert meta["version"] == probe.__version__
    if fmt == "parquet":
        assert _parquet_meta(path) == meta
    _never_the_key(path.read_bytes() + printed.encode(), key)


@pytest.mark.skipif(os.geteuid() != 0, reason="DPDK's EAL needs root")
def test_dpdk_capture_files_say_dpdk(tmp_path):
    """DPDK capture (a net_pcap virtual device replaying a pcap, as tests/run/test_dpdk.py): its files name the
    DPDK source."""
    from support.captures import build_traffic
    from support.live import LIBDPDK, NO_HUGE, DpdkProbe

    if not LIBDPDK:
        pytest.skip("libdpdk is not installed: the DPDK extension is not built")
    pcap = tmp_path / "traffic.pcap"
    passed = build_traffic(pcap, 0, 50)
    out = tmp_path / "out"
    out.mkdir()
    probe_proc = DpdkProbe(out, f"{NO_HUGE} --vdev=net_pcap0,rx_pcap={pcap}")
    try:
        probe_proc.wait_ready()
        probe_proc.wait_counter("packets", passed)
    finally:
        assert probe_proc.stop() == 0, probe_proc.stderr
    (path,) = [p for p in out.iterdir() if not p.name.startswith("_")]
    meta = _parquet_meta(path)
    assert meta["source"] == "dpdk" and meta["server"] == socket.gethostname() and meta["version"] == probe.__version__
