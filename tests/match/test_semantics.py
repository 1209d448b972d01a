"""What matching does, in-process, through the matcher's interface (add, flush, the counters): pairs, capture-time
timeouts, question mismatch, QNAME case, retries and duplicate answers, the key, zone transfers, response-only and
malformed messages, the bounds on pending queries. Every test runs on the Python reference (TransactionTable's
Python loop, message tuples) and on the C matcher of message records (RecordTable: MsgBatch in, TxBatch out),
through the `matcher` fixture (conftest.py); the messages are tuples made by hand (support.matching.message).
"""

import pytest
from scapy.layers.dns import DNS, DNSQR, DNSRR, DNSRRSOA
from support.frames import C4, S4
from support.matching import message
from support.messages import q_dns, r_dns

from probe.model import INT32_MAX, M

MS = 1_000_000
T0 = 1_700_000_000_000 * MS
COUNTERS = ("matched", "response_only", "query_only", "duplicate_queries", "match_evicted", "zone_transfer_messages",
            "lengths_capped", "transfers_evicted")


def at(ms):
    return T0 + ms * MS


def query(ms, qid=1, name="www.example.com", qtype="A", **kw):
    return message(at(ms), q_dns(qid, name, qtype), **kw)


def answer(ms, qid=1, name="www.example.com", qtype="A", **kw):
    return message(at(ms), r_dns(qid, name, qtype), to_server=False, **kw)


def counts(m):
    """The matching counters that are not 0."""
    return {k: v for k, v in m.stats.as_dict().items() if k in COUNTERS and v}


def test_query_and_response_match(matcher):
    m = matcher()
    q, r = query(0), answer(3)
    assert m.add([q]) == [] and m.held == 1
    assert m.add([r]) == [(q, r, 1)]
    assert m.flush() == [] and m.held == 0
    assert counts(m) == {"matched": 1}


def test_unmatched_query_and_response(matcher):
    m = matcher()
    q, r = query(0, qid=1), answer(1, qid=2)
    assert m.add([q, r]) == [(None, r, 1)]  # response-only at once
    assert m.flush() == [(q, None, 1)]  # query-only when nothing can answer it any more
    assert counts(m) == {"response_only": 1, "query_only": 1}


# --- timeouts on capture time ----------------------------------------------------------------------------------


def timeout_messages():
    """Answered after 4 s, then after 6 s."""
    return [query(0, qid=1), answer(4000, qid=1), query(10_000, qid=2), answer(16_000, qid=2)]


@pytest.mark.parametrize("per_add", [4, 1], ids=["one add", "one message per add"])
def test_timeout_on_capture_time(matcher, per_add):
    q1, r1, q2, r2 = msgs = timeout_messages()
    m = matcher()  # default timeout: 5 s
    out = [t for i in range(0, 4, per_add) for t in m.add(msgs[i : i + per_add])]
    assert out == [(q1, r1, 1), (None, r2, 1), (q2, None, 1)]
    assert m.flush() == []
    assert counts(m) == {"matched": 1, "response_only": 1, "query_only": 1}

    m = matcher(query_timeout=10)
    out = [t for i in range(0, 4, per_add) for t in m.add(msgs[i : i + per_add])]
    assert out == [(q1, r1, 1), (q2, r2, 1)] and counts(m) == {"matched": 2}


def test_an_answer_exactly_at_the_timeout_matches(matcher):
    q = query(0)
    m = matcher(query_timeout=5)
    r = message(at(5000), r_dns(1), to_server=False)
    assert m.add([q, r]) == [(q, r, 1)]
    m = matcher(query_timeout=5)
    late = message(at(5000) + 1, r_dns(1), to_server=False)
    assert m.add([q, late]) == [(None, late, 1), (q, None, 1)]


def test_expiry_runs_on_the_clock_given(matcher):
    """now_ns, the pipeline's clock (its last frame, also of a batch without messages), expires queries."""
    m = matcher(query_timeout=5)
    q = query(0)
    assert m.add([q]) == []
    assert m.add([], now_ns=at(5000)) == [] and m.held == 1  # not older than the timeout yet
    assert m.add([], now_ns=at(5000) + 1) == [(q, None, 1)] and m.held == 0
    r = answer(5001)
    assert m.add([r]) == [(None, r, 1)]
    assert counts(m) == {"query_only": 1, "response_only": 1}


def test_the_clock_does_not_go_back(matcher):
    m = matcher(query_timeout=5)
    q = query(0)
    m.add([], now_ns=at(10_000))
    assert m.add([q]) == [(q, None, 1)]  # older than the timeout on the clock reached
    assert m.add([], now_ns=at(1)) == []


