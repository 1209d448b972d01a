"""Privacy and filtering: cryptopANT anonymisation of client addresses, prefix truncation, IP allow/deny lists.

- cryptopANT's own test vectors (every address of ip4s / ip6s, for AES, Blowfish, MD5 and SHA-1), directly
  and through `dnsprobe read`;
- DNS Probe's expected files: anonymised with its key, and IP-filtered with the lists of its config.yml;
- truncation, EDNS client subnets, the allow/deny semantics per family and the ip_filtered counter;
- live capture with an allowlist: the kernel-filter path and the worker path export the same rows and count
  the same rejected packets (root only; the testbed of test_live_capture.py);
- bad key files, bad CIDRs, keygen.
"""

import ipaddress
import os
import re
import shutil
import stat

import pytest
import yaml
from scapy.layers.dns import DNS, DNSQR, DNSRROPT, EDNS0ClientSubnet
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.packet import Raw
from support.captures import build_traffic, keys
from support.data import DNSPROBE_DATA, SHARED, needs_shared, skip_without_shared
from support.dnsprobe import assert_rows_equal_dnsprobe, by_id, dnsprobe_read, probe_run, rows_of, run_dnsprobe
from support.frames import T0, TcpConn, ether, framed, write_pcap
from support.messages import q_dns, r_dns

from export.anonymise import CryptoPAn, read_key_file
from probe.capture.afpacket import ip_lists_fit
from probe.config import FilterConfig
from probe.decode.ipfilter import IpFilter

VECTORS = SHARED / "data" / "cryptopant"
ALGORITHMS = ("aes", "blowfish", "md5", "sha1")
DNSPROBE_KEY = DNSPROBE_DATA / "key.cryptopant"
NAMES = ["udp_simple", "tcp_simple", "tcp_axfr_zone_transfer", "edns_dnssec_nsid"]
root_only = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"), reason="needs root and iproute2")


def vectors(algorithm, family):
    inputs = (VECTORS / f"ip{family}s").read_text().split()
    outputs = (VECTORS / f"ip{family}s.anon.{algorithm}").read_text().split()
    assert len(inputs) == len(outputs) == 1000
    return list(zip(inputs, outputs))


# --- cryptopANT's vectors ---------------------------------------------------------------------------------------


@needs_shared
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("family", (4, 6))
def test_cryptopant_vectors_every_address(algorithm, family):
    pan = CryptoPAn(read_key_file(VECTORS / f"keyfile.{algorithm}"))
    scramble = pan.ip4 if family == 4 else pan.ip6
    pairs = vectors(algorithm, family)
    got = [str(ipaddress.ip_address(scramble(ipaddress.ip_address(a).packed))) for a, _ in pairs]
    assert got == [b for _, b in pairs]
    # Again in another order: the prefix caches give the same answers as a cold computation.
    again = [str(ipaddress.ip_address(scramble(ipaddress.ip_address(a).packed))) for a, _ in reversed(pairs)]
    assert again == got[::-1]


def client_pairs_pcap(path, clients, v6):
    """One UDP query/response pair per client address (server fixed), ids 1.."""
    server = "2001:db8:53::53" if v6 else "198.51.100.53"
    frames = []
    for i, client in enumerate(clients, 1):
        ip = (lambda s, d: IPv6(src=s, dst=d)) if v6 else (lambda s, d: IP(src=s, dst=d))
        q = ip(client, server) / UDP(sport=20000 + i, dport=53) / Raw(q_dns(i))
        r = ip(server, client) / UDP(sport=53, dport=20000 + i) / Raw(r_dns(i))
        frames += [(T0 + 2 * i * 1000, ether(bytes(q))), (T0 + (2 * i + 1) * 1000, ether(bytes(r)))]
    return write_pcap(path, frames)


