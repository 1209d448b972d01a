"""The record matcher (probe.match._matchrec, RecordTable) must give exactly what the reference, TransactionTable
(Python, on message tuples), gives: the same transactions in the same order after every batch and at flush, the
same counters, the same pending queries.

The same decoded messages go to both (as a MsgBatch of records and as tuples). Inputs: every capture the project
has (DNS Probe's, compactor's including its matching/unmatched/malformed cases and the knot/nsd live captures),
the benchmark's standard mix, and generated traffic that walks every branch of matching: retries reusing ID and
port, answers whose QNAME differs in case (ASCII and not) or equal only through str.lower, responses without a
question, answers after the timeout, duplicate answers, AXFR/IXFR over TCP and UDP, malformed messages; at
several batch sizes and configurations (default, a 2 ms timeout, max_pending 3, which evicts all the time, keys
that hold one or two queries). The table bounds (queries held under one key, queries in all) hold in both.
"""

import random
import sys

import pytest
from scapy.layers.dns import DNS, DNSQR, DNSRR, DNSRRSOA
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether
from scapy.packet import Raw
from support import (
    COMPACTOR_DATA,
    DNSPROBE_DATA,
    MAC_C,
    MAC_S,
    ROOT,
    TcpConn,
    framed,
    needs_shared,
    write_pcap,
)

from probe import _records
from probe.capture.pcapfile import read_capture
from probe.config import MatchConfig, load_config
from probe.decode.ipfilter import IpFilter
from probe.decode.packets import PacketDecoder
from probe.match import RecordTable, TransactionTable
from probe.model import M
from probe.stats import Stats

NS = 1_000_000_000
T0 = 1_700_000_000 * NS
SHARED_CAPTURES = sorted((DNSPROBE_DATA / "test_pcaps").glob("*")) + sorted(
    p for p in COMPACTOR_DATA.glob("*.pcap*") if p.name.endswith((".pcap", ".pcap.xz"))
)
BENCH_CAPTURE = ROOT / "benchmarks" / "cache" / "standard-n20000-s1-v2.pcap"

# Default, a timeout shorter than many answers, a table that evicts all the time, and keys that hold one or two
# queries (a retry evicts the oldest).
CONFIGS = {
    "default": MatchConfig(),
    "timeout-2ms": MatchConfig(query_timeout=0.002),
    "max-pending-3": MatchConfig(max_pending=3),
    "per-key-1": MatchConfig(max_pending_per_key=1),
    "per-key-2": MatchConfig(max_pending_per_key=2),
}


@needs_shared
def test_captures_found():
    names = {p.name for p in SHARED_CAPTURES}
    assert {
        "udp_simple.pcap",
        "tcp_axfr_zone_transfer.pcap",
        "knot-live.raw.pcap.xz",
        "nsd-live.raw.pcap.xz",
        "matching.pcap.xz",
        "unmatched.pcap.xz",
        "malformed.pcap.xz",
    } <= names, names


def bench_capture():
    if not BENCH_CAPTURE.exists():
        sys.path.insert(0, str(ROOT / "benchmarks"))
        import traffic

        return traffic.generate("standard", 20000, 1)
    return BENCH_CAPTURE


def typed(value):
    """The value with the type of every part, so that == also compares types (True != 1 here)."""
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(typed(v) for v in value))
    return (type(value).__name__, value)


def test_extension_is_built():
    from probe.match import _matchrec

    assert callable(_matchrec.Matcher) and RecordTable.supports(CONFIGS["default"])
    assert not RecordTable.supports(CONFIGS["default"].__class__(query_timeout=1e10))


def python_batches(path, batch_size, clocks=None):
    """The message tuples of a capture, batch by batch, from the Python decoder. clocks: a list given the decoder's
    clock after each batch (the time of its last frame, the pipeline's clock)."""
    cfg = load_config(overrides={"decode.parser": "wire"})
    decoder = PacketDecoder(cfg.decode, cfg.decode.dns_ports, Stats(), IpFilter(cfg.filter))
    batches = []
    for frames in read_capture(path, batch_size):
        batches.append(decoder.decode(frames, str(path)))
        if clocks is not None:
            clocks.append(decoder.now_ns)
    decoder.flush()
    return batches


