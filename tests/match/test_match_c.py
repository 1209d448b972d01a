"""The C matching loop (probe.match._match) must give exactly what the Python loop gives (TransactionTable.add_python).

The same decoded message batches go to a table on the C path and to one on the Python path (python=True),
each with its own Stats; after every batch and after flush() the two must have returned the same
transactions in the same order, hold the same pending dict in the same order (the expiry order) and the same
open zone transfers, and have counted the same. Inputs: every capture the project has (DNS Probe's, compactor's
including its matching/unmatched/malformed cases and the knot/nsd live captures), the benchmark's standard
mix, and generated traffic that walks every branch of the matching: retries reusing ID and port, answers whose
QNAME differs in case (ASCII and not), responses without a question, answers after the timeout, duplicate
answers, AXFR/IXFR transfers over TCP and UDP, malformed messages, and a small max_pending. Several batch
sizes, timeouts and table bounds. Messages whose fields have other types than the decoders give must go
through the Python loop and still give the same.
"""

import random

import pytest
from scapy.layers.dns import DNS, DNSQR
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from support.captures import bench_mix
from support.dnsprobe import run_python
from support.frames import MAC_C, MAC_S, write_pcap
from support.matching import CONFIGS, MATCH_CAPTURES, SERVER4, T0

from probe.capture.pcapfile import read_capture
from probe.config import MatchConfig, load_config
from probe.decode.ipfilter import IpFilter
from probe.decode.packets import PacketDecoder
from probe.match import TransactionTable
from probe.match import table as match
from probe.model import FLAG_QR, MESSAGE_FIELDS, M
from probe.stats import Stats


def test_extension_is_built():
    # Not importorskip: a machine where the build failed must fail here (setup.py builds it optional).
    from probe.match import _match

    assert callable(_match.run) and match.BACKEND == "c"


def test_indexes_and_constants_match_python():
    from probe.match import _match

    assert _match.INDEXES == {name: getattr(M, name) for name in _match.INDEXES if name != "MESSAGE_LEN"} | {
        "MESSAGE_LEN": len(MESSAGE_FIELDS)
    }
    assert _match.CONSTANTS == {"FLAG_QR": FLAG_QR, "QTYPE_IXFR": match.QTYPE_IXFR, "QTYPE_AXFR": match.QTYPE_AXFR}


# --- comparing the two paths -------------------------------------------------------------------------------------


class CountingTable(TransactionTable):
    """A table that counts the messages its Python loop matched (all of them on the Python path; on the C
    path, those the C loop left to it)."""

    def __init__(self, match_cfg, stats, python=False):
        super().__init__(match_cfg, stats, python=python)
        self.in_python = 0

    def add_python(self, msgs, out):
        self.in_python += len(msgs)
        super().add_python(msgs, out)


def state(table):
    """Everything of a table that later batches or the output depend on."""
    transfers = [
        (k, x.query, x.first, x.ancount, x.wirelen, x.dns_len, x.messages, x.last_ts)
        for k, x in table.transfers.items()
    ]
    held = sum(len(v) if type(v) is list else 1 for v in table.pending.values())
    assert table.held == held, f"held {table.held}, pending holds {held}"
    return list(table.pending.items()), transfers, table.now_ns, table.stats.as_dict()


def assert_same_run(batches, match_cfg, label):
    """Feed batches to a C-path and a Python-path table; equal after every batch and after flush.
    Returns (all transactions, the C table, whether a pending value was ever a list)."""
    c = CountingTable(match_cfg, Stats())
    py = CountingTable(match_cfg, Stats(), python=True)
    assert c._c_run is not None and py._c_run is None
    everything = []
    lists_seen = False
    for k, msgs in enumerate(batches):
        got, want = c.add(msgs), py.add(msgs)
        assert len(got) == len(want), f"{label} batch {k}: {len(got)} transactions in C, {len(want)} in Python"
        for i, (a, b) in enumerate(zip(got, want)):
            assert a == b, f"{label} batch {k} transaction {i}:\n C  {a}\n Py {b}"
        assert state(c) == state(py), f"{label}: state differs after batch {k}"
        lists_seen = lists_seen or any(type(v) is list for v in c.pending.values())
        everything += got
    got, want = c.flush(), py.flush()
    assert got == want, f"{label}: flush differs"
    assert state(c) == state(py), f"{label}: state differs after flush"
    assert py.in_python == sum(map(len, batches))
    return everything + got, c, lists_seen


def decoded(path, batch_size):
    cfg = load_config()
    decoder = PacketDecoder(cfg.decode, cfg.decode.dns_ports, Stats(), IpFilter(cfg.filter))
    batches = [decoder.decode(batch, str(path)) for batch in read_capture(path, batch_size)]
    decoder.flush()
    return batches


# --- the project's captures ----------------------------------------------------------------------------------------


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