@needs_shared
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_read_anonymises_clients_as_cryptopant(algorithm, tmp_path):
    """End to end: `dnsprobe read --anonymize-key keyfile.X` writes cryptopANT's output as `src`."""
    for family in (4, 6):
        pairs = vectors(algorithm, family)[::40]  # 25 addresses of each family
        pcap = client_pairs_pcap(tmp_path / f"v{family}.pcap", [a for a, _ in pairs], family == 6)
        rows, counters = probe_run(pcap, tmp_path / f"out{family}", "--anonymize-key", VECTORS / f"keyfile.{algorithm}")
        got = by_id(rows)
        assert len(got) == len(pairs) and counters["matched"] == len(pairs)
        for i, (_, anonymised) in enumerate(pairs, 1):
            assert got[i]["src"] == anonymised
            assert got[i]["dst"] == ("2001:db8:53::53" if family == 6 else "198.51.100.53")  # servers as they are


# --- DNS Probe's expected files ---------------------------------------------------------------------------------


@needs_shared
@pytest.mark.parametrize("name", NAMES)
def test_dnsprobe_anonymized_expected(name, out_dir):
    rows = dnsprobe_read(DNSPROBE_DATA / "test_pcaps" / f"{name}.pcap", out_dir, "--anonymize-key", DNSPROBE_KEY)
    assert_rows_equal_dnsprobe(DNSPROBE_DATA / "test_parquets" / "anonymized" / f"{name}.parquet", rows, name)


@needs_shared
def test_dnsprobe_anonymized_from_config_file(out_dir, tmp_path):
    conf = tmp_path / "privacy.yml"
    conf.write_text(f"privacy:\n  anonymize: true\n  key_file: {DNSPROBE_KEY}\n")
    rows = dnsprobe_read(DNSPROBE_DATA / "test_pcaps" / "udp_simple.pcap", out_dir, "-c", conf)
    assert_rows_equal_dnsprobe(DNSPROBE_DATA / "test_parquets" / "anonymized" / "udp_simple.parquet", rows, "conf")


def dnsprobe_lists():
    """DNS Probe's test configuration (config.yml): {'allow': [...], 'deny': [...]} of IPv4 addresses."""
    doc = yaml.safe_load((DNSPROBE_DATA / "config.yml").read_text())
    return {"allow": doc["ip_allow"]["ipv4-allowlist"], "deny": doc["ip_deny"]["ipv4-denylist"]}


@needs_shared
@pytest.mark.parametrize("kind", ("allow", "deny"))
def test_dnsprobe_ip_filtered_expected(kind, tmp_path):
    flags = [x for a in dnsprobe_lists()[kind] for x in (f"--ipv4-{kind}", a)]
    pcap = DNSPROBE_DATA / "test_pcaps" / "edns_dnssec_nsid.pcap"
    rows, counters = probe_run(pcap, tmp_path / "out", *flags)
    expected = DNSPROBE_DATA / "test_parquets" / "ip_filtered" / f"edns_dnssec_nsid_{kind}.parquet"
    assert_rows_equal_dnsprobe(expected, rows, kind)
    # Nothing dropped silently: every packet is decoded, counted as filtered, or counted as not DNS.
    assert counters["ip_filtered"] > 0
    assert counters["packets"] == (counters["dns_messages"] + counters["ip_filtered"] + counters["non_dns"]
                                   + counters["non_ip"] + counters["truncated_frames"])
    # The same lists from a configuration file give the same rows.
    conf = tmp_path / "filter.yml"
    conf.write_text(yaml.safe_dump({"filter": {f"ipv4_{kind}": dnsprobe_lists()[kind]}}))
    again, _ = probe_run(pcap, tmp_path / "out2", "-c", conf)
    assert again == rows


# --- truncation, client subnets, filtering semantics --------------------------------------------------------------


def ecs_query(qid, address, plen, family):
    opt = DNSRROPT(rclass=1232, rdata=[EDNS0ClientSubnet(family=family, source_plen=plen, address=address)])
    return bytes(DNS(id=qid, rd=1, qd=[DNSQR(qname="ecs.example.com")], ar=opt))


