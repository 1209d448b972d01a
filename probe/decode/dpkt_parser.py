"""dpkt as the DNS parser of record (decode.parser: dpkt).

Produces exactly the tuple of probe.decode.dnswire.parse_message from a dpkt.dns.DNS object, so the
two can be compared message by message (tests/decode/test_parser_equivalence.py). dpkt 1.9.8 raises on RR
types it does not implement (RRSIG, DNSKEY, DS, HTTPS, SVCB, CAA, unassigned types) and on names that
are not UTF-8; such messages are handed to the wire walker and counted as dpkt_fallback, so none is
lost or miscounted.
"""

import dpkt

from probe.decode.dnswire import TYPE_OPT, Malformed, parse_message, parse_opt


def from_dpkt(msg, buf):
    """The DNS tuple (probe.model.DNS_FIELDS) of a parsed dpkt.dns.DNS message."""
    qname = qtype = qclass = labels = None
    if msg.qd:
        q = msg.qd[0]
        qname, qtype, qclass = q.name, q.type, q.cls
        labels = len(qname.split(".")) if qname else 0
    edns = None
    for rr in msg.ar:
        if rr.type == TYPE_OPT:
            edns = parse_opt(rr.rdata, rr.cls, rr.ttl, 0, len(rr.rdata))
            break
    last_an = msg.an[-1].type if msg.an else None
    for section in (msg.an, msg.ns, msg.ar):
        for rr in section:
            if len(rr.rdata) != rr.rlen:
                # dpkt cuts RDATA whose RDLENGTH runs past the end of the message without complaint.
                raise Malformed("resource record runs past the end of the message")
    return (
        len(buf), msg.id, msg.op, len(msg.qd), len(msg.an), len(msg.ns), len(msg.ar),
        qname, qtype, qclass, labels, edns, False, last_an, buf,
    )


class DpktParser:
    def __init__(self, stats):
        self.stats = stats

    def parse(self, buf):
        if len(buf) < 12:
            return parse_message(buf)  # no header: the walker reports it malformed
        try:
            return from_dpkt(dpkt.dns.DNS(buf), buf)
        except (dpkt.UnpackError, Malformed, UnicodeError, ValueError, KeyError, IndexError, TypeError):
            # UnpackError covers NeedData; the others are what dpkt 1.9.8 raises on RR types it lacks.
            self.stats.dpkt_fallback += 1
            return parse_message(buf)
