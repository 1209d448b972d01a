"""The dnstap decoder (probe.decode.dnstap): dnstap messages → message tuples → transactions, field by field,
and every message it drops counted under its reason. Messages are built with the protobuf runtime from the
project's schema table; tests/oracle/test_dnstap_servers.py checks the decoder against real servers."""

import ipaddress

import pytest
from support.dnstap import dnstap_frame
from support.frames import C4, C6, CPORT, NS, S4, S6, T0
from support.messages import q_dns, r_dns

from probe.config import load_config
from probe.decode.dnstap import DnstapDecoder
from probe.decode.dnstap_schema import ENUMS, NESTED_ENUMS, PROTOBUF_BACKEND
from probe.decode.dnstap_types import DEFAULT_TYPES, MESSAGE_TYPES, TYPE_COUNTERS
from probe.match import TransactionTable
from probe.model import TRANSPORTS, DnstapBatch, M, QueryCopy
from probe.stats import COUNTER_NAMES, Stats


def decode(frames, producer="p1", types=DEFAULT_TYPES, parser="auto"):
    cfg = load_config(overrides={"dnstap.message_types": list(types), "decode.parser": parser})
    stats = Stats()
    batch = DnstapBatch([(producer, list(frames))])
    msgs = DnstapDecoder(cfg.dnstap, cfg.decode, stats).decode(batch)
    return msgs, stats, batch


def match(msgs, stats):
    table = TransactionTable(load_config().match, stats)
    return table.add(msgs) + table.flush()


def test_tables_agree():
    assert PROTOBUF_BACKEND == "upb", "protobuf's C runtime (upb) is missing: the Python one is ~16x slower"
    protocols = {v: k for k, v in ENUMS["SocketProtocol"].items()}
    assert {code: protocols[code].lower().replace("dnscrypt", "dnscrypt-") for code in TRANSPORTS} == {
        code: name for code, (name, _, _) in TRANSPORTS.items()
    }
    assert set(TYPE_COUNTERS.values()) <= set(COUNTER_NAMES)
    assert NESTED_ENUMS["Message"]["Type"] == {name: n for n, (name, _, _) in MESSAGE_TYPES.items()}
    assert all((n % 2 == 0) == response for n, (_, _, response) in MESSAGE_TYPES.items())


def test_client_query_and_response_every_field():
    q = dnstap_frame("CLIENT_QUERY", dns=q_dns(7), ts=T0)
    r = dnstap_frame("CLIENT_RESPONSE", dns=r_dns(7), ts=T0 + 12_345_678, identity=b"resolver-1")
    msgs, stats, batch = decode([q, r])
    assert not batch.refused and len(msgs) == 2
    query, response = msgs
    c, s = ipaddress.ip_address(C4).packed, ipaddress.ip_address(S4).packed
    assert query[: M.ORIGIN + 1] == (T0, None, 4, 17, c, CPORT, s, 53, None, None, None, None, 1,
                                     (1, "client", "srv"), ("client", "srv"))
    # the response goes server → client; its identity differs, so does its scope (it would not pair)
    assert response[: M.ORIGIN + 1] == (T0 + 12_345_678, None, 4, 17, s, 53, c, CPORT, None, None, None, None, 1,
                                        (1, "client", "resolver-1"), ("client", "resolver-1"))
    assert query[M.ID] == 7 and query[M.QNAME] == "www.example.com" and response[M.ANCOUNT] == 1
    assert query[M.RAW] == q_dns(7)  # the DNS part is the walker's, as for packets
    counts = {k: v for k, v in stats.as_dict().items() if v}
    assert counts == {"dnstap_frames": 2, "dnstap_client_query": 1, "dnstap_client_response": 1,
                      "dns_messages": 2, "queries": 1, "responses": 1}


def test_a_transaction_pairs_only_within_its_server_and_family():
    frames = [
        dnstap_frame("CLIENT_QUERY", ts=T0), dnstap_frame("CLIENT_RESPONSE", ts=T0 + 5000),  # pair
        dnstap_frame("AUTH_QUERY", ts=T0), dnstap_frame("CLIENT_RESPONSE", ts=T0 + 5000, identity=b"other"),
    ]
    msgs, stats, _ = decode(frames)
    txs = match(msgs, stats)
    assert [(q is not None, r is not None) for q, r, _ in txs] == [(True, True), (False, True), (True, False)]
    assert txs[0][1][M.TS_NS] - txs[0][0][M.TS_NS] == 5000


def test_without_identity_the_producer_keeps_servers_apart():
    q = dnstap_frame("CLIENT_QUERY", identity=None)
    r = dnstap_frame("CLIENT_RESPONSE", identity=None, ts=T0 + 1)
    for producers, pairs in ((("a", "a"), 1), (("a", "b"), 0)):
        cfg = load_config()
        stats = Stats()
        batch = DnstapBatch([(producers[0], [q]), (producers[1], [r])])
        msgs = DnstapDecoder(cfg.dnstap, cfg.decode, stats).decode(batch)
        assert msgs[0][M.ORIGIN] == ("client", None)  # no identity in the output
        assert sum(1 for q_, r_, _ in match(msgs, stats) if q_ and r_) == pairs


@pytest.mark.parametrize("protocol, transport, proto", [
    ("UDP", 1, 17), ("TCP", 2, 6), ("DOT", 3, 6), ("DOH", 4, 6), ("DNSCryptUDP", 5, 17), ("DNSCryptTCP", 6, 6),
    ("DOQ", 7, 17), (None, None, None),
])
def test_transport_and_ip_protocol(protocol, transport, proto):
    (m,), _, _ = decode([dnstap_frame(protocol=protocol)])
    assert (m[M.TRANSPORT], m[M.PROTO]) == (transport, proto)