@needs_shared
def test_truncation_anonymisation_and_client_subnets(tmp_path):
    clients = ["192.0.2.77", "2001:db8:aa:bb:cc:dd:ee:ff"]
    frames = []
    for i, (client, ecs) in enumerate(zip(clients, [("203.0.113.0", 24, 1), ("2001:db8:1234::", 48, 2)]), 1):
        v6 = ":" in client
        server = "2001:db8:53::53" if v6 else "198.51.100.53"
        ip = IPv6(src=client, dst=server) if v6 else IP(src=client, dst=server)
        frames.append((T0 + i * 1000, ether(bytes(ip / UDP(sport=30000 + i, dport=53) / Raw(ecs_query(i, *ecs))))))
    pcap = write_pcap(tmp_path / "ecs.pcap", frames)

    plain = by_id(probe_run(pcap, tmp_path / "plain")[0])
    assert (plain[1]["src"], plain[1]["edns_client_subnet"]) == ("192.0.2.77", "203.0.113.0/24")

    cut = by_id(probe_run(pcap, tmp_path / "cut", "--client-ipv4-prefix", 24, "--client-ipv6-prefix", 56)[0])
    assert (cut[1]["src"], cut[2]["src"]) == ("192.0.2.0", "2001:db8:aa::")
    assert (cut[1]["dst"], cut[2]["dst"]) == ("198.51.100.53", "2001:db8:53::53")
    assert (cut[1]["edns_client_subnet"], cut[2]["edns_client_subnet"]) == ("203.0.113.0/24", "2001:db8:1234::/48")

    key = VECTORS / "keyfile.aes"
    pan = CryptoPAn(read_key_file(key))
    both = by_id(probe_run(pcap, tmp_path / "both", "--anonymize-key", key, "--client-ipv4-prefix", 24,
                           "--client-ipv6-prefix", 56)[0])

    def anon(text, plen):
        net = ipaddress.ip_network(text)
        addr = net.network_address
        out = pan.ip4(addr.packed) if addr.version == 4 else pan.ip6(addr.packed)
        return str(ipaddress.ip_network((ipaddress.ip_address(out), plen), strict=False).network_address)

    assert both[1]["src"] == anon("192.0.2.77/32", 24) and both[2]["src"] == anon("2001:db8:aa:bb:cc:dd:ee:ff/128", 56)
    # The client subnet is a client address too: anonymised with the same key, cut to its source prefix.
    assert both[1]["edns_client_subnet"] == anon("203.0.113.0/24", 24) + "/24"
    assert both[2]["edns_client_subnet"] == anon("2001:db8:1234::/48", 48) + "/48"
    assert both[1]["edns_client_subnet"] != "203.0.113.0/24"
    assert (both[1]["dst"], both[2]["dst"]) == ("198.51.100.53", "2001:db8:53::53")


@pytest.fixture(scope="module")
def mixed_pcap(tmp_path_factory):
    """UDP pairs between four IPv4 and two IPv6 clients and two servers of each family, plus one non-DNS
    packet from 10.0.0.1; ids tell the pair: 100 * client + server."""
    d = tmp_path_factory.mktemp("mixed")
    v4c = ["10.0.0.1", "10.0.1.1", "10.1.0.1", "172.16.0.1"]
    v4s = ["192.0.2.53", "198.51.100.53"]
    v6c = ["2001:db8:c::1", "2001:db8:d::1"]
    v6s = ["2001:db8:53::1", "2001:db8:54::1"]
    frames = []
    t = T0
    for ci, client in enumerate(v4c + v6c):
        for si, server in enumerate(v6s if ":" in client else v4s):
            qid = 100 * ci + si
            ip = (lambda s, d: IPv6(src=s, dst=d)) if ":" in client else (lambda s, d: IP(src=s, dst=d))
            frames.append((t, ether(bytes(ip(client, server) / UDP(sport=40000 + qid, dport=53) / Raw(q_dns(qid))))))
            frames.append((t + 1000, ether(bytes(ip(server, client) / UDP(sport=53, dport=40000 + qid)
                                                 / Raw(r_dns(qid))))))
            t += 10_000
    frames.append((t, ether(bytes(IP(src="10.0.0.1", dst="192.0.2.53") / UDP(sport=1234, dport=123) / Raw(b"x")))))
    return write_pcap(d / "mixed.pcap", frames), v4c, v4s, v6c, v6s


