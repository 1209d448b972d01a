"""C-DNS from dnstap: the transport flags RFC 8618 defines (UDP, TCP, TLS, HTTPS) from the dnstap transport, 15
("non-standard") for DoQ, DNSCrypt and a transport the producer did not give, and what the reader makes of them."""

import cbor2
from support.dnsprobe import run_dnsprobe
from support.dnstap import dnstap_frame, fstrm_file
from support.frames import T0
from support.messages import q_dns, r_dns

from export.cdns import format as F
from export.cdns.reader import read_records

# dnstap socket_protocol -> (C-DNS transport value, the transport column read back from C-DNS)
EXPECTED = {
    "UDP": (0, "udp"), "TCP": (1, "tcp"), "DOT": (2, "dot"), "DOH": (4, "doh"),
    "DOQ": (15, None), "DNSCryptUDP": (15, None), "DNSCryptTCP": (15, None), None: (15, None),
}


def test_transport_flags(tmp_path):
    frames = []
    for i, protocol in enumerate(EXPECTED):
        for v6 in (False, True):
            qid = i * 2 + v6
            addrs = dict(family="INET6", qaddr="2001:db8::1", raddr="2001:db8::53") if v6 else {}
            frames.append(dnstap_frame("CLIENT_QUERY", dns=q_dns(qid), protocol=protocol, qport=20000 + qid,
                                       ts=T0 + qid * 1000, **addrs))
            frames.append(dnstap_frame("CLIENT_RESPONSE", dns=r_dns(qid), protocol=protocol, qport=20000 + qid,
                                       ts=T0 + qid * 1000 + 500, **addrs))
    path = tmp_path / "tap.fstrm"
    path.write_bytes(fstrm_file(frames))
    out = tmp_path / "out"
    out.mkdir()
    run_dnsprobe("read", path, "-o", out, "-q", "--format", "cdns")
    (cdns,) = out.glob("*.cdns")
    _, _, blocks = cbor2.loads(cdns.read_bytes())
    flags = {}
    for block in blocks:
        tables = block[F.BLOCK_TABLES]
        sigs = tables[F.QR_SIG]
        for item in block[F.QUERY_RESPONSES]:
            sig = sigs[item[F.QR_SIGNATURE_INDEX]]
            flags[item[F.TRANSACTION_ID]] = sig[F.QR_TRANSPORT_FLAGS]
            assert F.CLIENT_HOPLIMIT not in item  # no TTL in dnstap: absent, not 0
    for i, (protocol, (value, _)) in enumerate(EXPECTED.items()):
        assert flags[i * 2] == value << 1, protocol
        assert flags[i * 2 + 1] == value << 1 | 1, protocol  # bit 0: IPv6
    back = {r["id"]: r for r in read_records(cdns)}
    for i, (protocol, (_, transport)) in enumerate(EXPECTED.items()):
        r = back[i * 2]
        prot = {"udp": 17, "tcp": 6, "dot": 6, "doh": 6}.get(transport)
        assert (r["transport"], r["prot"]) == (transport, prot), protocol
        assert r["query_present"] and r["response_present"] and r["response_delay_us"] == 0  # 500 ns
