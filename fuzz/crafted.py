"""Message tuples crafted from fuzz bytes, for the matching harnesses: a real query or response of the bundled
sample, or a malformed message, with the fields matching reads (ID, client address and port, direction, QNAME
in several cases, QTYPE including zone transfers, the last answer's type, transport, capture time) taken from
a few values each, so that keys collide, queries repeat, transfers open and close and timeouts fire. Decoding
frames reaches these states only by chance; here every 8 bytes make one message. A message may be a dnstap
one (probe.decode.dnstap): a scope of two families and of identities and producers that collide (an identity
equal to a producer's name), addresses, ports or transport None, a query copy (QueryCopy)."""

from harness import ROOT

from probe.capture.pcapfile import read_capture
from probe.config import load_config
from probe.decode.ipfilter import IpFilter
from probe.decode.packets import PacketDecoder
from probe.model import FLAG_QR, M, QueryCopy
from probe.stats import Stats

T0 = 1_700_000_000_000_000_000
CLIENTS = (b"\xc0\x00\x02\x01", b"\xc0\x00\x02\x02")
SERVER = b"\xc6\x33\x64\x35"
NAMES = ("a.example", "A.EXAMPLE", "\u212aelvin.example", "kelvin.example", "", "b.example")
# dnstap: (identity, scope name: the identity or else the producer's name)
DNSTAP_SCOPES = (("srv", "srv"), (None, "p1"), (None, "srv"))


def _templates():
    cfg = load_config(overrides={"decode.parser": "wire"})
    decoder = PacketDecoder(cfg.decode, cfg.decode.dns_ports, Stats(), IpFilter(cfg.filter))
    seen, out = set(), []
    for batch in read_capture(ROOT / "samples" / "sample-mix.pcap.xz", 4096):
        for m in decoder.decode(batch):
            kind = (m[M.PROTO], bool(m[M.FLAGS] & FLAG_QR), m[M.EDNS] is not None, m[M.ANCOUNT] > 0)
            if kind not in seen and m[M.IPV] == 4:
                seen.add(kind)
                out.append(m)
    malformed = list(out[0])
    malformed[M.DNS_LEN + 1 :] = (None,) * (len(malformed) - M.DNS_LEN - 2) + (malformed[M.RAW][:2],)
    malformed[M.MALFORMED] = True
    malformed[M.DNS_LEN] = 2
    return out + [tuple(malformed)]


TEMPLATES = _templates()


def messages(data):
    """One message per 8 bytes of data, 0 to 5.1 ms apart (the harnesses' timeouts are 1 to 8 ms)."""
    out, ts = [], T0
    for i in range(0, len(data) - 7, 8):
        tmpl, ident, port, direction, name, step, qtype, proto = data[i : i + 8]
        m = list(TEMPLATES[tmpl % len(TEMPLATES)])
        ts += step * 20_000
        client, cport = CLIENTS[direction >> 2 & 1], 1000 + port % 2
        response = direction & 1
        ends = (SERVER, 53, client, cport) if response ^ (direction >> 1 & 1) else (client, cport, SERVER, 53)
        m[M.TS_NS] = ts
        m[M.SRC], m[M.SPORT], m[M.DST], m[M.DPORT] = ends
        m[M.PROTO] = m[M.SCOPE] = 6 if proto & 1 else 17
        m[M.TRANSPORT] = 2 if proto & 1 else 1
        if m[M.ID] is not None:  # (a malformed message cut in its header has none)
            m[M.ID] = ident % 3
        if not m[M.MALFORMED]:
            m[M.FLAGS] = (m[M.FLAGS] & ~FLAG_QR) | (FLAG_QR if response else 0) | (proto >> 1 & 0x000F)
            if name % 8 < len(NAMES):
                m[M.QNAME] = NAMES[name % 8]
            if qtype % 4 == 0:
                m[M.QTYPE] = (251, 252)[qtype >> 2 & 1]
            if qtype & 8:
                m[M.LAST_AN_TYPE] = 6 if qtype & 16 else 1
        if proto & 0x20:
            m = _dnstap(m, proto, port)
            if name & 0x80:
                out.append(QueryCopy(m))
                continue
        out.append(tuple(m))
    return out


def _dnstap(m, proto, port):
    """Message m made a dnstap message, as probe.decode.dnstap makes them: no frame (lengths, TTL, checksum,
    VLAN, RTT None), the scope and origin, and per the bits of port: addresses, or transport and ports, None."""
    family = ("client", "auth")[proto >> 6 & 1]
    identity, scope_name = DNSTAP_SCOPES[(port >> 1) % 3]
    m[M.WIRELEN] = m[M.TTL] = m[M.UDP_SUM] = m[M.VLAN] = m[M.TCP_RTT_MS] = None
    absent = port >> 3 & 3
    if absent == 2:
        m[M.SRC] = m[M.DST] = m[M.IPV] = None
    elif absent == 3:
        m[M.TRANSPORT] = m[M.PROTO] = m[M.SPORT] = m[M.DPORT] = None
    m[M.SCOPE] = (m[M.TRANSPORT], family, scope_name)
    m[M.ORIGIN] = (family, identity)
    return tuple(m)