def assert_same_matching(batches, match_cfg, label, clocks=None):
    """The batches through RecordTable and through TransactionTable's Python loop: equal after every batch and
    at flush. clocks: the capture clock given with each batch (None: the tables run on their messages' time).
    Returns the transactions and the counters."""
    sc, sp = Stats(), Stats()
    c, py = RecordTable(match_cfg, sc), TransactionTable(match_cfg, sp)
    msgs, out = _records.MsgBatch(), _records.TxBatch()
    everything = []
    for k, batch in enumerate(batches):
        msgs.clear()
        msgs.extend(batch)
        clock = clocks[k] if clocks is not None else None
        c.add(msgs, out, clock)
        got, want = out.to_tuples(), py.add(batch, clock)
        out.clear()
        assert len(got) == len(want), f"{label} batch {k}: {len(got)} transactions in C, {len(want)} in Python"
        for i, (a, b) in enumerate(zip(got, want)):
            assert typed(a) == typed(b), f"{label} batch {k} transaction {i}:\n C  {a}\n Py {b}"
        assert (len(c), c.held) == (len(py.pending), py.held), f"{label} batch {k}: pending keys and queries"
        everything += want
    c.flush(out)
    got, want = out.to_tuples(), py.flush()
    assert [typed(t) for t in got] == [typed(t) for t in want], f"{label}: flush differs"
    assert len(c) == 0
    assert sc.as_dict() == sp.as_dict(), label
    return everything + want, sp


@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_equals_python_on_captures(config):
    total = 0
    for path in SHARED_CAPTURES + [ROOT / "samples" / "sample-mix.pcap.xz", bench_capture()]:
        for batch_size in (1, 7, 4096) if path.stat().st_size < 200_000 else (4096,):
            txs, _ = assert_same_matching(python_batches(path, batch_size), CONFIGS[config], path.name)
            total += len(txs)
    assert total > 20000


@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_equals_python_on_generated_traffic(generated_capture, config):
    for batch_size in (4096, 16, 1):  # (the checks below look at the last: expiry after every message)
        label = f"{generated_capture.name}/{batch_size}"
        txs, stats = assert_same_matching(python_batches(generated_capture, batch_size), CONFIGS[config], label)
    # The traffic did reach the branches it was made for.
    assert stats.duplicate_queries > 0 and stats.zone_transfer_messages > 0
    assert stats.matched > 100 and stats.response_only > 0 and stats.query_only > 0
    assert any(n > 1 for _, _, n in txs)  # a transfer of several messages
    pairs = [(q, r) for q, r, _ in txs if q is not None and r is not None and not q[M.MALFORMED]]
    assert any(r[M.QNAME] is None for _, r in pairs)  # answered without a question
    named = [(q[M.QNAME], r[M.QNAME]) for q, r in pairs if r[M.QNAME] is not None]
    assert any(a != b and a.isascii() and b.isascii() for a, b in named)  # case differs
    assert any(a != b and not (a.isascii() and b.isascii()) for a, b in named)  # equal only after str.lower()
    assert any(q is not None and q[M.MALFORMED] for q, _, _ in txs)
    assert any(r is not None and r[M.MALFORMED] for _, r, _ in txs)
    if config in ("max-pending-3", "per-key-1", "per-key-2"):
        assert stats.match_evicted > 0