# --- the question -----------------------------------------------------------------------------------------------


def test_question_mismatch_does_not_match(matcher):
    m = matcher()
    q = query(0, name="right.example", qtype="A")
    wrong_name = answer(100, name="wrong.example", qtype="A")
    wrong_type = answer(200, name="right.example", qtype="AAAA")
    right = answer(300, name="right.example", qtype="A")
    assert m.add([q, wrong_name, wrong_type, right]) == [(None, wrong_name, 1), (None, wrong_type, 1), (q, right, 1)]
    assert counts(m) == {"matched": 1, "response_only": 2}


CASES = {"ascii": ("ExAmPlE.com", "example.COM"), "utf-8": ("www.\u00c9t\u00e9.example", "WWW.\u00e9T\u00c9.EXAMPLE")}


@pytest.mark.parametrize("names", CASES.values(), ids=CASES)
def test_qname_case_does_not_matter(matcher, names):
    m = matcher()
    q, r = query(0, name=names[0].encode()), answer(1, name=names[1].encode())
    assert q[M.QNAME] != r[M.QNAME]
    assert m.add([q, r]) == [(q, r, 1)]


def test_a_response_without_question_answers_the_oldest_query_with_its_id(matcher):
    m = matcher()
    q1, q2 = query(0, name="a.example"), query(10, name="b.example")  # a retry on the same port and ID
    bare = message(at(20), bytes(DNS(id=1, qr=1, rcode=2, qd=[])), to_server=False)
    assert bare[M.QNAME] is None
    assert m.add([q1, q2, bare]) == [(q1, bare, 1)]
    assert m.flush() == [(q2, None, 1)]
    assert counts(m) == {"matched": 1, "duplicate_queries": 1, "query_only": 1}


# --- retries and duplicates --------------------------------------------------------------------------------------


def test_retries_are_answered_in_order_and_a_duplicate_answer_is_response_only(matcher):
    m = matcher()
    q1, q2 = query(0), query(100)  # same key, same question
    r1, r2, r3 = answer(150), answer(160), answer(170)
    assert m.add([q1, q2, r1, r2, r3]) == [(q1, r1, 1), (q2, r2, 1), (None, r3, 1)]
    assert counts(m) == {"matched": 2, "duplicate_queries": 1, "response_only": 1}


def test_a_retry_with_another_question_waits_for_its_own_answer(matcher):
    m = matcher()
    qa, qb = query(0, name="a.example"), query(10, name="b.example")
    rb = answer(20, name="b.example")
    assert m.add([qa, qb, rb]) == [(qb, rb, 1)]
    assert m.held == 1
    assert m.flush() == [(qa, None, 1)]


def test_every_part_of_the_key_must_agree(matcher):
    m = matcher()
    q = query(0)
    others = [
        answer(1, qid=2),  # another DNS ID
        answer(2, cport=40001),  # another client port
        answer(3, sport=5353),  # another server port
        answer(4, server="198.51.100.54"),  # another server
        answer(5, client="192.0.2.2"),  # another client
        answer(6, proto=6),  # over TCP: another scope
    ]
    right = answer(7)
    assert m.add([q, *others, right]) == [(None, r, 1) for r in others] + [(q, right, 1)]
    assert counts(m) == {"matched": 1, "response_only": len(others)}


def test_ipv6(matcher):
    m = matcher()
    q, r = query(0, client="2001:db8::1", server="2001:db8::53"), answer(1, client="2001:db8::1", server="2001:db8::53")
    other = answer(2, client="2001:db8::2", server="2001:db8::53")
    assert m.add([q, other, r]) == [(None, other, 1), (q, r, 1)]


# --- malformed messages ------------------------------------------------------------------------------------------


def test_malformed_messages_are_exported_alone(matcher):
    m = matcher()
    q = query(0)
    bad_query = message(at(1), q_dns(1)[:15])  # cut in the question
    no_header = message(at(2), q_dns(1)[:5])  # no flags: on the query side
    bad_response = message(at(3), r_dns(1)[:20], to_server=False)  # with the query's key
    assert bad_query[M.MALFORMED] and no_header[M.FLAGS] is None and bad_response[M.MALFORMED]
    assert m.add([q, bad_query, no_header, bad_response]) == [
        (bad_query, None, 1), (no_header, None, 1), (None, bad_response, 1)
    ]
    r = answer(4)
    assert m.add([r]) == [(q, r, 1)]  # neither took the pending query
    assert counts(m) == {"matched": 1}


# --- zone transfers ----------------------------------------------------------------------------------------------


def soa(zone="zone.example"):
    return DNSRRSOA(rrname=zone, ttl=3600, mname="ns." + zone, rname="h." + zone, serial=42)


