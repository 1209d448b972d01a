"""dnstap from real servers (Debian's Knot DNS with mod-dnstap, Knot Resolver, Unbound), checked against packet
capture of the same traffic and against an independent dnstap decoder.

One run for the module, in a network namespace of its own with only loopback: `dnsprobe capture -i lo
--dnstap-socket PATH` (AF_PACKET and dnstap in one capture), then the three servers as producers on that one
socket at once, Knot running as its own user (the socket's group and mode let it in) and also writing a dnstap
file. Traffic: dnsperf to Knot over UDP and TCP, kdig to Knot Resolver over UDP, TCP, DoT (853) and DoH (443),
kdig to Unbound over UDP, TCP and DoT. Then the servers stop (each sends STOP and gets FINISH), the capture
stops, and the tests compare what it wrote: every dnstap transaction of a UDP or TCP query on port 53 equals the
packet capture's transaction of it, field by field, but for the fields that cannot agree (DIFFERENT below).
"""

import json
import os
import pwd
import re
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest
from support.dnsprobe import rows_of, run_dnsprobe
from support.live import Probe
from support.servers import (
    EXAMPLE_ZONE,
    Netns,
    knot_config,
    kresd_config,
    make_certificate,
    missing_servers,
    stop_servers,
    unbound_config,
)

# Fields of a transaction that dnstap and packet capture cannot agree on, and why (docs/dnstap.md lists them).
DIFFERENT = {
    "len": "frame lengths: dnstap carries the DNS message, not the frames",
    "res_len": "frame lengths: dnstap carries the DNS message, not the frames",
    "ttl": "the IP TTL / hop limit is not in dnstap",
    "udp_sum": "the UDP checksum is not in dnstap",
    "tcp_hs_rtt": "dnstap has no TCP handshake",
    "unixtime": "the server's clock when it logged, not the kernel's when the frame passed",
    "time": "the same",
    "time_micro": "the same",
    "timestamp": "the same",
    "query_time": "the same",
    "response_time": "the same",
    "response_delay_us": "the same (both ends of the delay)",
    "dnstap_type": "what the row came from",
    "server_identity": "what the row came from",
}
TIME_SLACK_NS = 50_000_000  # how far the server's and the kernel's times of one message may be apart (far more than
# the few microseconds measured: docs/dnstap.md)
KNOT, KRESD, UNBOUND = "127.0.0.1", "127.0.0.2", "127.0.0.3"
IDENTITIES = {"knotd": "knot-i20", "kresd": "kresd-i20", "unbound": "unbound-i20"}
KNOT_QUERIES = ["www.example.test A", "www.example.test AAAA", "nx.example.test A", "big.example.test TXT",
                "example.test MX"]
KRESD_NAMES = {t: f"q-{t}.local.test" for t in ("udp", "tcp", "dot", "doh")}
UNBOUND_NAMES = {t: f"u-{t}.local.test" for t in ("udp", "tcp", "dot")}
KDIG_OPTS = {"udp": ([], 53), "tcp": (["+tcp"], 53), "dot": (["+tls"], 853), "doh": (["+https"], 443)}

pytestmark = pytest.mark.skipif(
    bool(missing_servers("knotd", "kdig", "kresd", "unbound", "dnsperf", "openssl")),
    reason=str(missing_servers("knotd", "kdig", "kresd", "unbound", "dnsperf", "openssl")),
)


class Run:
    """What the module's capture run produced."""


def _dnsperf(ns, d, mode, passes):
    proc = ns.run("dnsperf", "-s", KNOT, "-p", "53", "-m", mode, "-d", d / "knot-queries.txt", "-n", passes,
                  "-c", "4", "-Q", "1000", "-t", "2", timeout=120)  # (Knot drops what overflows its queue)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sent = int(re.search(r"Queries sent:\s+(\d+)", proc.stdout).group(1))
    done = int(re.search(r"Queries completed:\s+(\d+)", proc.stdout).group(1))
    assert sent == done == passes * len(KNOT_QUERIES), proc.stdout
    return sent