@pytest.mark.parametrize("config", ["default", "timeout-2ms", "max-pending-3"])
def test_equals_python_on_the_frame_clock(generated_capture, config):
    """With the pipeline's clock (its last frame's time, also after a batch without messages, as `read --workers`
    gives it to every worker): the same expiry, at the same points, in C and in Python."""
    for batch_size in (16, 1):
        clocks = []
        batches = python_batches(generated_capture, batch_size, clocks)
        # Between two batches, one whose frames held no message (another worker's, or not DNS).
        both, both_clocks = [], []
        for k, (batch, clock) in enumerate(zip(batches, clocks)):
            both += [batch, []]
            both_clocks += [clock, (clock + clocks[min(k + 1, len(clocks) - 1)]) // 2]
        label = f"{generated_capture.name}/{batch_size} on the frame clock"
        _, stats = assert_same_matching(both, CONFIGS[config], label, both_clocks)
        assert stats.query_only > 0


def test_names_equal_only_through_str_lower():
    """A query and its response whose names differ but for case, ASCII and not (KELVIN SIGN lowers to k)."""
    q = next(m for batch in python_batches(ROOT / "samples" / "sample-mix.pcap.xz", 4096) for m in batch
             if not m[M.MALFORMED] and not m[M.FLAGS] & 0x8000 and m[M.QNAME])
    r = list(q)
    r[M.SRC], r[M.SPORT], r[M.DST], r[M.DPORT] = q[M.DST], q[M.DPORT], q[M.SRC], q[M.SPORT]
    r[M.FLAGS] |= 0x8000
    pairs = (("Kelvin.example", "\u212aelvin.example"), ("a.example", "A.EXAMPLE"), ("é.x", "É.X"), ("é.x", "e.x"),
             ("\u0130.x", "i\u0307.x"))
    for qname, rname in pairs:
        qq = q[: M.QNAME] + (qname,) + q[M.QNAME + 1 :]
        rr = tuple(r[: M.QNAME]) + (rname,) + tuple(r[M.QNAME + 1 :])
        txs, _ = assert_same_matching([[qq, rr]], CONFIGS["default"], f"{qname} / {rname}")
        assert len(txs) == (1 if qname.lower() == rname.lower() else 2)



@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_hand_over_carries_on_as_python(generated_capture, config):
    """RecordTable.hand_over (a columnar pipeline meeting dnstap) after every batch: the TransactionTable it
    fills holds what the Python table holds at that point (keys in the same order, lists as lists, open
    transfers), and carries on to the same transactions and counters."""
    batches = python_batches(generated_capture, 32)
    match_cfg = CONFIGS[config]
    seen_lists = seen_transfers = False
    for split in range(1, len(batches)):
        sc, sp = Stats(), Stats()
        c, py = RecordTable(match_cfg, sc), TransactionTable(match_cfg, sp)
        msgs, out = _records.MsgBatch(), _records.TxBatch()
        for batch in batches[:split]:
            msgs.clear()
            msgs.extend(batch)
            c.add(msgs, out)
            py.add(batch)
        taken = TransactionTable(match_cfg, sc)
        c.hand_over(taken)
        assert len(c) == 0 and c.held == 0
        label = f"{config} split {split}"
        assert list(taken.pending) == list(py.pending), label
        assert [typed(v) for v in taken.pending.values()] == [typed(v) for v in py.pending.values()], label
        assert (taken.held, taken.now_ns) == (py.held, py.now_ns), label
        assert [(k, typed(x.query), typed(x.first), x.ancount, x.wirelen, x.dns_len, x.messages, x.last_ts)
                for k, x in taken.transfers.items()] == [
                (k, typed(x.query), typed(x.first), x.ancount, x.wirelen, x.dns_len, x.messages, x.last_ts)
                for k, x in py.transfers.items()], label
        seen_lists |= any(type(v) is list for v in py.pending.values())
        seen_transfers |= bool(py.transfers)
        for batch in batches[split:]:
            assert [typed(t) for t in taken.add(batch)] == [typed(t) for t in py.add(batch)], label
        assert [typed(t) for t in taken.flush()] == [typed(t) for t in py.flush()], label
        assert sc.as_dict() == sp.as_dict(), label
    assert seen_transfers and (seen_lists or match_cfg.max_pending_per_key <= 1)


# --- generated traffic: every branch ---------------------------------------------------------------------------------

CLIENTS = ("192.0.2.1", "192.0.2.2", "2001:db8::1")
SERVER4, SERVER6 = "198.51.100.53", "2001:db8:53::53"
PORTS = (40000, 40001, 40002)  # few ports and IDs: keys collide, retries share them
IDS = range(6)
NAME_GROUPS = (  # names in one group are equal after str.lower() (the decoders give UTF-8 names decoded)
    (b"www.example.com", b"WWW.Example.COM"),
    (b"mail.example.net",),
    (b"k.example", "\u212a.example".encode()),  # KELVIN SIGN lowers to an ASCII k
    ("\u00c4.example".encode(), "\u00e4.example".encode()),
    ("\u0130.example".encode(), "i\u0307.example".encode()),  # one character lowers to two
    (b"\xff\xfe.bad", b"\xff\xfe.BAD"),  # not UTF-8: kept as backslash escapes
    (b"x",),
)
NAMES = [n for group in NAME_GROUPS for n in group]


def ascii_case(rng, name):
    return bytes(c ^ 0x20 if chr(c).isascii() and chr(c).isalpha() and rng.random() < 0.5 else c for c in name)


def answer_name(rng, name):
    """The QNAME a response carries: the query's (case changed or not), an equal one, or another."""
    x = rng.random()
    if x < 0.5:
        return ascii_case(rng, name)
    if x < 0.8:
        return rng.choice(next(g for g in NAME_GROUPS if name in g))
    return rng.choice(NAMES)


def udp_frame(ts, client, cport, dns, to_server):
    v6 = ":" in client
    server = SERVER6 if v6 else SERVER4
    ip = (IPv6 if v6 else IP)(src=client, dst=server) if to_server else (IPv6 if v6 else IP)(src=server, dst=client)
    udp = UDP(sport=cport, dport=53) if to_server else UDP(sport=53, dport=cport)
    return ts, bytes(Ether(src=MAC_C, dst=MAC_S) / ip / udp / Raw(dns))


def maybe_damaged(rng, dns):
    """Now and then the message cut short (malformed; under 12 bytes, even its header is missing)."""
    return dns[: rng.randrange(len(dns))] if rng.random() < 0.05 else dns


def exchange(rng, t):
    """Queries (retries on the same key, the same or other names) and their answers, late, duplicated,
    without a question or of another QTYPE now and then."""
    client, cport, qid = rng.choice(CLIENTS), rng.choice(PORTS), rng.choice(IDS)
    frames = []
    for k in range(rng.choice((1, 1, 1, 2, 3))):
        name = rng.choice(NAMES)
        qtype = rng.choice(("A", "AAAA", "MX"))
        tq = t + k * rng.choice((1_000, 300_000))
        q = bytes(DNS(id=qid, rd=1, qd=[DNSQR(qname=name, qtype=qtype)]))
        frames.append(udp_frame(tq, client, cport, maybe_damaged(rng, q), True))
        if rng.random() < 0.15:
            continue  # never answered
        x = rng.random()
        qd = [] if x < 0.1 else [DNSQR(qname=answer_name(rng, name), qtype="TXT" if x < 0.15 else qtype)]
        r = bytes(DNS(id=qid, qr=1, rd=1, ra=1, rcode=rng.choice((0, 0, 0, 3)), qd=qd))
        tr = tq + rng.choice((50_000, 1_000_000, 2_000_000, 3_000_000, 5 * NS, 6 * NS))  # (2 ms, 5 s: just in time)
        for _ in range(2 if rng.random() < 0.1 else 1):  # a duplicate answer
            frames.append(udp_frame(tr, client, cport, maybe_damaged(rng, r), False))
            tr += 10_000
    return frames


def soa(zone):
    return DNSRRSOA(rrname=zone, ttl=3600, mname="ns." + zone, rname="h." + zone, serial=42)


def transfer(rng, t, cport):
    """AXFR or IXFR over TCP: one to four response messages, the last ending with the SOA (or not: the
    transfer stays open until it expires or the input ends), or an error closing it at once."""
    zone = rng.choice(("zone.example", "Zone.Example", "other.example"))
    qtype = rng.choice(("AXFR", "IXFR"))
    qid = rng.choice(IDS)
    conn = TcpConn(cport)
    frames = conn.handshake(t, t + 1_000, t + 2_000)
    query = DNS(id=qid, qd=[DNSQR(qname=zone, qtype=qtype)])
    frames.append((t + 3_000, conn.data("c", framed(bytes(query)))))
    n = rng.choice((1, 2, 4))
    ends = rng.random()
    for i in range(n):
        an = [DNSRR(rrname=f"h{i}.{zone}", type="A", ttl=60, rdata=f"192.0.2.{i + 1}")]
        if i == 0:
            an.insert(0, soa(zone))
        if i == n - 1 and ends < 0.7:
            an.append(soa(zone))
        rcode = 5 if ends > 0.9 and i == 0 else 0
        qd = [DNSQR(qname=ascii_case(rng, zone.encode()), qtype=qtype)] if i == 0 else []
        msg = DNS(id=qid, qr=1, aa=1, rcode=rcode, qd=qd, an=an)
        frames.append((t + 4_000 + i * rng.choice((1_000, 2 * NS)), conn.data("s", framed(bytes(msg)))))
    return frames


def udp_ixfr(rng, t):
    """IXFR over UDP: one response, ending with the SOA (closed at once), or without it (left open)."""
    client, cport, qid = rng.choice(CLIENTS), rng.choice(PORTS), rng.choice(IDS)
    q = bytes(DNS(id=qid, qd=[DNSQR(qname="zone.example", qtype="IXFR")]))
    an = [soa("zone.example")] if rng.random() < 0.7 else [DNSRR(rrname="a.zone.example", rdata="192.0.2.9")]
    r = bytes(DNS(id=qid, qr=1, aa=1, qd=[DNSQR(qname="zone.example", qtype="IXFR")], an=an))
    return [udp_frame(t, client, cport, q, True), udp_frame(t + 200_000, client, cport, r, False)]


def orphan(rng, t):
    client, cport, qid = rng.choice(CLIENTS), rng.choice(PORTS), rng.choice(IDS)
    r = bytes(DNS(id=qid, qr=1, qd=[DNSQR(qname=rng.choice(NAMES))]))
    return [udp_frame(t, client, cport, r, False)]


def generated_frames(seed, events):
    rng = random.Random(seed)
    frames = []
    t = T0
    tcp_ports = iter(range(50000, 60000))
    for _ in range(events):
        t += rng.choice((1_000, 100_000, 1_000_000)) + (6 * NS if rng.random() < 0.01 else 0)
        kind = rng.choices(("exchange", "transfer", "udp_ixfr", "orphan"), (85, 5, 5, 5))[0]
        if kind == "transfer":
            frames += transfer(rng, t, next(tcp_ports))
        else:
            frames += {"exchange": exchange, "udp_ixfr": udp_ixfr, "orphan": orphan}[kind](rng, t)
    frames.sort(key=lambda f: f[0])  # (stable: a TCP connection's frames stay in order)
    return frames


@pytest.fixture(scope="module", params=[1, 2, 3])
def generated_capture(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("match") / f"generated-{request.param}.pcap"
    return write_pcap(path, generated_frames(request.param, 700))


def retry_flood(path, queries, keys, unanswered_responses):
    """`queries` queries spread over `keys` keys (one client port and DNS ID each, QNAMEs all different), then
    responses under the first key whose QNAME answers none of them (each one scans its key's queries)."""
    frames, t = [], T0
    for i in range(queries):
        t += 1000
        dns = DNS(id=7, rd=1, qd=[DNSQR(qname=f"q{i}.example.com")])
        ip = IP(src="192.0.2.9", dst=SERVER4) / UDP(sport=41000 + i % keys, dport=53)
        frames.append((t, bytes(Ether(src=MAC_C, dst=MAC_S) / ip / dns)))
    for _ in range(unanswered_responses):
        t += 1000
        dns = DNS(id=7, qr=1, qd=[DNSQR(qname="other.example.com")])
        ip = IP(src=SERVER4, dst="192.0.2.9") / UDP(sport=53, dport=41000)
        frames.append((t, bytes(Ether(src=MAC_S, dst=MAC_C) / ip / dns)))
    return write_pcap(path, frames)




def test_retries_under_one_key_are_bounded_and_counted(tmp_path):
    # Queries reusing one port and ID grew one list without bound, scanned by every response under that key:
    # the structural bound (queries held under a key) is what keeps a response's work constant.
    cfg = MatchConfig()
    path = retry_flood(tmp_path / "retries.pcap", 600, 1, 50)
    for batch_size in (4096, 7):
        txs, stats = assert_same_matching(python_batches(path, batch_size), cfg, f"retries/{batch_size}")
        assert stats.duplicate_queries == 599 and stats.response_only == 50
        assert stats.match_evicted == 600 - cfg.max_pending_per_key
        assert stats.query_only == 600 and len(txs) == 650
    table = TransactionTable(cfg, Stats())
    for msgs in python_batches(path, 64):  # the bound holds after every batch
        table.add(msgs)
        assert all(len(v) <= cfg.max_pending_per_key for v in table.pending.values() if type(v) is list)


def test_max_pending_counts_queries_not_keys(tmp_path):
    cfg = MatchConfig(max_pending=50, max_pending_per_key=100)
    path = retry_flood(tmp_path / "keys.pcap", 400, 10, 0)  # 10 keys, 40 queries each
    txs, stats = assert_same_matching(python_batches(path, 16), cfg, "keys")
    assert stats.match_evicted > 0 and stats.query_only == 400
    table, records = TransactionTable(cfg, Stats()), RecordTable(cfg, Stats())
    msgs, out = _records.MsgBatch(), _records.TxBatch()
    for batch in python_batches(path, 16):
        table.add(batch)
        msgs.clear()
        msgs.extend(batch)
        records.add(msgs, out)
        assert sum(len(v) if type(v) is list else 1 for v in table.pending.values()) <= 50
        assert records.held <= 50
