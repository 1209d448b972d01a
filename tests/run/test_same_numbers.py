"""The same numbers everywhere: one live capture on a veth pair (capture.top and the Prometheus endpoint on), known
traffic of several RCODEs, QTYPEs, transports, unanswered queries and responses without a query; then `dnsprobe
top --json`, the Prometheus metrics, and after the capture `inspect --summary --json` and `report` on the files
written must state the same figures, each as the traffic holds them (docs/usage.md, "The same numbers
everywhere", says which figure each tool has)."""

import html
import json
import os
import re
import shutil
import socket
import struct
import time
import urllib.request
from collections import Counter

import pytest
from scapy.layers.dns import DNS
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw
from scapy.utils import wrpcap
from support.dnsprobe import run_dnsprobe
from support.live import CLIENT_MAC, SERVER_MAC, Probe, VethBed
from support.messages import q_dns, r_dns

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"), reason="needs root and iproute2")

SERVER = "198.51.100.53"
QUERY_TIMEOUT_S = 0.5  # match.query_timeout: the unanswered queries are written as soon as the tail's packets come
# (QNAME, QTYPE, RCODE (None: no response), kind, transactions): kind "matched", "query" (no response) or
# "response" (no query); QNAMEs of one registered domain under several names, and a multi-label public suffix.
MIX = [
    ("www.example.com", "A", 0, "matched", 40), ("mail.example.com", "A", 0, "matched", 20),
    ("shop.example.co.uk", "A", 0, "matched", 30), ("www.example.com", "AAAA", 0, "matched", 15),
    ("example.org", "MX", 0, "matched", 10), ("nope.example.net", "A", 3, "matched", 12),
    ("broken.example.org", "TXT", 2, "matched", 8), ("x.example.com", "A", 5, "matched", 5),
    ("lost.example.net", "A", None, "query", 9), ("orphan.example.com", "A", 0, "response", 4),
    (None, None, 0, "matched", 3),  # no question: no QNAME nor QTYPE
]
TCP_NAMES = ["tcp.example.com"] * 3  # a connection each, one transaction (NOERROR A)
DOT_NAMES = ["dot.example.net"] * 4  # from a dnstap producer beside the interface: transport DoT (IP protocol 6)
TAIL = [("tail.example.org", "A", 0, "matched", 6)]  # sent after the query timeout: it moves the capture's clock


def client(i):
    return f"192.0.2.{1 + i % 5 if i % 4 else 100}"


def _domain(name):
    if name is None:
        return ""  # (as a public suffix's)
    return ".".join(name.split(".")[-3 if name.endswith(".co.uk") else -2:])


def _messages(qid, name, qtype, rcode):
    """(query, response) bytes; name None: without a question."""
    if name is None:
        return bytes(DNS(id=qid, rd=1, qd=[])), bytes(DNS(id=qid, qr=1, rd=1, ra=1, qd=[], rcode=rcode))
    answers = 1 if rcode == 0 and qtype == "A" else 0
    return q_dns(qid, name, qtype), r_dns(qid, name, qtype, answers, rcode=rcode)


class Traffic:
    """Frames and the exact counts of the transactions they make."""

    def __init__(self):
        self.frames, self.n = [], 0
        self.counts = {key: Counter() for key in ("kind", "rcode", "qtype", "transport", "qnames",
                                                  "registered_domains", "clients")}

    def count(self, name, qtype, rcode, kind, c, transport):
        for key, value in (("kind", kind), ("rcode", rcode), ("qtype", qtype), ("transport", transport),
                           ("qnames", name), ("registered_domains", _domain(name)), ("clients", c)):
            self.counts[key][value] += 1

    def udp(self, mix):
        order = [row for row in mix for _ in range(row[-1])]
        for name, qtype, rcode, kind, _ in (order[(i * 7919) % len(order)] for i in range(len(order))):
            c, port, qid = client(self.n), 20000 + self.n, self.n & 0xFFFF
            self.n += 1
            query, response = _messages(qid, name, qtype, rcode)
            if kind != "response":
                self.frames.append(Ether(src=CLIENT_MAC, dst=SERVER_MAC) / IP(src=c, dst=SERVER)
                                   / UDP(sport=port, dport=53) / Raw(query))
            if kind != "query":
                self.frames.append(Ether(src=SERVER_MAC, dst=CLIENT_MAC) / IP(src=SERVER, dst=c)
                                   / UDP(sport=53, dport=port) / Raw(response))
            self.count(name, qtype, rcode, kind, c, "udp")

    def tcp(self, names):
        for name in names:
            c, port, qid = client(self.n), 30000 + self.n, self.n & 0xFFFF
            self.n += 1
            q, r = q_dns(qid, name), r_dns(qid, name)
            q, r = struct.pack("!H", len(q)) + q, struct.pack("!H", len(r)) + r
            cs, ss = 1000, 5000
            for to_server, flags, seq, ack, payload in (
                    (True, "S", cs, 0, b""), (False, "SA", ss, cs + 1, b""), (True, "A", cs + 1, ss + 1, b""),
                    (True, "PA", cs + 1, ss + 1, q), (False, "PA", ss + 1, cs + 1 + len(q), r),
                    (True, "FA", cs + 1 + len(q), ss + 1 + len(r), b""),
                    (False, "FA", ss + 1 + len(r), cs + 2 + len(q), b""),
                    (True, "A", cs + 2 + len(q), ss + 2 + len(r), b"")):
                ends = (c, SERVER, port, 53) if to_server else (SERVER, c, 53, port)
                macs = (CLIENT_MAC, SERVER_MAC) if to_server else (SERVER_MAC, CLIENT_MAC)
                self.frames.append(Ether(src=macs[0], dst=macs[1]) / IP(src=ends[0], dst=ends[1])
                                   / TCP(sport=ends[2], dport=ends[3], flags=flags, seq=seq, ack=ack) / payload)
            self.count(name, "A", 0, "matched", c, "tcp")

    def dot(self, names):
        """dnstap frames (client query and response over DoT) at the present time: a dnstap message's time is
        its producer's."""
        from support.dnstap import dnstap_frame

        frames = []
        for name in names:
            c, port, qid, now = client(self.n), 40000 + self.n, self.n & 0xFFFF, time.time_ns()
            self.n += 1
            frames += [dnstap_frame("CLIENT_QUERY", dns=q_dns(qid, name), protocol="DOT", qaddr=c, raddr=SERVER,
                                    qport=port, rport=853, ts=now),
                       dnstap_frame("CLIENT_RESPONSE", dns=r_dns(qid, name), protocol="DOT", qaddr=c, raddr=SERVER,
                                    qport=port, rport=853, ts=now + 300_000)]
            self.count(name, "A", 0, "matched", c, "dot")
        return frames

    def write(self, path):
        wrpcap(str(path), self.frames)
        return len(self.frames)