def _ready(ns, server, name):
    """Query until the server answers; returns the number of queries it answered (they are logged too)."""
    deadline = time.monotonic() + 30
    while ns.kdig(server, name) is None:
        assert time.monotonic() < deadline, f"{server} does not answer"
        time.sleep(0.05)
    return 1


def _producers(probe):
    """connection name -> program, for the producers that have started (sent START)."""
    text = probe.stderr
    names = dict(re.findall(r"dnstap producer (\w+) connected: (\w+), pid", text))
    return {c: names.get(c) for c in re.findall(r"dnstap producer (\w+) started \(bidirectional", text)}


def _wait(what, predicate, timeout=30):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def run():
    d = Path(tempfile.mkdtemp(prefix="dnsprobe-i20-", dir="/tmp"))  # short: a Unix socket path has 107 bytes
    os.chmod(d, 0o755)  # Knot, as its own user, reaches the socket through it
    ns = Netns("dt").up()
    servers, probe = [], None
    try:
        r = Run()
        sock, r.knot_file = d / "tap.sock", d / "knot" / "knot.tap"
        (d / "knot" / "db").mkdir(parents=True)
        (d / "kresd").mkdir()
        (d / "unbound").mkdir()
        (d / "out").mkdir()
        (d / "knot" / "example.test.zone").write_text(EXAMPLE_ZONE)
        (d / "knot-queries.txt").write_text("\n".join(KNOT_QUERIES) + "\n")
        make_certificate(d)
        knot_conf = knot_config(d, sock, r.knot_file, IDENTITIES["knotd"])
        socket_access = ["--dnstap-socket-mode", "0666"]
        try:
            pwd.getpwnam("knot")
            knot_conf = knot_conf.replace("server:\n", "server:\n    user: knot:knot\n", 1)
            shutil.chown(d / "knot", "knot", "knot")
            for p in (d / "knot").rglob("*"):
                shutil.chown(p, "knot", "knot")
            socket_access = ["--dnstap-socket-group", "knot", "--dnstap-socket-mode", "0660"]
            r.knot_user = "knot"
        except KeyError:
            r.knot_user = "root"
        (d / "knot.conf").write_text(knot_conf)
        (d / "kresd.conf").write_text(kresd_config(d, sock, IDENTITIES["kresd"], ["ready.local.test",
                                                                                  *KRESD_NAMES.values()]))
        (d / "unbound.conf").write_text(unbound_config(d, sock, IDENTITIES["unbound"], ["ready.local.test",
                                                                                        *UNBOUND_NAMES.values()]))
        # our socket first: Knot Resolver never connects to a socket that is missing when it starts
        probe = Probe(None, d / "out", "-i", "lo", "--dnstap-socket", sock, *socket_access, netns=ns.name)
        probe.wait_ready()
        servers += [
            ns.start(d / "knot.log", "knotd", "-c", d / "knot.conf"),
            ns.start(d / "kresd.log", "kresd", "-n", "-c", d / "kresd.conf", d / "kresd"),
            ns.start(d / "unbound.log", "unbound", "-d", "-p", "-c", d / "unbound.conf"),
        ]
        # producers drop what they log before START: every server has sent it before any query
        _wait("START from the three servers", lambda: sorted(filter(None, _producers(probe).values()))
              == ["knotd", "kresd", "unbound"])
        knot_n = _ready(ns, KNOT, "www.example.test")
        client_n = _ready(ns, KRESD, "ready.local.test") + _ready(ns, UNBOUND, "ready.local.test")
        knot_n += _dnsperf(ns, d, "udp", 100) + _dnsperf(ns, d, "tcp", 60)
        assert ns.kdig("::1", "www.example.test", qtype="AAAA") == "2001:db8::1"
        knot_n += 1
        r.answers = {}
        for server, names in ((KRESD, KRESD_NAMES), (UNBOUND, UNBOUND_NAMES)):
            for transport, name in names.items():
                opts, port = KDIG_OPTS[transport]
                r.answers[name] = ns.kdig(server, name, *opts, port=port)
                client_n += 1
        # every message logged has arrived (Unbound drops what it has not written yet when it stops)
        probe.wait_for(lambda doc: doc["counters"]["dnstap_auth_response"] >= knot_n
                       and doc["counters"]["dnstap_client_response"] >= client_n, "the servers' messages")
        r.expected = {"auth": knot_n, "client": client_n}
        stop_servers(servers)
        r.server_logs = {name: (d / f"{name}.log").read_text() for name in ("knot", "kresd", "unbound")}
        _wait("the servers' STOP", lambda: probe.stats()["counters"]["dnstap_disconnections"] >= 3, timeout=10)
        assert probe.stop() == 0, probe.stderr
        r.stderr, r.stats = probe.stderr, probe.stats()
        r.rows = rows_of(d / "out")
        r.file_rows = _read_file(r.knot_file, d / "file-out")
        r.file_oracle = _golang_dnstap(r.knot_file)
        r.dir = d
        yield r
    finally:
        stop_servers(servers)
        if probe is not None:
            probe.kill()
        ns.down()
        shutil.rmtree(d, ignore_errors=True)