@pytest.mark.parametrize(
    "flags, kept",
    [
        # allowlist: kept when the source or the destination is in it (clients or servers alike)
        (("--ipv4-allow", "10.0.0.0/24"), lambda c, s: c == "10.0.0.1" or ":" in c),
        (("--ipv4-allow", "198.51.100.53"), lambda c, s: s == "198.51.100.53" or ":" in c),
        (("--ipv4-allow", "10.0.0.0/16", "--ipv4-allow", "172.16.0.1"), lambda c, s: c != "10.1.0.1" or ":" in c),
        # denylist: dropped when the source or the destination is in it
        (("--ipv4-deny", "10.0.0.0/8"), lambda c, s: c == "172.16.0.1" or ":" in c),
        (("--ipv4-deny", "192.0.2.53"), lambda c, s: s != "192.0.2.53"),
        # an allowlist makes the denylist of its family unused; each family has its own lists
        (("--ipv4-allow", "10.0.0.1", "--ipv4-deny", "10.0.0.1"), lambda c, s: c == "10.0.0.1" or ":" in c),
        (("--ipv6-allow", "2001:db8:54::/48"), lambda c, s: s == "2001:db8:54::1" or ":" not in c),
        (("--ipv6-deny", "2001:db8:c::/48", "--ipv4-deny", "0.0.0.0/0"), lambda c, s: c == "2001:db8:d::1"),
    ],
)
def test_allow_deny_semantics(mixed_pcap, tmp_path, flags, kept):
    pcap, v4c, v4s, v6c, v6s = mixed_pcap
    rows, counters = probe_run(pcap, tmp_path / "out", *flags)
    expected = {100 * ci + si for ci, c in enumerate(v4c + v6c) for si, s in enumerate(v6s if ":" in c else v4s)
                if kept(c, s)}
    assert set(by_id(rows)) == expected
    assert all(r["query_present"] and r["response_present"] for r in rows)
    dropped_pairs = 2 * (len(v4c) + len(v6c)) - len(expected)
    non_dns_filtered = 0 if kept("10.0.0.1", "192.0.2.53") else 1  # the NTP packet is checked first by address
    assert counters["ip_filtered"] == 2 * dropped_pairs + non_dns_filtered
    assert counters["non_dns"] == 1 - non_dns_filtered
    assert counters["packets"] == counters["dns_messages"] + counters["ip_filtered"] + counters["non_dns"]


def test_tcp_on_a_configured_port(tmp_path):
    """DNS over TCP on port 5353 only: decoded and matched, the client is the side that opened the connection."""
    conn = TcpConn(41000, port=5353)
    frames = conn.handshake(T0, T0 + 1000, T0 + 2000)
    frames += [(T0 + 3000, conn.data("c", framed(q_dns(77)))), (T0 + 4000, conn.data("s", framed(r_dns(77))))]
    pcap = write_pcap(tmp_path / "tcp5353.pcap", frames)
    rows, counters = probe_run(pcap, tmp_path / "out", "--dns-port", 5353)
    (row,) = rows
    assert (row["prot"], row["srcp"], row["dstp"], row["response_present"]) == (6, 41000, 5353, True)
    assert row["tcp_hs_rtt"] == pytest.approx(0.002)
    rows, counters = probe_run(pcap, tmp_path / "out53", "--dns-port", 53)
    assert rows == [] and counters["non_dns"] == len(frames)


def test_ip_lists_fit_the_kernel_filter_when_short():
    short = IpFilter(FilterConfig(ipv4_allow=("10.0.0.0/8", "192.0.2.1"), ipv6_deny=("2001:db8::/32",)))
    assert ip_lists_fit((53,), short)
    long = IpFilter(FilterConfig(ipv6_allow=tuple(f"2001:db8:{i:x}::/48" for i in range(200))))
    assert not ip_lists_fit((53,), long)