def a_records(n, zone="zone.example"):
    return [DNSRR(rrname=f"h{i}.{zone}", type="A", ttl=60, rdata=f"192.0.2.{i + 1}") for i in range(n)]


def transfer_response(ms, answers, first=True, qtype="AXFR", rcode=0, proto=6, cport=50000, **kw):
    qd = [DNSQR(qname="zone.example", qtype=qtype)] if first else []
    dns = bytes(DNS(id=7, qr=1, aa=1, rcode=rcode, qd=qd, an=answers))
    return message(at(ms), dns, to_server=False, proto=proto, cport=cport, **kw)


def transfer_query(ms, qtype="AXFR", proto=6, cport=50000):
    return message(at(ms), bytes(DNS(id=7, qd=[DNSQR(qname="zone.example", qtype=qtype)])), proto=proto, cport=cport)


def merged(first, *more):
    """The first response with the summed answer counts and lengths (DNS Probe's merge)."""
    r = list(first)
    for name in (M.ANCOUNT, M.WIRELEN, M.DNS_LEN):
        r[name] = min(INT32_MAX, sum(x[name] for x in (first, *more)))
    return tuple(r)


def test_axfr_responses_merge_into_one_transaction(matcher):
    m = matcher()
    q = transfer_query(0)
    r1 = transfer_response(10, [soa(), *a_records(2)])
    r2 = transfer_response(15, a_records(4), first=False)
    r3 = transfer_response(20, [*a_records(1), soa()], first=False)  # its last answer is the SOA: the end
    assert m.add([q, r1, r2]) == []
    assert m.held == 0  # the query is taken: the transfer is open
    out = m.add([r3])
    assert out == [(q, merged(r1, r2, r3), 3)]
    assert out[0][1][M.ANCOUNT] == 3 + 4 + 2
    assert counts(m) == {"matched": 1, "zone_transfer_messages": 2}
    late = transfer_response(25, a_records(1), first=False)
    assert m.add([late]) == [(None, late, 1)]  # the transfer is closed


@pytest.mark.parametrize("qtype", ["AXFR", "IXFR"])
def test_a_transfer_in_one_message_closes_at_once(matcher, qtype):
    m = matcher()
    q = transfer_query(0, qtype, proto=17)
    r = transfer_response(10, [soa(), *a_records(2), soa()], qtype=qtype, proto=17)
    assert m.add([q, r]) == [(q, r, 1)]
    assert counts(m) == {"matched": 1}


def test_an_error_closes_a_transfer(matcher):
    m = matcher()
    q = transfer_query(0)
    refused = transfer_response(10, [], rcode=5)
    assert m.add([q, refused]) == [(q, refused, 1)]
    assert counts(m) == {"matched": 1}
    q2 = transfer_query(100, cport=50001)
    r1 = transfer_response(110, [soa(), *a_records(3)], cport=50001)
    failed = transfer_response(120, [], first=False, rcode=2, cport=50001)
    assert m.add([q2, r1, failed]) == [(q2, merged(r1, failed), 2)]


def test_an_open_transfer_ends_at_flush(matcher):
    m = matcher()
    q = transfer_query(0)
    r1, r2 = transfer_response(10, [soa(), *a_records(2)]), transfer_response(20, a_records(3), first=False)
    assert m.add([q, r1, r2]) == []
    assert m.flush() == [(q, merged(r1, r2), 2)]
    assert counts(m) == {"matched": 1, "zone_transfer_messages": 1}


def test_an_open_transfer_ends_a_timeout_after_its_last_message(matcher):
    m = matcher(query_timeout=5)
    q = transfer_query(0)
    r1, r2 = transfer_response(10, [soa(), *a_records(2)]), transfer_response(4000, a_records(3), first=False)
    assert m.add([q, r1, r2]) == []
    assert m.add([], now_ns=at(9000)) == []  # 5 s after the first response, not after the last
    assert m.add([], now_ns=at(9000) + 1) == [(q, merged(r1, r2), 2)]
    assert m.flush() == []


def test_summed_lengths_are_capped(matcher):
    m = matcher()
    q = transfer_query(0)
    big = INT32_MAX // 2 + 10
    r1 = transfer_response(10, [soa(), *a_records(1)], wirelen=big)
    r2 = transfer_response(20, a_records(1), first=False, wirelen=big)
    r3 = transfer_response(30, [soa()], first=False, wirelen=big)
    (t,) = m.add([q, r1, r2, r3])
    assert t[1][M.WIRELEN] == INT32_MAX and t == (q, merged(r1, r2, r3), 3)
    assert counts(m) == {"matched": 1, "zone_transfer_messages": 2, "lengths_capped": 1}


