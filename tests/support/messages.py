"""DNS messages as bytes (scapy): queries, responses, a response too big for one UDP datagram."""

from scapy.layers.dns import DNS, DNSQR, DNSRR


def q_dns(qid, qname="www.example.com", qtype="A", **kw):
    """A query (RD set) as bytes."""
    return bytes(DNS(id=qid, rd=1, qd=[DNSQR(qname=qname, qtype=qtype)], **kw))


def r_dns(qid, qname="www.example.com", qtype="A", answers=1, **kw):
    """A NOERROR response with `answers` A records as bytes."""
    an = [DNSRR(rrname=qname, type="A", ttl=300, rdata=f"203.0.113.{i % 250 + 1}") for i in range(answers)]
    return bytes(DNS(id=qid, qr=1, rd=1, ra=1, qd=[DNSQR(qname=qname, qtype=qtype)], an=an, **kw))


def big_response(qid, qname="big.example.com"):
    """A TXT response of about 3 kB: needs fragments over UDP."""
    an = [DNSRR(rrname=qname, type="TXT", ttl=60, rdata=[f"{i:03d}" + "x" * 200]) for i in range(14)]
    return bytes(DNS(id=qid, qr=1, rd=1, ra=1, qd=[DNSQR(qname=qname, qtype="TXT")], an=an))