# --- errors -------------------------------------------------------------------------------------------------------


@needs_shared
@pytest.mark.parametrize(
    "text, problem",
    [
        ("", "found 1 field"),
        ("hello world\n", "found 1 field"),
        ("03:03:zz:00\n", "key field"),
        ("09:09:00112233445566778899aabbccddeeff:" + "00" * 32 + "\n", "not one of"),
        ("03:03:00112233:" + "00" * 32 + "\n", "AES key is 16, 24 or 32 bytes"),
        ("03:03:00112233445566778899aabbccddeeff:\n", "pad field is empty"),
        ("03:03:00112233445566778899aabbccddeeff:" + "00" * 33 + "\n", "at most 32"),
        ("03:03:0:" + "00" * 32 + "\n", "even number of hex digits"),
        ("\xff\xfe", "not text"),
    ],
)
def test_malformed_key_file_exit_2(text, problem, tmp_path, out_dir):
    key = tmp_path / "bad.key"
    key.write_bytes(text.encode("latin-1"))
    proc = run_dnsprobe("read", DNSPROBE_DATA / "test_pcaps" / "udp_simple.pcap", "-o", out_dir, "-q",
                        "--anonymize-key", key, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "privacy.key_file" in proc.stderr and problem in proc.stderr and "Traceback" not in proc.stderr
    assert not list(out_dir.iterdir())


@needs_shared
@pytest.mark.parametrize(
    "args, message",
    [
        (("--anonymize-key", "/nonexistent/key"), "privacy.key_file': key file /nonexistent/key: no such file"),
        (("--set", "privacy.anonymize=true"), "privacy.key_file': privacy.anonymize is true but no key file"),
        (("--ipv4-allow", "10.0.0.0/33"), "argument --ipv4-allow: '10.0.0.0/33' is not an IPv4 address"),
        (("--ipv4-deny", "2001:db8::/32"), "argument --ipv4-deny: '2001:db8::/32' is an IPv6 prefix, not IPv4"),
        (("--ipv6-allow", "example.com"), "argument --ipv6-allow: 'example.com' is not an IPv6 address"),
        (("--ipv6-deny", "10.0.0.1"), "argument --ipv6-deny: '10.0.0.1' is an IPv4 prefix"),
        (("--set", "filter.ipv4_allow=[10.0.0.0/8, 300.1.1.1]"), "config key 'filter.ipv4_allow': '300.1.1.1'"),
        (("--set", "filter.ipv6_deny=7"), "config key 'filter.ipv6_deny'"),
        (("--client-ipv4-prefix", "33"), "config key 'privacy.client_ipv4_prefix'"),
    ],
)
@pytest.mark.parametrize("command", ("read", "capture"))
def test_bad_privacy_and_filter_settings_exit_2(command, args, message, out_dir):
    where = [DNSPROBE_DATA / "test_pcaps" / "udp_simple.pcap"] if command == "read" else ["-i", "lo"]
    proc = run_dnsprobe(command, *where, "-o", out_dir, "-q", *args, check=False)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert not list(out_dir.iterdir())


@needs_shared
def test_bad_list_in_config_file_names_the_key(tmp_path, out_dir):
    conf = tmp_path / "bad.yml"
    conf.write_text("filter:\n  ipv6_allow: ['2001:db8::/129']\n")
    proc = run_dnsprobe("read", DNSPROBE_DATA / "test_pcaps" / "udp_simple.pcap", "-o", out_dir, "-c", conf,
                        check=False)
    assert proc.returncode == 2 and "config key 'filter.ipv6_allow': '2001:db8::/129'" in proc.stderr


# --- keygen -------------------------------------------------------------------------------------------------------


@needs_shared
def test_keygen_makes_a_usable_private_key(tmp_path, out_dir):
    key = tmp_path / "new.key"
    run_dnsprobe("keygen", key)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert re.fullmatch(r"03:03:[0-9a-f]{32}:[0-9a-f]{64}::[0-9a-f]{32}\n", key.read_text())
    proc = run_dnsprobe("keygen", key, check=False)  # never replaces a key by accident
    assert proc.returncode == 2 and "already exists" in proc.stderr
    before = key.read_text()
    run_dnsprobe("keygen", key, "--force", "--algorithm", "sha1")
    assert key.read_text().startswith("04:04:") and key.read_text() != before
    rows = dnsprobe_read(DNSPROBE_DATA / "test_pcaps" / "udp_simple.pcap", out_dir, "--anonymize-key", key)
    pan = CryptoPAn(read_key_file(key))
    want = str(ipaddress.ip_address(pan.ip4(ipaddress.ip_address("147.229.176.126").packed)))
    assert {r["src"] for r in rows if r["id"] == rows[0]["id"]} == {want}
    assert all(r["dst"] in ("147.229.9.43", "147.229.8.12") for r in rows)


# --- live capture with an allowlist -------------------------------------------------------------------------------

ALLOW = ("--ipv4-allow", "10.1.0.0/17", "--ipv4-allow", "10.2.0.7", "--ipv6-allow", "2001:db8:c::/120")


@pytest.fixture(scope="module")
def allow_traffic(tmp_path_factory):
    """Traffic of test_live_capture (300 transactions), the frames its kernel DNS filter passes, and the
    transactions `dnsprobe read` exports with the allowlist and the anonymisation key."""
    skip_without_shared(DNSPROBE_KEY)
    d = tmp_path_factory.mktemp("allow-traffic")
    pcap = d / "traffic.pcap"
    passed = build_traffic(pcap, 0, 300)
    (d / "all").mkdir()
    (d / "ref").mkdir()
    run_dnsprobe("read", pcap, "-o", d / "all", "-q", "--no-progress")
    run_dnsprobe("read", pcap, "-o", d / "ref", "-q", "--no-progress", *ALLOW, "--anonymize-key", DNSPROBE_KEY)
    everything, expected = rows_of(d / "all"), rows_of(d / "ref")
    # The allowlist's own reading of the unfiltered rows: a client (or server) in one of its prefixes.
    nets = [ipaddress.ip_network(ALLOW[i]) for i in range(1, len(ALLOW), 2)]
    allowed = [r for r in everything if any(ipaddress.ip_address(r[c]) in n for c in ("src", "dst") for n in nets)]
    assert 0 < len(allowed) == len(expected) < len(everything)
    return pcap, passed, keys(expected)


@needs_shared
@root_only
def test_live_allowlist_kernel_and_worker_paths_agree(testbed, allow_traffic, probes, tmp_path):
    pcap, passed, expected = allow_traffic
    results = {}
    for where, extra in (("kernel", ()), ("workers", ("--set", "capture.kernel_ip_filter=false"))):
        out = tmp_path / where
        out.mkdir()
        probe = probes(testbed, out, *ALLOW, "--anonymize-key", DNSPROBE_KEY, *extra)
        probe.wait_ready()
        assert f"IP allow/deny lists applied in the {'kernel filter' if where == 'kernel' else 'workers'}" \
            in probe.stderr
        testbed.send(pcap, pps=3000)
        # Every frame the DNS filter passes is either read (packets) or, in the kernel path, counted there.
        probe.wait_for(lambda d, w=where: d["counters"]["packets"]
                       + (d["counters"]["ip_filtered"] if w == "kernel" else 0) >= passed, "all frames")
        assert probe.stop() == 0, probe.stderr
        doc = probe.stats()
        assert doc["ip_filter"] == where
        c = doc["counters"]
        assert keys(rows_of(out)) == expected  # only the allowed traffic, anonymised as `dnsprobe read` does
        assert c["kernel_drops"] == 0 and c["ip_filtered"] > 0
        if where == "kernel":  # rejected frames never reach the ring: the kernel counted them
            assert c["packets"] + c["ip_filtered"] == passed and c["kernel_received"] == c["packets"]
        else:
            assert c["packets"] == passed
        results[where] = c["ip_filtered"]
    assert results["kernel"] == results["workers"]
