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

import pytest
from scapy.layers.dns import DNS, DNSQR
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from support.captures import bench_mix
from support.data import ROOT
from support.frames import MAC_C, MAC_S, write_pcap
from support.matching import CONFIGS, MATCH_CAPTURES, SERVER4, T0

from probe import _records
from probe.capture.pcapfile import read_capture
from probe.config import MatchConfig, load_config
from probe.decode.ipfilter import IpFilter
from probe.decode.packets import PacketDecoder
from probe.match import RecordTable, TransactionTable
from probe.model import M
from probe.stats import Stats


def test_captures_found():
    names = {p.name for p in MATCH_CAPTURES}
    assert {
        "udp_simple.pcap",
        "tcp_axfr_zone_transfer.pcap",
        "knot-live.raw.pcap.xz",
        "nsd-live.raw.pcap.xz",
        "matching.pcap.xz",
        "unmatched.pcap.xz",
        "malformed.pcap.xz",
    } <= names, names


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
        assert (len(c), c.held, c.open_transfers) == (len(py.pending), py.held, py.open_transfers), (
            f"{label} batch {k}: pending keys and queries, open transfers")
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
    for path in MATCH_CAPTURES + [ROOT / "samples" / "sample-mix.pcap.xz", bench_mix()]:
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
    if config == "transfers-1":
        assert stats.transfers_evicted > 0


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


def dnstap_batches():
    """dnstap messages that walk every rule of the scope and of query copies, as the Python decoder gives them:
    families, identities and producers (an identity equal to another producer's name included), transports
    (DoH over HTTP/3 and /2: one transport, two protocols), ports and addresses None, a non-ASCII identity, query
    copies (used, dropped beside their query, malformed, one with QR set), a zone transfer (lengths None)."""
    from support.dnstap import dnstap_frame
    from support.frames import T0
    from support.messages import q_dns, r_dns

    from probe.decode.dnstap import DnstapDecoder
    from probe.decode.dnstap_types import TYPE_NAMES
    from probe.model import DataFrames, DnstapBatch

    cases = []  # (producer, [(mtype, id, {dnstap_frame arguments})]) runs

    def pair(qid, producer="p1", rproducer=None, q=None, r=None, qtype="A", rtype="CLIENT_RESPONSE"):
        cases.append((producer, [("CLIENT_QUERY", qid, dict(dns=q_dns(qid, qtype=qtype), **(q or {})))]))
        cases.append((rproducer or producer, [(rtype, qid, dict(dns=r_dns(qid, qtype=qtype), **(r or {})))]))

    pair(1)
    pair(2, rtype="AUTH_RESPONSE")  # another family: no pair
    pair(3, q={"identity": None}, r={"identity": None})  # the producer is the scope: one producer pairs...
    pair(4, q={"identity": None}, r={"identity": None}, rproducer="p2")  # ... two do not
    pair(5, producer="x", q={"identity": b"p2"}, r={"identity": None}, rproducer="p2")  # identity == producer
    pair(6, q={"protocol": None}, r={"protocol": None})
    pair(7, r={"protocol": None})  # a transport and none: no pair
    pair(8, q={"protocol": "DOH", "http_protocol": 3}, r={"protocol": "DOH", "http_protocol": 2})
    pair(9, q={"qport": None, "rport": None}, r={"qport": None, "rport": None})
    pair(10, q={"qaddr": None, "raddr": None, "family": None}, r={"qaddr": None, "raddr": None, "family": None})
    pair(11, q={"qaddr": None, "raddr": None}, r={"qaddr": None, "raddr": None, "family": "INET6"})
    pair(12, q={"qaddr": None}, r={"qaddr": None})
    pair(13, q={"identity": b"id\xff"}, r={"identity": b"id\xff"})
    pair(14, q={"identity": b"srv2"})  # another identity: no pair
    for qid, embedded, log_query in ((20, q_dns(20), False), (21, q_dns(21), True), (22, q_dns(22, "other.example"),
                                     True), (23, b"\x00\x17", False), (24, r_dns(24), False)):
        if log_query:
            cases.append(("p1", [("CLIENT_QUERY", qid, dict(dns=q_dns(qid)))]))
        cases.append(("p1", [("CLIENT_RESPONSE", qid, dict(dns=r_dns(qid), embedded=embedded))]))
    cases.append(("p1", [("AUTH_QUERY", 30, dict(dns=q_dns(30, qtype="AXFR"), protocol="TCP")),
                         ("AUTH_RESPONSE", 30, dict(dns=r_dns(30, qtype="AXFR", answers=3), protocol="TCP")),
                         ("AUTH_RESPONSE", 30, dict(dns=r_dns(30, qtype="AXFR", rcode=2), protocol="TCP"))]))
    cases.append(("p1", [("CLIENT_RESPONSE", 40, dict(dns=r_dns(40)))]))  # response only
    cases.append(("p1", [("CLIENT_QUERY", 41, dict(dns=q_dns(41)))] * 2))  # a retry, left pending
    cfg = load_config(overrides={"dnstap.message_types": list(TYPE_NAMES)})
    decoder = DnstapDecoder(cfg.dnstap, cfg.decode, Stats(), python=True)
    batches, k = [], 0
    for i in range(0, len(cases), 3):
        runs = []
        for producer, msgs in cases[i : i + 3]:
            frames = []
            for mtype, qid, kw in msgs:
                k += 1
                frames.append(dnstap_frame(mtype, ts=T0 + k * 1000, **{"qport": 30000 + qid, **kw}))
            runs.append((producer, DataFrames.of(frames)))
        batches.append(decoder.decode(DnstapBatch(runs)))
    return batches


@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_equals_python_on_dnstap(generated_capture, config):
    """dnstap's scopes and query copies, alone and between packets' batches."""
    from probe.model import QueryCopy

    dnstap = dnstap_batches()
    assert any(type(m) is QueryCopy for batch in dnstap for m in batch)
    txs, stats = assert_same_matching(dnstap, CONFIGS[config], f"{config} dnstap")
    if config == "default":
        assert stats.dnstap_embedded_used == 3 and stats.matched == 14 and stats.zone_transfer_messages == 1
    packets = python_batches(generated_capture, 64)
    mixed = [batch for k, batch in enumerate(packets) for batch in ((batch, dnstap[k]) if k < len(dnstap) else
                                                                      (batch,))]
    assert_same_matching(mixed, CONFIGS[config], f"{config} dnstap among packets")


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
