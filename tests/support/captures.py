"""Generated captures: the live tests' traffic, traffic a flow split must keep whole, the benchmark mix."""

import struct
from collections import Counter

from scapy.layers.dns import DNS, DNSQR, DNSRR
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.packet import Raw

from support.data import DATA_CAPTURES, ROOT
from support.dnsprobe import rows_of, run_dnsprobe
from support.frames import NS, S4, S6, TTL_C, TTL_S, TcpConn, ether, framed, write_pcap
from support.messages import big_response

KEY_COLUMNS = ("src", "srcp", "dst", "dstp", "prot", "id", "qname", "qtype", "rcode", "query_present",
               "response_present", "malformed")


def build_traffic(path, first, count):
    """A scapy-written pcap of `count` DNS transactions numbered from `first` (qname q<N>.example.com):
    many clients and ports, IPv4 and IPv6, some behind a VLAN tag, some over TCP, some IPv4 responses
    fragmented, and non-DNS frames in between that the kernel filter must drop.
    Returns the number of frames the filter should pass (every fragment of a fragmented datagram: the
    capture sockets get the frames as they were on the wire)."""
    from scapy.all import ARP, DNS, DNSQR, DNSRR, ICMP, IP, TCP, UDP, Dot1Q, Ether, IPv6, fragment, wrpcap

    frames = []
    passed = 0

    def eth(src_mac, dst_mac, vlan):
        e = Ether(src=src_mac, dst=dst_mac)
        return e / Dot1Q(vlan=vlan) if vlan else e

    cmac, smac = "02:00:00:00:00:01", "02:00:00:00:00:35"
    for i in range(first, first + count):
        v6 = i % 5 == 0
        vlan = 100 if i % 9 == 0 else None
        tcp = i % 13 == 0
        frag = not v6 and not tcp and i % 17 == 0
        client = f"2001:db8:c::{i:x}" if v6 else f"10.{1 + i // 250 % 200}.{i % 250}.7"
        server = "2001:db8:53::53" if v6 else "192.0.2.53"
        ip = (lambda s, d: IPv6(src=s, dst=d)) if v6 else (lambda s, d, i=i: IP(src=s, dst=d, id=i & 0xFFFF))
        sport = 10000 + (i * 37) % 50000
        qname = f"q{i}.example.com"
        query = DNS(id=i & 0xFFFF, rd=1, qd=DNSQR(qname=qname))
        answers = DNSRR(rrname=qname, type="A", ttl=300, rdata="192.0.2.1")
        if frag:
            answers = answers / DNSRR(rrname=qname, type="TXT", ttl=300, rdata=["x" * 250] * 8)
        response = DNS(id=i & 0xFFFF, qr=1, rd=1, ra=1, qd=DNSQR(qname=qname), an=answers)
        c2s = eth(cmac, smac, vlan)
        s2c = eth(smac, cmac, vlan)
        if tcp:
            q, r = bytes(query), bytes(response)
            q, r = struct.pack("!H", len(q)) + q, struct.pack("!H", len(r)) + r
            cs, ss = 1000, 5000
            seq = [
                (c2s, client, server, sport, 53, "S", cs, 0, b""),
                (s2c, server, client, 53, sport, "SA", ss, cs + 1, b""),
                (c2s, client, server, sport, 53, "A", cs + 1, ss + 1, b""),
                (c2s, client, server, sport, 53, "PA", cs + 1, ss + 1, q),
                (s2c, server, client, 53, sport, "PA", ss + 1, cs + 1 + len(q), r),
                (c2s, client, server, sport, 53, "FA", cs + 1 + len(q), ss + 1 + len(r), b""),
                (s2c, server, client, 53, sport, "FA", ss + 1 + len(r), cs + 2 + len(q), b""),
                (c2s, client, server, sport, 53, "A", cs + 2 + len(q), ss + 2 + len(r), b""),
            ]
            for e, s, d, sp, dp, flags, sq, ack, payload in seq:
                frames.append(e / ip(s, d) / TCP(sport=sp, dport=dp, flags=flags, seq=sq, ack=ack) / payload)
                passed += 1
        else:
            frames.append(c2s / ip(client, server) / UDP(sport=sport, dport=53) / query)
            resp = ip(server, client) / UDP(sport=53, dport=sport) / response
            pieces = fragment(resp, fragsize=600) if frag else [resp]
            frames += [s2c / f for f in pieces]
            passed += 1 + len(pieces)
        if i % 10 == 0:  # not DNS: the kernel filter drops these
            frames += [
                Ether(src=cmac, dst=smac) / IP(src=client if not v6 else "10.9.9.9", dst="192.0.2.123")
                / UDP(sport=sport, dport=123) / (b"\x23" + b"\x00" * 47),
                Ether(src=cmac, dst=smac) / IP(src="10.9.9.9", dst="192.0.2.80")
                / TCP(sport=sport, dport=443, flags="S"),
                Ether(src=cmac, dst=smac) / IP(src="10.9.9.9", dst="192.0.2.53") / ICMP(),
                Ether(src=cmac, dst="ff:ff:ff:ff:ff:ff") / ARP(psrc="10.9.9.9", pdst="10.9.9.1"),
            ]
    wrpcap(str(path), frames)
    return passed


def keys(rows):
    return Counter(tuple(r[c] for c in KEY_COLUMNS) for r in rows)