def test_doh_over_http3_is_udp():
    (m,), _, _ = decode([dnstap_frame(protocol="DOH", http_protocol=3)])
    assert (m[M.TRANSPORT], m[M.PROTO]) == (4, 17)


def test_ipv6_and_family_from_the_addresses():
    (m,), _, _ = decode([dnstap_frame(family="INET6", qaddr=C6, raddr=S6)])
    assert m[M.IPV] == 6 and m[M.SRC] == ipaddress.ip_address(C6).packed
    (m,), _, _ = decode([dnstap_frame(family=None, qaddr=C6, raddr=S6)])
    assert m[M.IPV] == 6
    (m,), _, _ = decode([dnstap_frame(family=None, qaddr=None, raddr=None, qport=None, rport=None)])
    assert (m[M.IPV], m[M.SRC], m[M.SPORT], m[M.DST], m[M.DPORT]) == (None,) * 5


@pytest.mark.parametrize("frame, counter", [
    (dnstap_frame(ts=None), "dnstap_no_time"),
    (dnstap_frame("CLIENT_RESPONSE", ts=None, query_time_sec=T0 // NS), "dnstap_no_time"),  # a response needs its own
    (dnstap_frame(query_time_nsec=NS), "dnstap_no_time"),
    (dnstap_frame(query_time_sec=1 << 40), "dnstap_no_time"),  # beyond int64 nanoseconds
    (dnstap_frame(query_message=None), "dnstap_no_dns"),
    (dnstap_frame(family="INET6"), "dnstap_bad_address"),  # IPv4 addresses
    (dnstap_frame(qaddr=b"\1\2\3"), "dnstap_bad_address"),
    (dnstap_frame(family=None, raddr=S6), "dnstap_bad_address"),
    (dnstap_frame(qport=65536), "dnstap_bad_address"),
    (dnstap_frame("RESOLVER_QUERY"), "dnstap_filtered"),
    (dnstap_frame("AUTH_QUERY")[:-2] + b"\x78\x02", "dnstap_not_message"),  # Dnstap.type 2
    (dnstap_frame("AUTH_QUERY").replace(b"\x08\x01", b"\x08\x0f", 1), "dnstap_unknown_type"),  # type 15
    (b"\x72\x00", "dnstap_not_message"),  # a message but no Dnstap.type
])
def test_dropped_messages_are_counted(frame, counter):
    msgs, stats, batch = decode([frame])
    assert msgs == [] and not batch.refused
    assert getattr(stats, counter) == 1 and stats.dnstap_frames == 1


def test_a_frame_that_does_not_decode_ends_its_producer():
    good = dnstap_frame()
    msgs, stats, batch = decode([good, b"\xff\xff\xff", good, good])
    assert len(msgs) == 1 and list(batch.refused) == ["p1"]
    assert "not a protobuf dnstap message" in batch.refused["p1"]
    assert (stats.dnstap_frames, stats.dnstap_decode_errors, stats.dnstap_frames_discarded) == (4, 1, 2)


def test_selected_types():
    frames = [dnstap_frame(t) for _, (t, _, _) in MESSAGE_TYPES.items()]
    msgs, stats, _ = decode(frames, types=("RESOLVER_QUERY", "TOOL_RESPONSE", "UPDATE_QUERY"))
    assert [m[M.ORIGIN][0] for m in msgs] == ["resolver", "tool", "update"]
    assert stats.dnstap_filtered == 11
    assert all(getattr(stats, name) == 1 for name in TYPE_COUNTERS.values())


def test_a_response_carrying_its_query_counts_once():
    q, r = q_dns(9), r_dns(9)
    logged = dnstap_frame("AUTH_QUERY", dns=q, ts=T0)
    carrying = dnstap_frame("AUTH_RESPONSE", dns=r, embedded=q, ts=T0 + 777)
    # the query logged on its own as well (Knot with responses-with-queries): the copy is not used
    msgs, stats, _ = decode([logged, carrying])
    assert [type(m) for m in msgs] == [tuple, QueryCopy, tuple]
    txs = match(msgs, stats)
    assert len(txs) == 1 and txs[0][0] is msgs[0] and txs[0][1][M.TS_NS] - txs[0][0][M.TS_NS] == 777
    assert (stats.dnstap_embedded_queries, stats.dnstap_embedded_used, stats.matched) == (1, 0, 1)
    # only the response: the copy is the query, with the response's time (the producer sent no query_time)
    msgs, stats, _ = decode([carrying])
    txs = match(msgs, stats)
    assert len(txs) == 1 and txs[0][0][M.TS_NS] == txs[0][1][M.TS_NS] == T0 + 777
    assert txs[0][0][M.SRC] == ipaddress.ip_address(C4).packed and txs[0][0][M.QNAME] == "www.example.com"
    assert (stats.dnstap_embedded_used, stats.matched, stats.query_only, stats.duplicate_queries) == (1, 1, 0, 0)
    # with query_time: that time
    msgs, stats, _ = decode([dnstap_frame("AUTH_RESPONSE", dns=r, embedded=q, ts=T0 + 777,
                                          query_time_sec=T0 // NS, query_time_nsec=T0 % NS)])
    assert match(msgs, stats)[0][0][M.TS_NS] == T0


def test_the_same_with_every_parser():
    frames = [dnstap_frame("CLIENT_QUERY"), dnstap_frame("CLIENT_RESPONSE", ts=T0 + 1)]
    results = {p: decode(frames, parser=p)[0] for p in ("fast", "wire", "dpkt")}
    assert results["fast"] == results["wire"] == results["dpkt"]
