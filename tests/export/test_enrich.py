"""Enrichment (export/enrich): country and AS number from MaxMind-format databases written here with mmdb-writer,
public resolvers from the bundled prefix lists, registered domain and public suffix from the Public Suffix List,
server_location; looked up before client privacy; bad databases exit 2 naming the key; reload picks up new files."""

import os
import shutil

import pyarrow as pa
import pytest
from scapy.layers.dns import DNS, DNSQR, DNSRROPT
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether
from scapy.utils import wrpcap
from support.dnsprobe import dnsprobe_read, run_dnsprobe

from export.enrich import make_enricher
from export.enrich.geo import GeoLookup
from export.enrich.psl import PublicSuffixes
from export.enrich.resolvers import BUNDLED, PublicResolvers, read_list
from probe.config import load_config
from probe.errors import ConfigError

mmdb_writer = pytest.importorskip("mmdb_writer", reason="pip install mmdb-writer (in the test extras)")
from netaddr import IPSet  # noqa: E402  (mmdb-writer's dependency)
from publicsuffixlist import PSLFILE  # noqa: E402

SERVER4, SERVER6 = "192.0.2.53", "2001:db8:53::53"
CLIENT_MAC, SERVER_MAC = "02:00:00:00:00:01", "02:00:00:00:00:35"
# client (as sent on the wire), client subnet option (address, prefix) or None, expected (country, asn),
# expected client-subnet (country, asn)
CLIENTS = [
    ("198.51.100.7", ("203.0.113.0", 24), ("NL", "1136"), ("JP", "2497")),
    ("2001:db8:1::7", ("2001:db8:2::", 48), ("DE", "3320"), ("FR", "3215")),
    ("::ffff:198.51.100.9", None, ("NL", "1136"), ("", "")),  # IPv4-mapped: looked up as 198.51.100.9
    ("100.64.0.1", ("100.64.0.0", 10), ("", ""), ("", "")),  # in neither database
    ("192.0.2.200", None, ("US", ""), ("", "")),  # only a registered_country; no AS
]


def write_databases(directory, country_code_v4="NL"):
    """GeoLite2-Country and GeoLite2-ASN style databases (IPv6 trees holding the IPv4 space at ::/96, as
    MaxMind's do)."""
    country = mmdb_writer.MMDBWriter(ip_version=6, database_type="GeoLite2-Country", ipv4_compatible=True)
    country.insert_network(IPSet(["198.51.100.0/24"]), {"country": {"iso_code": country_code_v4}})
    country.insert_network(IPSet(["203.0.113.0/24"]), {"country": {"iso_code": "JP"}})
    country.insert_network(IPSet(["2001:db8:1::/48"]), {"country": {"iso_code": "DE"}})
    country.insert_network(IPSet(["2001:db8:2::/48"]), {"country": {"iso_code": "FR"}})
    country.insert_network(IPSet(["192.0.2.128/25"]), {"registered_country": {"iso_code": "US"}})
    asn = mmdb_writer.MMDBWriter(ip_version=6, database_type="GeoLite2-ASN", ipv4_compatible=True)
    asn.insert_network(IPSet(["198.51.100.0/24"]), {"autonomous_system_number": 1136,
                                                      "autonomous_system_organization": "KPN B.V."})
    asn.insert_network(IPSet(["203.0.113.0/24"]), {"autonomous_system_number": 2497})
    asn.insert_network(IPSet(["2001:db8:1::/48"]), {"autonomous_system_number": 3320})
    asn.insert_network(IPSet(["2001:db8:2::/48"]), {"autonomous_system_number": 3215})
    paths = directory / "country.mmdb", directory / "asn.mmdb"
    country.to_db_file(str(paths[0]))
    asn.to_db_file(str(paths[1]))
    return paths