def _read_file(path, out):
    out.mkdir()
    run_dnsprobe("read", path, "-o", out, "-q", "--no-progress")
    return rows_of(out), json.loads(next(out.glob("*.stats.json")).read_text())["counters"]


def _golang_dnstap(path):
    """The messages of a dnstap file as golang-dnstap's `dnstap -j` decodes them (None: not installed)."""
    if not shutil.which("dnstap"):
        return None
    proc = subprocess.run(["dnstap", "-r", str(path), "-j"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def _packet_rows(rows, server, port=53):
    return [r for r in rows if r["dnstap_type"] is None and r["dst"] == server and r["dstp"] == port]


def _dnstap_rows(rows, identity):
    return [r for r in rows if r["server_identity"] == identity]


def _key(r):
    return (r["prot"], r["src"], r["srcp"], r["dst"], r["dstp"], r["id"], r["qname"], r["qtype"])


def _pairs(packet_rows, dnstap_rows):
    """(packet row, dnstap row) of each transaction; every transaction once on each side."""
    by_key = {}
    for side, rows in (("packet", packet_rows), ("dnstap", dnstap_rows)):
        keys = Counter(_key(r) for r in rows)
        assert max(keys.values(), default=1) == 1, f"{side}: a transaction twice: {keys.most_common(2)}"
        for r in rows:
            by_key.setdefault(_key(r), {})[side] = r
    lonely = [k for k, v in by_key.items() if len(v) != 2]
    assert not lonely, f"{len(lonely)} transactions on one side only, e.g. {lonely[:3]}"
    return [(v["packet"], v["dnstap"]) for v in by_key.values()]


def assert_same_transactions(packet_rows, dnstap_rows):
    """Equal field by field but for DIFFERENT; the times within TIME_SLACK_NS."""
    pairs = _pairs(packet_rows, dnstap_rows)
    for p, t in pairs:
        diff = {c: (p[c], t[c]) for c in p if c not in DIFFERENT and p[c] != t[c]}
        assert not diff, f"packet vs dnstap {_key(p)}: {diff}"
        for c in ("timestamp", "query_time", "response_time"):
            assert (p[c] is None) == (t[c] is None) and abs((p[c] or 0) - (t[c] or 0)) < TIME_SLACK_NS, (c, p, t)
        assert t["len"] is t["res_len"] is t["ttl"] is t["udp_sum"] is t["tcp_hs_rtt"] is None
    return pairs


def test_the_three_servers_connected_with_the_handshake_and_stopped_cleanly(run):
    c = run.stats["counters"]
    assert (c["dnstap_connections"], c["dnstap_disconnections"]) == (3, 3)
    for name in ("dnstap_refused", "dnstap_frame_errors", "dnstap_truncated", "dnstap_decode_errors",
                 "dnstap_not_message", "dnstap_unknown_type", "dnstap_no_time", "dnstap_no_dns",
                 "dnstap_bad_address"):
        assert c[name] == 0, (name, run.stderr)
    assert len(re.findall(r"dnstap producer \w+ \([a-z]+, pid \d+\) closed, after", run.stderr)) == 3, run.stderr
    assert "knotd" in run.stderr and "kresd" in run.stderr and "unbound" in run.stderr
    assert run.stats["dnstap"] and c["packets"] > 0  # packet capture and dnstap in one run


def test_knot_dnstap_equals_packet_capture(run):
    """dnsperf over UDP and TCP to Knot DNS: each transaction once in dnstap and once in packets, equal."""
    dnstap_rows = _dnstap_rows(run.rows, IDENTITIES["knotd"])
    packet_rows = _packet_rows(run.rows, KNOT) + _packet_rows(run.rows, "::1")
    assert len(dnstap_rows) == run.expected["auth"]
    pairs = assert_same_transactions(packet_rows, dnstap_rows)
    assert Counter(t["transport"] for _, t in pairs) == Counter({"udp": 501 + 1, "tcp": 300})
    assert {t["dnstap_type"] for _, t in pairs} == {"auth"} and any(t["ipv"] == 6 for _, t in pairs)
    assert all(t["query_present"] and t["response_present"] for _, t in pairs)
    assert {t["rcode"] for _, t in pairs} == {0, 3}  # nx.example.test: NXDOMAIN


def test_a_response_carrying_its_query_counts_once(run):
    """Knot's responses-with-queries: every AUTH_RESPONSE carries its query, which was logged too."""
    c = run.stats["counters"]
    assert c["dnstap_embedded_queries"] == c["dnstap_auth_response"] == run.expected["auth"]
    assert c["dnstap_embedded_used"] == 0


def test_knot_resolver_over_every_transport(run):
    """kdig over UDP, TCP, DoT and DoH to Knot Resolver: each query once, with its transport; the UDP and TCP
    ones equal packet capture's (DoT and DoH are TLS on the wire)."""
    rows = _dnstap_rows(run.rows, IDENTITIES["kresd"])
    for transport, name in KRESD_NAMES.items():
        assert run.answers[name], name
        (row,) = [r for r in rows if r["qname"] == name]
        assert (row["transport"], row["prot"], row["dnstap_type"]) == (transport, 17 if transport == "udp" else 6,
                                                                      "client")
        assert row["dstp"] == KDIG_OPTS[transport][1] and row["query_present"] and row["response_present"]
    packet_rows = [r for r in _packet_rows(run.rows, KRESD) if r["qname"] in KRESD_NAMES.values()]
    assert_same_transactions(packet_rows, [r for r in rows if r["transport"] in ("udp", "tcp")
                                           and r["qname"] in KRESD_NAMES.values()])


def test_unbound_as_a_second_producer(run):
    """Unbound 1.17 labels DoT as TCP in dnstap: the transport column says what the producer says."""
    rows = _dnstap_rows(run.rows, IDENTITIES["unbound"])
    for transport, name in UNBOUND_NAMES.items():
        assert run.answers[name], name
        (row,) = [r for r in rows if r["qname"] == name]
        assert row["transport"] == ("tcp" if transport == "dot" else transport)
        assert row["dstp"] == KDIG_OPTS[transport][1]
    packet_rows = [r for r in _packet_rows(run.rows, UNBOUND) if r["qname"] in UNBOUND_NAMES.values()]
    assert_same_transactions(packet_rows, [r for r in rows if r["dstp"] == 53 and r["qname"] in UNBOUND_NAMES.values()])


def test_knot_file_sink_read_equals_the_socket(run):
    """The file Knot wrote at the same time, through `dnsprobe read`: the socket's transactions (the two
    mod-dnstap instances stamp their messages each with its own clock reading)."""
    file_rows, counters = run.file_rows
    socket_rows = _dnstap_rows(run.rows, IDENTITIES["knotd"])
    assert counters["dnstap_frames"] == 2 * run.expected["auth"] and counters["matched"] == run.expected["auth"]
    key = lambda r: _key(r)  # noqa: E731
    by_key = {key(r): r for r in socket_rows}
    assert len(file_rows) == len(by_key) == len(socket_rows)
    timed = {"unixtime", "time", "time_micro", "timestamp", "query_time", "response_time", "response_delay_us"}
    for r in file_rows:
        s = by_key[key(r)]
        assert {c: (r[c], s[c]) for c in r if c not in timed and r[c] != s[c]} == {}
        assert abs(r["query_time"] - s["query_time"]) < TIME_SLACK_NS


@pytest.mark.skipif(not shutil.which("dnstap"), reason="dnstap (package golang-github-dnstap-golang-dnstap-cli)"
                    " missing: the independent decoder")
def test_the_file_as_golang_dnstap_decodes_it(run):
    """Every message of Knot's file, decoded by us, equals golang-dnstap's decoding of it: type, time to the
    nanosecond, ends, protocol, identity, DNS ID and question."""
    from probe.capture.files import open_file_source
    from probe.config import load_config
    from probe.decode.dnstap import DnstapDecoder
    from probe.decode.dnstap_types import TYPE_NAMES
    from probe.model import M, QueryCopy
    from probe.stats import Stats

    cfg = load_config(overrides={"dnstap.message_types": list(TYPE_NAMES)})
    decoder = DnstapDecoder(cfg.dnstap, cfg.decode, Stats())
    source = open_file_source(run.knot_file)
    ours = []
    while (batch := source.read()) is not None:
        ours += [m for m in decoder.decode(batch) if type(m) is not QueryCopy]
    source.close()
    theirs = run.file_oracle
    assert len(ours) == len(theirs) == 2 * run.expected["auth"]
    import datetime
    import ipaddress

    for m, j in zip(ours, theirs):
        jm = j["message"]
        response = jm["type"].endswith("RESPONSE")
        stamp = jm["response_time" if response else "query_time"]
        whole, frac = stamp.rstrip("Z").split(".")
        t = datetime.datetime.fromisoformat(whole).replace(tzinfo=datetime.timezone.utc)
        assert m[M.TS_NS] == int(t.timestamp()) * 1_000_000_000 + int(frac.ljust(9, "0")), (m, j)
        assert m[M.ORIGIN] == ("auth", j["identity"])
        assert m[M.TRANSPORT] == {"UDP": 1, "TCP": 2}[jm["socket_protocol"]]
        assert m[M.IPV] == {"INET": 4, "INET6": 6}[jm["socket_family"]]
        client = (ipaddress.ip_address(jm["query_address"]).packed, jm["query_port"])
        server = (ipaddress.ip_address(jm["response_address"]).packed, jm["response_port"])
        assert ((m[M.SRC], m[M.SPORT]), (m[M.DST], m[M.DPORT])) == ((server, client) if response else (client, server))
        text = jm["response_message" if response else "query_message"]
        assert m[M.ID] == int(re.search(r"id: (\d+)", text).group(1))
        question = re.search(r"QUESTION SECTION:\n;(\S+)\.\s+IN\s+(\S+)", text)
        assert m[M.QNAME] == question.group(1)


def test_knot_as_its_own_user_reached_our_socket(run):
    """Knot drops to user knot after binding port 53 and connects as that user: the socket's group and mode
    (--dnstap-socket-group knot --dnstap-socket-mode 0660) let it in."""
    if run.knot_user != "knot":
        pytest.skip("no user knot on this machine (package knot creates it)")
    assert "knot-i20" in {r["server_identity"] for r in run.rows}


def test_every_row_is_counted(run):
    c = run.stats["counters"]
    assert len(run.rows) == c["records"]
    assert c["dnstap_frames"] == sum(c[f"dnstap_{t}_{h}"] for t in ("auth", "client") for h in ("query", "response"))
    assert sum(r["dnstap_type"] is not None for r in run.rows) == sum(run.expected.values())