def traffic_parts(directory, count, names):
    """Parts of live traffic (build_traffic), `count` transactions each, numbered one part after the other:
    {name: (pcap, frames the kernel filter passes, the expected keys from `dnsprobe read`)}."""
    parts = {}
    for i, name in enumerate(names):
        pcap = directory / f"part{name}.pcap"
        passed = build_traffic(pcap, i * count, count)
        out = directory / f"ref{name}"
        out.mkdir()
        run_dnsprobe("read", pcap, "-o", out, "-q", "--no-progress")
        parts[name] = (pcap, passed, keys(rows_of(out)))
    return parts


def bench_mix():
    """The path of the standard mix of 20,000 packets, generated (once, then cached) when missing."""
    path = ROOT / "benchmarks" / "cache" / "standard-n20000-s1-v2.pcap"
    if not path.exists():
        import traffic  # benchmarks/traffic.py (support puts benchmarks/ on the path)

        return traffic.generate("standard", 20000, 1)
    return path


def columnar_captures(traffic):
    """The captures the columnar pipeline's tests run on beside the oracle data's: the sample, the live-capture
    test's generated traffic (the traffic_pcap fixture's) and the benchmark mix."""
    return DATA_CAPTURES + [ROOT / "samples" / "sample-mix.pcap.xz", traffic, bench_mix()]


def edge_traffic(path, count=240):
    """A pcap of `count` DNS transactions between many clients (IPv4 and IPv6) and two servers, cycling through
    the shapes a flow split must keep together: IPv6 queries and responses behind hop-by-hop, routing,
    destination-options and AH headers; responses and queries fragmented (IPv4 and IPv6, both directions, IPv6
    fragments behind a destination-options header too); TCP. Returns the number of frames."""
    from scapy.layers.inet import fragment
    from scapy.layers.inet6 import (
        IPv6ExtHdrDestOpt,
        IPv6ExtHdrFragment,
        IPv6ExtHdrHopByHop,
        IPv6ExtHdrRouting,
        fragment6,
    )
    from scapy.layers.ipsec import AH

    def pad_query(qid, qname, size):
        """A query made `size` bytes long by an EDNS padding option (needs fragments over UDP)."""
        from scapy.layers.dns import DNSRROPT, EDNS0TLV

        opt = DNSRROPT(rclass=4096, rdata=[EDNS0TLV(optcode=12, optdata=b"\0" * size)])
        return bytes(DNS(id=qid, rd=1, qd=[DNSQR(qname=qname, qtype="A")], ar=[opt]))

    frames = []
    t = 1_700_000_000 * NS
    for i in range(count):
        shape = i % 8
        v6 = shape in (0, 1, 2, 3, 4, 5)
        client = f"2001:db8:{i % 97:x}::{i % 251 + 1:x}" if v6 else f"10.{i % 7}.{i % 89}.{i % 251 + 1}"
        server = S6 if v6 else S4
        cport, qid = 30000 + i, 1000 + i
        qname = f"e{i}.example.com"

        query = bytes(DNS(id=qid, rd=1, qd=[DNSQR(qname=qname, qtype="A")]))
        answer = bytes(DNS(id=qid, qr=1, rd=1, ra=1, qd=[DNSQR(qname=qname, qtype="A")],
                           an=[DNSRR(rrname=qname, rdata="192.0.2.7")]))
        q_ext = r_ext = None
        q_frag = r_frag = False
        if shape == 0:
            q_ext = IPv6ExtHdrHopByHop()
        elif shape == 1:
            q_ext, r_ext = IPv6ExtHdrDestOpt() / IPv6ExtHdrRouting(addresses=[server]), IPv6ExtHdrHopByHop()
        elif shape == 2:
            q_ext = AH(nh=17, payloadlen=4, spi=7, seq=i, icv=b"\0" * 12)  # (scapy fills neither in)
        elif shape in (3, 6):
            answer, r_frag = big_response(qid, qname), True
            query = bytes(DNS(id=qid, rd=1, qd=[DNSQR(qname=qname, qtype="TXT")]))
        elif shape in (4, 7):
            query, q_frag = pad_query(qid, qname, 2600), True
        elif shape == 5:
            answer, r_frag, r_ext = big_response(qid, qname), True, IPv6ExtHdrDestOpt()
            query = bytes(DNS(id=qid, rd=1, qd=[DNSQR(qname=qname, qtype="TXT")]))
        sides = ((client, server, TTL_C, q_ext, (cport, 53), query, q_frag),
                 (server, client, TTL_S, r_ext, (53, cport), answer, r_frag))
        for src, dst, ttl, ext, ports, dns, fragmented in sides:
            ip = IPv6(src=src, dst=dst, hlim=ttl) if v6 else IP(src=src, dst=dst, ttl=ttl, id=i & 0xFFFF)
            ip = ip if ext is None else ip / ext
            l4 = UDP(sport=ports[0], dport=ports[1]) / Raw(dns)
            if not fragmented:
                pieces = [ip / l4]
            elif v6:
                pieces = fragment6(ip / IPv6ExtHdrFragment(id=i) / l4, 1280)
            else:
                pieces = fragment(ip / l4, fragsize=1000)
            for f in pieces:
                frames.append((t, ether(bytes(f))))
                t += 10_000
            t += 200_000
        t += 100_000
        if shape == 7:  # and a TCP exchange on the same address pair
            conn = TcpConn(cport + 20000, v6=False)
            for ts, f in conn.handshake(t, t + 1000, t + 2000):
                frames.append((ts, f))
            small = bytes(DNS(id=qid, rd=1, qd=[DNSQR(qname=qname, qtype="A")]))  # (a segment within the MTU)
            frames += [(t + 3000, conn.data("c", framed(small))), (t + 9000, conn.data("s", framed(answer)))]
            t += 20_000
    write_pcap(path, frames)
    return len(frames)