def ecs_option(address, prefix):
    import ipaddress

    ip = ipaddress.ip_address(address)
    family = 1 if ip.version == 4 else 2
    data = ip.packed[: (prefix + 7) // 8]
    return b"\x00\x08" + (4 + len(data)).to_bytes(2, "big") + family.to_bytes(2, "big") + bytes((prefix, 0)) + data


def write_capture(path, clients=CLIENTS, qnames=None):
    frames = []
    t = 1_700_000_000.0
    for i, (client, ecs, *_rest) in enumerate(clients):
        v6 = ":" in client
        server = SERVER6 if v6 else SERVER4
        qname = qnames[i] if qnames else f"www{i}.example.co.uk"
        opt = DNSRROPT(rclass=1232, rdata=ecs_option(*ecs)) if ecs else DNSRROPT(rclass=1232)
        ip = IPv6 if v6 else IP
        q = Ether(src=CLIENT_MAC, dst=SERVER_MAC) / ip(src=client, dst=server) / UDP(sport=40000 + i, dport=53) / DNS(
            id=i, rd=1, qd=DNSQR(qname=qname), ar=opt)
        r = Ether(src=SERVER_MAC, dst=CLIENT_MAC) / ip(src=server, dst=client) / UDP(sport=53, dport=40000 + i) / DNS(
            id=i, qr=1, rd=1, ra=1, rcode=3, qd=DNSQR(qname=qname))
        q.time, r.time = t + i, t + i + 0.001
        frames += [q, r]
    wrpcap(str(path), frames)
    return path


@pytest.fixture(scope="module")
def databases(tmp_path_factory):
    return write_databases(tmp_path_factory.mktemp("mmdb"))


def by_port(rows):
    return {r["srcp"] - 40000: r for r in rows}


def test_country_and_asn_of_clients_and_subnets(tmp_path, out_dir, databases):
    pcap = write_capture(tmp_path / "clients.pcap")
    rows = by_port(dnsprobe_read(pcap, out_dir, "--set", f"enrich.geoip_country={databases[0]}",
                                 "--set", f"enrich.geoip_asn={databases[1]}"))
    assert len(rows) == len(CLIENTS)
    for i, (client, _ecs, (country, asn), (ecs_country, ecs_asn)) in enumerate(CLIENTS):
        row = rows[i]
        assert (row["country"], row["asn"]) == (country, asn), client
        assert (row["edns_client_subnet_country"], row["edns_client_subnet_asn"]) == (ecs_country, ecs_asn), client


def test_off_by_default_and_dnsprobe_values(tmp_path, out_dir):
    rows = dnsprobe_read(write_capture(tmp_path / "clients.pcap"), out_dir)
    for row in rows:
        assert (row["country"], row["asn"], row["edns_client_subnet_country"], row["edns_client_subnet_asn"]) == (
            "", "", "", "")
        assert (row["is_google"], row["is_opendns"], row["server_location"]) == (False, False, "")
        assert row["public_resolver"] is None and row["registered_domain"] is None and row["public_suffix"] is None
        assert row["answers"] is None


def test_anonymised_output_keeps_the_real_addresses_country(tmp_path, out_dir, databases):
    key = tmp_path / "key.cryptopant"
    run_dnsprobe("keygen", key)
    rows = by_port(dnsprobe_read(
        write_capture(tmp_path / "clients.pcap"), out_dir, "--anonymize-key", key, "--client-ipv4-prefix", "16",
        "--set", f"enrich.geoip_country={databases[0]}", "--set", f"enrich.geoip_asn={databases[1]}"))
    for i, (client, ecs, (country, asn), (ecs_country, ecs_asn)) in enumerate(CLIENTS):
        row = rows[i]
        assert row["src"] != client  # anonymised ...
        assert (row["country"], row["asn"]) == (country, asn)  # ... and enriched with the real address
        assert (row["edns_client_subnet_country"], row["edns_client_subnet_asn"]) == (ecs_country, ecs_asn)
        if ecs and ":" not in client:
            assert not row["edns_client_subnet"].startswith(ecs[0])


def test_bad_databases_are_config_errors_naming_the_key(tmp_path, out_dir, databases):
    garbage = tmp_path / "garbage.mmdb"
    garbage.write_bytes(b"not a database" * 100)
    cases = [
        ("enrich.geoip_country", tmp_path / "missing.mmdb", "no such file"),
        ("enrich.geoip_asn", garbage, "not a MaxMind DB"),
        ("enrich.geoip_country", tmp_path, "is a directory"),
        ("enrich.geoip_country", databases[1], "a GeoLite2-ASN database, where a Country database is expected"),
        ("enrich.geoip_asn", databases[0], "a GeoLite2-Country database, where a ASN database is expected"),
        ("enrich.public_suffix_file", garbage, "not a Public Suffix List"),
        ("enrich.resolver_lists", tmp_path / "nolists", "not a directory"),
    ]
    for key, path, problem in cases:
        overrides = {key: str(path), "enrich.public_suffix": True, "enrich.public_resolvers": True}
        with pytest.raises(ConfigError) as err:
            make_enricher(load_config(overrides=overrides))
        assert f"config key '{key}'" in str(err.value) and problem in str(err.value), err.value
    # Through the command: exit status 2 and the one line.
    proc = run_dnsprobe("read", write_capture(tmp_path / "c.pcap"), "-o", out_dir, "-q",
                        "--set", f"enrich.geoip_asn={garbage}", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("dnsprobe: error: config key 'enrich.geoip_asn'")
    assert "not a MaxMind DB" in proc.stderr


def test_reload_picks_up_a_new_database(tmp_path, databases):
    country = tmp_path / "country.mmdb"
    shutil.copy(databases[0], country)
    geo = GeoLookup(str(country), None)
    table = pa.table({"src": ["198.51.100.7"], "edns_client_subnet": [""], "country": [""],
                      "edns_client_subnet_country": [""]})
    assert geo(table).column("country").to_pylist() == ["NL"]
    newer = write_databases(tmp_path / "..", country_code_v4="BE")[0]
    geo.reload()  # the file has not changed: same database
    assert geo(table).column("country").to_pylist() == ["NL"]
    os.replace(newer, country)  # as a database updater does: a new file renamed over the old one
    geo.reload()
    assert geo(table).column("country").to_pylist() == ["BE"]
    country.write_bytes(b"broken")  # a damaged update: the database loaded before stays in use
    os.utime(country, ns=(1, 1))
    geo.reload()
    assert geo(table).column("country").to_pylist() == ["BE"]


# ---------------------------------------------------------------------------------------------
# Public resolvers

RESOLVER_CLIENTS = {
    "74.125.18.1": "Google", "172.253.206.9": "Google", "2a00:1450:4001::77": "Google",
    "162.158.4.4": "Cloudflare", "2400:cb00:21::1": "Cloudflare",
    "9.9.9.10": "Quad9", "2620:fe::fe": "Quad9",
    "208.67.219.1": "OpenDNS", "146.112.62.5": "OpenDNS", "2620:119:35::35": "OpenDNS",
    "::ffff:74.125.18.1": "Google",
    "192.0.2.1": "", "8.8.8.8": "", "2001:db8::1": "",  # 8.8.8.8 is the service address, never a sender
}


def test_public_resolvers_from_the_bundled_lists():
    resolvers = PublicResolvers()
    addresses = list(RESOLVER_CLIENTS)
    n = len(addresses)
    table = pa.table({"src": addresses + [None], "public_resolver": pa.nulls(n + 1, pa.string()),
                      "is_google": [False] * (n + 1), "is_opendns": [False] * (n + 1)})
    out = resolvers(table)
    assert out.column("public_resolver").to_pylist() == list(RESOLVER_CLIENTS.values()) + [""]
    assert out.column("is_google").to_pylist() == [v == "Google" for v in RESOLVER_CLIENTS.values()] + [False]
    assert out.column("is_opendns").to_pylist() == [v == "OpenDNS" for v in RESOLVER_CLIENTS.values()] + [False]


def test_prefix_table_in_c_equals_its_twin():
    """export/enrich/_resolvers.c against resolvers.PrefixTable.name: the first and last address of every prefix of
    the bundled lists and their neighbours, as clients, IPv4-mapped clients and client subnets, random addresses,
    and texts that are not addresses as inet_ntop writes them (the C table hands those to the twin)."""
    import ipaddress
    import random
    import socket

    from export.enrich.resolvers import PrefixTable, load_lists

    table = PrefixTable(load_lists(None))
    fast = table.function()
    assert type(fast).__module__ == "export.enrich._resolvers"
    texts = []
    for _, networks in load_lists(None):
        for n in networks:
            top = (1 << n.max_prefixlen) - 1
            for value in (int(n.network_address), int(n.broadcast_address)):
                for v in (v for v in (value - 1, value, value + 1) if 0 <= v <= top):
                    address = str(ipaddress.IPv4Address(v) if n.version == 4 else ipaddress.IPv6Address(v))
                    texts += [address, f"{address}/{n.prefixlen}"] + (["::ffff:" + address] if n.version == 4 else [])
    rng = random.Random(21)
    texts += [socket.inet_ntop(socket.AF_INET6 if k % 2 else socket.AF_INET, rng.randbytes(16 if k % 2 else 4))
              for k in range(20000)]
    texts += ["", "/", "/24", "::ffff:", "::ffff:x", "1.2.3", "x", "74.125.018.1", "074.125.18.1", "2620:FE::FE",
              "2620:fe:0:0:0:0:0:fe", "2620:fe::fe%eth0", "::FFFF:74.125.18.1", "::ffff:74.125.18.1/120",
              "0:0:0:0:0:ffff:74.125.18.1", " 74.125.18.1", "é", "9.9.9.9" * 20]
    assert [fast(t) for t in texts] == [table.name(t) for t in texts]
    assert sum(1 for t in texts if fast(t)) > 1000


def test_prefix_table_never_initialised_is_refused():
    """Found by review (issue 32): PrefixTable.__new__ alone (no fallback, no empty name) dereferenced NULL."""
    from probe.native import load

    resolvers = load("export.enrich._resolvers")
    blank = resolvers.PrefixTable.__new__(resolvers.PrefixTable)
    for text in ("", "1.2.3.4", "x"):
        with pytest.raises(RuntimeError, match="not initialised"):
            blank(text)
    blank.__init__([], [], str.upper)
    assert (blank(""), blank("1.2.3.4"), blank("x")) == ("", "", "X")


def test_bundled_lists_name_their_source_and_date():
    lists = sorted(BUNDLED.glob("*.txt"))
    assert [p.stem for p in lists] == ["cloudflare", "google", "opendns", "quad9"]
    for path in lists:
        text = path.read_text()
        assert "# Source: " in text and "Compiled 20" in text, path
        name, networks = read_list(path)
        assert name in ("Google", "Cloudflare", "Quad9", "OpenDNS") and networks
        assert {n.version for n in networks} == {4, 6}, path


def test_resolver_lists_directory_replaces_the_bundled_one(tmp_path, out_dir):
    lists = tmp_path / "lists"
    lists.mkdir()
    (lists / "mine.txt").write_text("# name: Mine\n198.51.100.0/24  # a comment\n2001:db8:1::/48\n")
    rows = by_port(dnsprobe_read(write_capture(tmp_path / "c.pcap"), out_dir, "--set", "enrich.public_resolvers=true",
                                 "--set", f"enrich.resolver_lists={lists}"))
    assert [rows[i]["public_resolver"] for i in range(len(CLIENTS))] == ["Mine", "Mine", "Mine", "", ""]
    assert not any(r["is_google"] or r["is_opendns"] for r in rows.values())
    (lists / "bad.txt").write_text("300.1.2.3/8\n")
    proc = run_dnsprobe("read", tmp_path / "c.pcap", "-o", out_dir, "-q", "--set", "enrich.public_resolvers=true",
                        "--set", f"enrich.resolver_lists={lists}", check=False)
    assert proc.returncode == 2 and "bad.txt:1: '300.1.2.3/8' is not an address or prefix" in proc.stderr


# ---------------------------------------------------------------------------------------------
# Public Suffix List

PSL_CASES = [
    # qname as written in the qname column, (public_suffix, registered_domain) ICANN, and with PRIVATE
    ("www.example.co.uk", ("co.uk", "example.co.uk"), ("co.uk", "example.co.uk")),
    ("WWW.Example.CO.UK", ("co.uk", "example.co.uk"), ("co.uk", "example.co.uk")),
    ("a.b.c.example.com", ("com", "example.com"), ("com", "example.com")),
    ("co.uk", ("co.uk", ""), ("co.uk", "")),
    ("com", ("com", ""), ("com", "")),
    ("", ("", ""), ("", "")),  # the root
    ("localhost", ("localhost", ""), ("localhost", "")),  # one label, no rule: the '*' rule
    ("foo.blogspot.com", ("com", "blogspot.com"), ("blogspot.com", "foo.blogspot.com")),  # a PRIVATE suffix
    ("x.y.kawasaki.jp", ("y.kawasaki.jp", "x.y.kawasaki.jp"), ("y.kawasaki.jp", "x.y.kawasaki.jp")),  # *.kawasaki.jp
    ("www.city.kawasaki.jp", ("kawasaki.jp", "city.kawasaki.jp"), ("kawasaki.jp", "city.kawasaki.jp")),  # !city
    ("www.xn--80ak6aa92e.com", ("com", "xn--80ak6aa92e.com"), ("com", "xn--80ak6aa92e.com")),  # IDN, punycode
    ("shop.xn--p1ai", ("xn--p1ai", "shop.xn--p1ai"), ("xn--p1ai", "shop.xn--p1ai")),  # IDN TLD (.рф)
    ("www.пример.рф", ("рф", "пример.рф"), ("рф", "пример.рф")),  # IDN as UTF-8 labels
    ("host.example.unknowntld", ("unknowntld", "example.unknowntld"), ("unknowntld", "example.unknowntld")),
    ("a..b.com", ("", ""), ("", "")),  # an empty label: no answer
    (None, ("", ""), ("", "")),  # a malformed message without a name
]


@pytest.mark.parametrize("private", [False, True])
def test_public_suffix_edge_cases(private):
    step = PublicSuffixes(PSLFILE if private else None, private=private)  # the file option, and the bundled one
    names = [c[0] for c in PSL_CASES]
    n = len(names)
    table = pa.table({"qname": pa.array(names, pa.string()), "public_suffix": pa.nulls(n, pa.string()),
                      "registered_domain": pa.nulls(n, pa.string())})
    out = step(table)
    got = list(zip(out.column("public_suffix").to_pylist(), out.column("registered_domain").to_pylist()))
    assert got == [c[2 if private else 1] for c in PSL_CASES]


def test_public_suffix_and_resolvers_through_read(tmp_path, out_dir):
    names = ["www.example.co.uk", "foo.blogspot.com", "com", "a.b.kawasaki.jp", "xn--p1ai"]
    clients = [("74.125.18.1", None), ("208.67.219.1", None), ("2620:fe::fe", None), ("192.0.2.1", None),
               ("162.158.4.4", None)]
    pcap = write_capture(tmp_path / "n.pcap", clients, names)
    rows = by_port(dnsprobe_read(pcap, out_dir, "--set", "enrich.public_suffix=true",
                                 "--set", "enrich.public_resolvers=true", "--set", "export.server_name=ns1"))
    got = [(rows[i]["registered_domain"], rows[i]["public_suffix"], rows[i]["public_resolver"],
            rows[i]["is_google"], rows[i]["is_opendns"], rows[i]["server_location"]) for i in range(5)]
    assert got == [
        ("example.co.uk", "co.uk", "Google", True, False, "ns1"),
        ("blogspot.com", "com", "OpenDNS", False, True, "ns1"),
        ("", "com", "Quad9", False, False, "ns1"),
        ("a.b.kawasaki.jp", "b.kawasaki.jp", "", False, False, "ns1"),
        ("", "xn--p1ai", "Cloudflare", False, False, "ns1"),
    ]
    assert [rows[i]["domainname"] for i in range(5)] == ["co.uk", "blogspot.com", "com", "kawasaki.jp", "xn--p1ai"]


def test_refresh_script_reads_the_sources_formats(tmp_path):
    """contrib/refresh-resolver-lists.py on text in its sources' formats (no network here): dig's TXT output for
    Google, Cloudflare's plain lists; the header (source) is kept, the date replaced."""
    import importlib.util

    from support.data import ROOT

    spec = importlib.util.spec_from_file_location("refresh", ROOT / "contrib" / "refresh-resolver-lists.py")
    refresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(refresh)
    dig = '"74.125.18.0/25 iad" "74.125.18.128/26 syd"\n"2404:6800:4003::/48 sin"\n'
    assert refresh.google_prefixes(dig) == ["74.125.18.0/25", "74.125.18.128/26", "2404:6800:4003::/48"]
    assert refresh.plain_prefixes("173.245.48.0/20\n103.21.244.0/22\n") == ["173.245.48.0/20", "103.21.244.0/22"]
    path = tmp_path / "google.txt"
    shutil.copy(BUNDLED / "google.txt", path)
    refresh.rewrite(path, ["74.125.18.0/25"])
    name, networks = read_list(path)
    assert name == "Google" and [str(n) for n in networks] == ["74.125.18.0/25"]
    assert "# Source: " in path.read_text() and "by contrib/refresh-resolver-lists.py" in path.read_text()