@pytest.fixture(scope="module")
def traffic(tmp_path_factory):
    """(main pcap, tail pcap, frames of both, the Traffic: its counts, its dot())."""
    where = tmp_path_factory.mktemp("same")
    traffic = Traffic()
    traffic.udp(MIX)
    traffic.tcp(TCP_NAMES)
    main = traffic.write(where / "main.pcap")
    traffic.frames = []
    traffic.udp(TAIL)
    tail = traffic.write(where / "tail.pcap")
    return where / "main.pcap", where / "tail.pcap", main + tail, traffic


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prometheus(text):
    """{name: [(labels dict, value)]} of the metrics' samples."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(\w+)(?:\{(.*)\})? (\S+)$", line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            out.setdefault(m.group(1), []).append((labels, float(m.group(3))))
    return out


def by_label(samples, label):
    total = Counter()
    for labels, value in samples:
        total[labels[label]] += int(value)
    return total


@pytest.fixture(scope="module")
def seen(traffic, tmp_path_factory):
    """What each tool said of the one capture ({tool: its document}), the traffic's exact counts, and the frames
    sent on the interface."""
    from support.dnstap import FstrmProducer

    main, tail, frames, traffic = traffic
    expected = traffic.counts
    out = tmp_path_factory.mktemp("same-out")
    port, tap = free_port(), out.parent / f"{out.name}.tap"
    with VethBed() as bed:
        probe = Probe(bed, out, "--set", "capture.top=true", "--set", "export.flush_seconds=0.3", "--set",
                      f"match.query_timeout={QUERY_TIMEOUT_S}", "--prometheus-port", port, "--dnstap-socket", tap)
        try:
            probe.wait_ready()
            producer = FstrmProducer(tap).handshake()
            producer.send(traffic.dot(DOT_NAMES))
            total = sum(expected["kind"].values())
            bed.send(main, pps=2000)
            time.sleep(2 * QUERY_TIMEOUT_S)
            bed.send(tail, pps=2000)
            top = metrics = None
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                top = json.loads(run_dnsprobe("top", "-o", out, "--json", "-n", "60").stdout)
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
                metrics = prometheus(text)
                written = sum(v for _, v in metrics.get("dnsprobe_dns_transactions_total", []))
                packets = sum(v for _, v in metrics.get("dnsprobe_packets_total", []))
                if top["transactions"] >= total and top["packets"] >= frames + 2 * len(DOT_NAMES) \
                        and written >= total and packets >= frames:
                    break
                time.sleep(0.3)
            producer.close()
        finally:
            assert probe.stop() == 0, probe.stderr
            probe.kill()
    files = sorted(str(p) for p in out.glob("*.parquet"))
    summary = json.loads(run_dnsprobe("inspect", "--summary", "--json", "--limit", "100", *files).stdout)
    run_dnsprobe("report", *files, "-o", out / "report.html", "--limit", "100")
    page = (out / "report.html").read_text()
    figures = re.search(r'<pre id="dnsprobe-figures" hidden>(.*?)</pre>', page, re.S)
    assert figures, "the report holds its figures as JSON"
    report = json.loads(html.unescape(figures.group(1)))
    return {"top": top, "prometheus": metrics, "summary": summary, "report": report}, expected, frames


def test_transactions(seen):
    tools, expected, _ = seen
    total = sum(expected["kind"].values())
    assert tools["top"]["transactions"] == total
    assert sum(by_label(tools["prometheus"]["dnsprobe_dns_transactions_total"], "rcode").values()) == total
    for tool in ("summary", "report"):
        assert tools[tool]["records"] == total, tool
        assert tools[tool]["transactions"] == {"matched": expected["kind"]["matched"],
                                               "query_only": expected["kind"]["query"],
                                               "response_only": expected["kind"]["response"]}, tool


def test_matched_delays(seen):
    """The matched transactions are those with a response delay, in every tool."""
    tools, expected, _ = seen
    matched = expected["kind"]["matched"]
    assert tools["top"]["delay"]["count"] == matched
    (count,) = tools["prometheus"]["dnsprobe_dns_response_delay_seconds_count"]
    assert count[1] == matched
    for tool in ("summary", "report"):
        assert tools[tool]["response_delay_us"]["count"] == matched, tool


def test_delay_figures(seen):
    """The delays' sum is Prometheus' and the summary's (its mean × count); top's percentiles are the exact ones'
    bins (of 1/128 octave of delay + 1 µs): at or below them, by less than 2^(1/128)."""
    tools, _, _ = seen
    exact = tools["summary"]["response_delay_us"]
    assert tools["report"]["response_delay_us"] == exact
    ((_, seconds),) = tools["prometheus"]["dnsprobe_dns_response_delay_seconds_sum"]
    assert seconds * 1e6 == pytest.approx(exact["mean"] * exact["count"], abs=1)
    for name in ("p50", "p90", "p95", "p99", "p99.9"):
        binned = tools["top"]["delay"][name]
        assert binned <= exact[name] and (exact[name] + 1) / (binned + 1) < 2 ** (1 / 128), name


def test_rcode_mix(seen):
    """RCODEs by name; "none": no response (the query-only transactions)."""
    tools, expected, _ = seen
    want = {{0: "NOERROR", 2: "SERVFAIL", 3: "NXDOMAIN", 5: "REFUSED", None: "none"}[r]: n
            for r, n in expected["rcode"].items()}
    assert want["none"] == expected["kind"]["query"]
    assert {m["name"]: m["count"] for m in tools["top"]["rcode"]} == want
    assert by_label(tools["prometheus"]["dnsprobe_dns_transactions_total"], "rcode") == want
    for tool in ("summary", "report"):
        assert {r["name"] or "none": r["count"] for r in tools[tool]["rcodes"]} == want, tool
    # and the report's plot of them over time (its timeline's keys are JSON's: "null" for no response)
    timeline = tools["report"]["timeline"]["rcodes"]
    assert {("none" if name == "null" else name): sum(counts) for name, counts in timeline.items()} == want


def test_qtype_mix(seen):
    """QTYPEs by name; "none": a transaction without a question."""
    tools, expected, _ = seen
    want = {q or "none": n for q, n in expected["qtype"].items()}
    assert want["none"] == 3
    assert {m["name"]: m["count"] for m in tools["top"]["qtype"]} == want
    assert by_label(tools["prometheus"]["dnsprobe_dns_transactions_total"], "qtype") == want
    for tool in ("summary", "report"):
        assert {r["name"] or "none": r["count"] for r in tools[tool]["qtypes"]} == want, tool


def test_transports(seen):
    tools, expected, _ = seen
    want = dict(expected["transport"])
    assert by_label(tools["prometheus"]["dnsprobe_dns_transactions_total"], "transport") == want
    for tool in ("summary", "report"):
        assert {r["transport"]: r["count"] for r in tools[tool]["transports"]} == want, tool


@pytest.mark.parametrize(("key", "column"), [("qnames", "qname"), ("registered_domains", "registered_domain"),
                                             ("clients", "src")])
def test_top_lists(seen, key, column):
    """The whole lists (every value fits in them), counts exact, ranked the same (equal counts by value); a null
    QNAME (no question) is in no list, its registered domain is "" (as a public suffix's)."""
    tools, expected, _ = seen
    want = sorted(((v, c) for v, c in expected[key].items() if v is not None), key=lambda vc: (-vc[1], vc[0]))
    assert [(e["value"], e["count"]) for e in tools["top"][key]] == want
    assert all(e["error"] == 0 for e in tools["top"][key])
    for tool in ("summary", "report"):
        ranked = tools[tool][key]
        assert ranked["distinct"] == len(want), tool
        assert [(r[column], r["count"]) for r in ranked["top"]] == want, tool


def test_packets(seen):
    """Packets are top's and Prometheus' only (the files hold transactions): every frame sent passed the filter.
    top's packets are the frames read from every source: packets and dnstap messages."""
    tools, expected, frames = seen
    metrics = tools["prometheus"]
    assert sum(v for _, v in metrics["dnsprobe_packets_total"]) == frames
    dnstap = sum(v for _, v in metrics["dnsprobe_dnstap_frames_total"])
    assert dnstap == 2 * len(DOT_NAMES) == 2 * expected["transport"]["dot"]
    assert tools["top"]["packets"] == frames + dnstap