@pytest.mark.parametrize("config", CONFIGS, ids=str)
@pytest.mark.parametrize("path", MATCH_CAPTURES, ids=lambda p: p.name)
def test_c_equals_python_on_captures(path, config):
    for batch_size in (1, 7, 4096):
        txs, table, _ = assert_same_run(decoded(path, batch_size), CONFIGS[config], f"{path.name}/{batch_size}")
    assert txs, path
    if path.name != "tcp_axfr_zone_transfer.pcap":
        # The C loop did the work: only zone transfers (and what follows while one is open) go to Python.
        assert table.in_python < max(10, len(txs) // 10), (table.in_python, len(txs))


@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_c_equals_python_on_benchmark_mix(config):
    path = bench_mix()
    txs, table, lists_seen = assert_same_run(decoded(path, 4096), CONFIGS[config], path.name)
    assert len(txs) > 9000 and table.in_python == 0
    stats = table.stats
    assert stats.matched > 5000 and stats.query_only > 0
    if config == "max-pending-3":
        assert stats.match_evicted > 0


@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_c_equals_python_on_generated_traffic(generated_capture, config):
    lists_seen = False
    for batch_size in (4096, 16, 1):  # (the checks below look at the last: expiry after every message)
        txs, table, lists = assert_same_run(
            decoded(generated_capture, batch_size), CONFIGS[config], f"{generated_capture.name}/{batch_size}"
        )
        lists_seen = lists_seen or lists
    # The traffic did reach the branches it was made for.
    stats = table.stats
    assert (lists_seen or config == "per-key-1") and stats.duplicate_queries > 0
    assert stats.matched > 100 and stats.response_only > 0 and stats.query_only > 0
    assert stats.zone_transfer_messages > 0
    assert 0 < table.in_python < len(txs)
    pairs = [(q, r) for q, r, _ in txs if q is not None and r is not None and not q[M.MALFORMED]]
    assert any(r[M.QNAME] is None for _, r in pairs)  # answered without a question
    named = [(q[M.QNAME], r[M.QNAME]) for q, r in pairs if r[M.QNAME] is not None]
    assert any(a != b and a.isascii() and b.isascii() for a, b in named)  # case differs
    assert any(a != b and not (a.isascii() and b.isascii()) for a, b in named)  # equal only after str.lower()
    assert any(q is not None and q[M.MALFORMED] for q, _, _ in txs)
    assert any(r is not None and r[M.MALFORMED] for _, r, _ in txs)
    if config in ("max-pending-3", "per-key-1", "per-key-2"):
        assert stats.match_evicted > 0


# --- bounds: retries under one key, queries in all -----------------------------------------------------------------


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
        txs, table, _ = assert_same_run(decoded(path, batch_size), cfg, f"retries/{batch_size}")
        stats = table.stats
        assert stats.duplicate_queries == 599 and stats.response_only == 50
        assert stats.match_evicted == 600 - cfg.max_pending_per_key
        assert stats.query_only == 600 and len(txs) == 650
    for msgs in decoded(path, 64):  # the bound holds after every batch
        table.add(msgs)
        assert all(len(v) <= cfg.max_pending_per_key for v in table.pending.values() if type(v) is list)


def test_max_pending_counts_queries_not_keys(tmp_path):
    cfg = MatchConfig(max_pending=50, max_pending_per_key=100)
    path = retry_flood(tmp_path / "keys.pcap", 400, 10, 0)  # 10 keys, 40 queries each
    txs, table, _ = assert_same_run(decoded(path, 16), cfg, "keys")
    assert table.stats.match_evicted > 0 and table.stats.query_only == 400
    table = TransactionTable(cfg, Stats())
    for msgs in decoded(path, 16):
        table.add(msgs)
        assert sum(len(v) if type(v) is list else 1 for v in table.pending.values()) <= 50


# --- values the decoders do not give: the Python loop takes the message -----------------------------------------


class Str(str):
    pass


class Msg(tuple):
    pass


def oddly_typed(msgs, rng):
    """The messages with some fields replaced by equal values of other types, and timestamps past 64 bits."""
    out = []
    for m in msgs:
        m = list(m)
        x = rng.random()
        if x < 0.1 and m[M.QNAME] is not None:
            m[M.QNAME] = Str(m[M.QNAME])
        elif x < 0.2 and m[M.QTYPE] is not None:
            m[M.QTYPE] = float(m[M.QTYPE])
        elif x < 0.3:
            m[M.MALFORMED] = int(m[M.MALFORMED])
        elif x < 0.4:
            m[M.TS_NS] += 2**64
        out.append(Msg(m) if x > 0.95 else tuple(m))
    return out


def test_odd_values_go_through_python_and_give_the_same(generated_capture):
    rng = random.Random(7)
    batches = [oddly_typed(msgs, rng) for msgs in decoded(generated_capture, 64)]
    for config in CONFIGS.values():
        txs, table, _ = assert_same_run(batches, config, "odd values")
        assert 0 < table.in_python < len(txs)


def test_timeout_beyond_64_bits_runs_in_python():
    table = TransactionTable(MatchConfig(query_timeout=1e11), Stats())
    assert table._c_run is None
    assert TransactionTable(MatchConfig(), Stats())._c_run is not None


def test_a_count_whose_addition_empties_the_counts_list_is_an_error():
    # The counts are added with PyNumber_Add, which may run Python code (here it empties the list): the loop
    # read the next count from the emptied list. Not reachable from packets; run in a fresh interpreter so
    # that a crash fails this test only.
    code = """
from probe.match import table
class Count:
    def __add__(self, other):
        counts.clear()
        return 0
counts = [Count(), 0, 0, 0, 0]
try:
    table._match.run([], 0, {}, 10**9, False, [], counts, 8)
except (IndexError, RuntimeError) as e:
    print(type(e).__name__)
"""
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() in ("IndexError", "RuntimeError"), proc.stdout