def open_udp_transfer(ms, cport):
    """An AXFR query over UDP and a response that leaves the transfer open (its last answer is not an SOA)."""
    return (transfer_query(ms, proto=17, cport=cport),
            transfer_response(ms + 1, [soa(), *a_records(1)], proto=17, cport=cport))


def test_open_transfers_expire_in_the_order_of_their_last_message(matcher):
    m = matcher(query_timeout=5)
    q1, r1 = open_udp_transfer(0, 50001)
    q2, r2 = open_udp_transfer(10, 50002)
    more = transfer_response(20, a_records(2), first=False, proto=17, cport=50001)
    assert m.add([q1, r1, q2, r2, more]) == [] and m.open_transfers == 2
    assert m.add([], now_ns=at(5011) + 1) == [(q2, merged(r2), 1)]  # the first is younger since its second message
    assert m.add([], now_ns=at(10_000)) == [(q1, merged(r1, more), 2)]
    m = matcher(query_timeout=5)
    m.add([q1, r1, q2, r2, more])
    assert m.add([], now_ns=at(10_000)) == [(q2, merged(r2), 1), (q1, merged(r1, more), 2)]  # in that order too
    assert m.open_transfers == 0


def test_a_transfer_reopened_under_its_key_exports_the_one_it_replaces(matcher):
    m = matcher()
    q1, r1 = open_udp_transfer(0, 50001)
    q2, r2 = open_udp_transfer(10, 50001)  # the same key: client port and ID
    assert m.add([q1, r1, q2]) == [] and m.held == 1
    assert m.add([r2]) == [(q1, merged(r1), 1)]  # not dropped unseen
    assert m.open_transfers == 1
    assert m.flush() == [(q2, merged(r2), 1)]
    assert counts(m) == {"matched": 2}


# --- bounds --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("per_key", [1, 2])
def test_retries_beyond_the_bound_of_a_key_evict_the_oldest(matcher, per_key):
    m = matcher(max_pending_per_key=per_key)
    queries = [query(i, name=f"q{i}.example") for i in range(4)]  # one key: same port and ID
    out = m.add(queries)
    assert out == [(q, None, 1) for q in queries[: 4 - per_key]]
    assert m.held == per_key
    assert counts(m) == {"duplicate_queries": 3, "query_only": 4 - per_key, "match_evicted": 4 - per_key}
    r = answer(10, name="q3.example")
    assert m.add([r]) == [(queries[3], r, 1)]


def test_max_pending_counts_queries_and_evicts_the_oldest_key(matcher):
    """max_pending bounds the queries held, not the keys: the oldest keys go, each with all its retries."""
    m = matcher(max_pending=3)
    queries = [query(i, cport=41000 + i % 2, qid=i % 2, name=f"q{i}.example") for i in range(5)]  # 2 keys: 3 and 2
    assert m.add(queries) == [(q, None, 1) for q in queries[0::2]]  # the key of the oldest query, whole
    assert m.held == 2
    assert counts(m) == {"duplicate_queries": 3, "query_only": 3, "match_evicted": 3}
    assert m.flush() == [(q, None, 1) for q in queries[1::2]]


def test_the_addresses_of_both_families_do_not_mix(matcher):
    m = matcher()
    q = query(0, client=C4, server=S4)
    r6 = answer(1, client="::ffff:192.0.2.1", server="::ffff:198.51.100.53")
    assert m.add([q, r6]) == [(None, r6, 1)]


def test_open_transfers_are_bounded_and_the_oldest_closed_early(matcher):
    """Spoofed pairs that open transfers and never close them: at most max_transfers stay open; to open another,
    the one whose last message is the oldest is exported as it stands and counted."""
    m = matcher(max_pending=2, max_transfers=3)
    pairs = [open_udp_transfer(10 * i, 51000 + i) for i in range(10)]
    assert m.add([x for pair in pairs[:3] for x in pair]) == [] and m.open_transfers == 3
    more = transfer_response(35, a_records(1), first=False, proto=17, cport=51000)  # the first, now the youngest
    out = m.add([more, *(x for pair in pairs[3:] for x in pair)])
    assert out == [(q, merged(r), 1) for q, r in pairs[1:3]] + [(pairs[0][0], merged(pairs[0][1], more), 2)] + [
        (q, merged(r), 1) for q, r in pairs[3:7]]
    assert m.open_transfers == 3 and m.held == 0
    assert counts(m) == {"matched": 7, "transfers_evicted": 7, "zone_transfer_messages": 1}
    assert m.flush() == [(q, merged(r), 1) for q, r in pairs[7:]]
