"""Deterministic, seeded generator of realistic DNS traffic for the benchmarks.

    python benchmarks/traffic.py --mix standard --packets 1000000 --seed 1 [-o FILE]

prints the path of a classic pcap (Ethernet, microsecond timestamps). Without -o the file is cached
under benchmarks/cache/ as MIX-nPACKETS-sSEED-vVERSION.pcap (with a .json of what it contains) and
reused; the same mix, seed and packet count always give the same bytes.

Mixes:
  standard  query/response pairs as seen at a recursive resolver: ~33 % of queries with EDNS (some
            DO, cookie, client-subnet, NSID), 90/10 IPv4/IPv6, A/AAAA/HTTPS/PTR/TXT/MX/NS/DS with
            realistic answers (CNAME chains to CDNs, SVCB-style HTTPS rdata, RRSIGs for DO queries on
            signed zones, SOA/NSEC in negative answers), ~8 % NXDOMAIN, ~1 % SERVFAIL (with an
            extended DNS error when EDNS was used), ~2 % of transactions over TCP (handshake, one
            query and one response, FIN both ways), ~1 % of queries unanswered, names drawn from a
            Zipf distribution over a few thousand domains.
  queries   the standard mix's queries only (UDP, no responses).
  large     query/response pairs whose responses carry many RRs (1,000-1,400 bytes of DNS).

How: every distinct DNS message body (question, answer, authority and additional sections) is
built once with scapy, keyed by (name, type, variant), with its content drawn from a random
generator seeded by that key, so it does not depend on the order in which bodies are first needed
(which lets them be built ahead, in parallel). Their names are then compressed by compress_wire().
Frames are then assembled at the byte level: the DNS header (ID, flags, counts) is packed, the EDNS
OPT record (itself built by scapy, once per option set) appended, and Ethernet/IPv4/IPv6/UDP/TCP
headers are packed with every field set explicitly (IP ID, TCP sequence numbers, ports, TTLs) and
checksums computed. Timestamps are generated on a capture clock of about 100k packets/s, strictly
increasing; responses follow their query by 0.1-50 ms. Nothing depends on the wall clock, hash
seeds or dict ordering. `--verify N` re-dissects the first N frames with scapy and checks every
checksum and that every DNS message parses.

Why not scapy's dns_compress: it costs two more builds per message and also compresses the names
in RRSIG/NSEC/SVCB RDATA, which RFC 4034/9460 forbid.

About 40 s for 1M standard packets on 2 CPUs, most of it building the ~33k distinct bodies.
"""

import argparse
import bisect
import heapq
import itertools
import json
import math
import multiprocessing
import os
import random
import struct
import sys
import time
from pathlib import Path

GEN_VERSION = 2  # part of the cache key: bump whenever the bytes generated change
HERE = Path(__file__).resolve().parent
CACHE_DIR = HERE / "cache"
MIXES = ("standard", "queries", "large")

CAPTURE_START_NS = 1_714_564_800 * 1_000_000_000  # 2024-05-01 12:00:00 UTC
PACKET_RATE = 100_000  # packets per second of capture time (mean)

QTYPES = {"A": 1, "NS": 2, "CNAME": 5, "SOA": 6, "PTR": 12, "MX": 15, "TXT": 16, "AAAA": 28,
          "DS": 43, "RRSIG": 46, "NSEC": 47, "DNSKEY": 48, "HTTPS": 65}

# Query flags (RD, AD, CD) and response flags.
F_QR, F_AA, F_TC, F_RD, F_RA, F_AD, F_CD = 0x8000, 0x0400, 0x0200, 0x0100, 0x0080, 0x0020, 0x0010
NOERROR, SERVFAIL, NXDOMAIN = 0, 2, 3

ETH_IP4 = b"\x08\x00"
ETH_IP6 = b"\x86\xdd"
ROUTER_MACS = (bytes.fromhex("0200c0a80001"), bytes.fromhex("0200c0a80002"))
SERVER_MAC = bytes.fromhex("0200c6336435")
SERVERS4 = ("192.0.2.53", "192.0.2.54", "198.51.100.53")
SERVERS6 = ("2001:db8:53::53", "2001:db8:53::54")

TLDS = (("com", 46), ("net", 10), ("org", 8), ("de", 5), ("cz", 4), ("io", 4), ("co.uk", 3), ("fr", 3),
        ("nl", 2), ("ru", 3), ("jp", 2), ("br", 2), ("info", 2), ("xyz", 1), ("app", 2), ("dev", 1),
        ("eu", 1), ("pl", 1))
SYLLABLES = ("ka", "lo", "mi", "net", "ra", "so", "ti", "ver", "zo", "an", "be", "ca", "do", "el", "fi",
             "go", "hu", "in", "ja", "ke", "li", "ma", "no", "ox", "pa", "qu", "re", "sa", "tu", "un",
             "vi", "wa", "xi", "yo", "ze", "tech", "shop", "news", "bank", "cloud", "data", "web", "mail",
             "play", "home", "city", "media", "soft", "link", "hub", "box", "co", "my", "go", "top")
HOSTS = (("", 30), ("www", 45), ("api", 6), ("cdn", 4), ("static", 3), ("m", 3), ("mail", 2),
         ("login", 2), ("img", 2), ("app", 2), ("assets", 1), ("auth", 1))
CDNS = (("edgekey.net", "akamaiedge.net"), ("cloudfront.net", None), ("fastly.net", None),
        ("azureedge.net", "afd.azureedge.net"), ("cdn.cloudflare.net", None), ("trafficmanager.net", None))
DNS_PROVIDERS = ("ns.cloudflare.com", "awsdns-17.org", "domaincontrol.com", "registrar-servers.com",
                 "nsone.net", "ultradns.net")
TXT_SAMPLES = (b"v=spf1 include:_spf.google.com ~all", b"v=spf1 mx a -all",
               b"v=spf1 include:spf.protection.outlook.com -all",
               b"MS=ms%08d", b"facebook-domain-verification=%030d", b"apple-domain-verification=%016d",
               b"globalsign-domain-verification=%032d", b"docusign=%036d")

# Per-query choices of the standard mix (weights).
STD_QTYPES = (("A", 48), ("AAAA", 26), ("HTTPS", 10), ("PTR", 5), ("TXT", 3), ("MX", 2.5), ("NS", 2.5),
              ("DS", 3))
EDNS_SHARE = 0.33
EDNS_FLAVOURS = (("plain", 30), ("do", 35), ("cookie", 20), ("ecs", 10), ("nsid", 5))
NX_SHARE = 0.08
SERVFAIL_SHARE = 0.01
UNANSWERED_SHARE = 0.01
TCP_SHARE = 0.02
IPV6_SHARE = 0.10


def _cum(weights):
    out, total = [], 0.0
    for w in weights:
        total += w
        out.append(total)
    return out


class _Choice:
    """Weighted choice driven by one rng.random() call (bisect on cumulative weights)."""

    __slots__ = ("items", "cum", "total")

    def __init__(self, pairs):
        self.items = [p[0] for p in pairs]
        self.cum = _cum([p[1] for p in pairs])
        self.total = self.cum[-1]

    def pick(self, rng):
        return self.items[bisect.bisect_right(self.cum, rng.random() * self.total)]


def zipf_choice(items, s=1.0):
    return _Choice([(x, 1.0 / (i + 1) ** s) for i, x in enumerate(items)])


def _inet(addr):
    import socket

    return socket.inet_pton(socket.AF_INET6 if ":" in addr else socket.AF_INET, addr)


# ----------------------------------------------------------------------------------------------
# The universe: domains, clients, servers (all drawn from the seed)
# ----------------------------------------------------------------------------------------------


class Client:
    __slots__ = ("addr", "mac", "ttl", "cookie", "server_cookie", "ecs", "v6")

    def __init__(self, addr, v6, mac, ttl, cookie, server_cookie, ecs):
        self.addr, self.v6, self.mac, self.ttl = addr, v6, mac, ttl
        self.cookie, self.server_cookie, self.ecs = cookie, server_cookie, ecs


class Universe:
    def __init__(self, seed, n_domains=2500, n_clients4=4000, n_clients6=500, n_ptr=1200):
        rng = random.Random(f"universe|{seed}")
        self.seed = seed
        tld_choice = _Choice(TLDS)
        names, seen = [], set()
        while len(names) < n_domains:
            sld = "".join(rng.choice(SYLLABLES) for _ in range(rng.choice((1, 2, 2, 3, 3, 4))))
            if rng.random() < 0.15:
                sld += str(rng.randrange(1, 100))
            name = f"{sld}.{tld_choice.pick(rng)}"
            if name not in seen:
                seen.add(name)
                names.append(name)
        self.domains = names
        self.domain_choice = zipf_choice(names, 1.0)
        # Per-domain host sets: popular domains have more hosts.
        self.hosts = {}
        for rank, d in enumerate(names):
            k = 2 + (rng.randrange(6) if rank < 300 else int(rng.random() < 0.3))
            pairs = [HOSTS[0], HOSTS[1]] + rng.sample(HOSTS[2:], k - 2)
            self.hosts[d] = _Choice(pairs)
        # Reverse names: most have a PTR, some do not (NXDOMAIN).
        ptr = []
        for _ in range(n_ptr):
            if rng.random() < 0.8:
                a = (rng.choice((10, 100, 172, 192, 203, 81, 185)), rng.randrange(256), rng.randrange(256),
                     rng.randrange(1, 255))
                ptr.append(".".join(map(str, reversed(a))) + ".in-addr.arpa")
            else:
                nib = f"{rng.getrandbits(128):032x}"
                ptr.append(".".join(reversed(nib)) + ".ip6.arpa")
        split = int(n_ptr * 0.75)
        self.ptr_ok = zipf_choice(ptr[:split], 0.8)
        self.ptr_nx = zipf_choice(ptr[split:], 0.8)
        # Nonexistent names (typos, stale links, malware beacons) and broken (SERVFAIL) domains.
        nx = []
        for _ in range(800):
            d = rng.choice(names[:1500])
            kind = rng.random()
            if kind < 0.4:
                sld, _, tld = d.partition(".")
                i = rng.randrange(len(sld))
                nx.append(f"www.{sld[:i]}{rng.choice('aeiourstnl')}{sld[i + 1:]}.{tld}")
            elif kind < 0.7:
                nx.append(f"{rng.choice(('old', 'test', 'dev', 'vpn', 'intranet', 'wpad', 'autodiscover'))}.{d}")
            else:
                nx.append(f"{''.join(rng.choice('abcdefghijklmnopqrstuvwxyz0123456789') for _ in range(12))}.{d}")
        self.nx_names = zipf_choice(nx, 0.7)
        broken = []
        for _ in range(150):
            sld = "".join(rng.choice(SYLLABLES) for _ in range(3))
            broken.append(f"{rng.choice(('www.', '', 'mail.'))}{sld}.{tld_choice.pick(rng)}")
        self.broken = zipf_choice(broken, 0.9)
        self.random_label_domains = zipf_choice(names[:30], 1.0)
        # Clients; the EDNS client cookie and the server cookie are per client.
        self.clients4, self.clients6 = [], []
        subnets4 = [(10, rng.randrange(256), rng.randrange(256)) for _ in range(60)]
        for _ in range(n_clients4):
            net = rng.choice(subnets4)
            addr = f"{net[0]}.{net[1]}.{net[2]}.{rng.randrange(2, 255)}"
            self.clients4.append(self._client(rng, addr, False, f"{net[0]}.{net[1]}.{net[2]}.0"))
        subnets6 = [f"2001:db8:{rng.randrange(1, 0xFFFF):x}:{rng.randrange(0xFFFF):x}" for _ in range(40)]
        for _ in range(n_clients6):
            net = rng.choice(subnets6)
            addr = net + "".join(f":{rng.getrandbits(16):x}" for _ in range(4))
            self.clients6.append(self._client(rng, addr, True, f"{net}::"))
        self.servers4 = [_inet(a) for a in SERVERS4]
        self.servers6 = [_inet(a) for a in SERVERS6]
        self.signed = {d for d in names if rng.random() < 0.3}
        self.signed |= {"arpa", "in-addr.arpa", "ip6.arpa"}

    @staticmethod
    def _client(rng, addr, v6, ecs_net):
        ttl = rng.choice((64, 64, 64, 128, 128, 255)) - rng.randrange(0, 6)
        return Client(_inet(addr), v6, rng.choice(ROUTER_MACS), ttl, rng.getrandbits(64).to_bytes(8, "big"),
                      bytes((1, 0, 0, 0)) + rng.getrandbits(96).to_bytes(12, "big"), ecs_net)

    def pick_client(self, rng, v6):
        pool = self.clients6 if v6 else self.clients4
        return pool[int(len(pool) * rng.random() ** 1.6)]  # some clients much busier than others

    def zone_of(self, name):
        """The zone a name is in (for SOA owners and RRSIG signers): registered domain or arpa."""
        if name.endswith(".in-addr.arpa"):
            return "in-addr.arpa"
        if name.endswith(".ip6.arpa"):
            return "ip6.arpa"
        labels = name.split(".")
        n = 3 if name.endswith(".co.uk") else 2
        return ".".join(labels[-n:])


# ----------------------------------------------------------------------------------------------
# Message bodies, built with scapy
# ----------------------------------------------------------------------------------------------


class Body:
    """A scapy-built response (ID 0): the question section and everything after the header."""

    __slots__ = ("question", "rest", "qd", "an", "ns", "ar", "signed")

    def __init__(self, wire, question_len, signed):
        self.qd, self.an, self.ns, self.ar = struct.unpack_from("!HHHH", wire, 4)
        self.question = wire[12 : 12 + question_len]
        self.rest = wire[12:]
        self.signed = signed


def _qname_wire_len(name):
    return sum(len(label) + 1 for label in name.split(".") if label) + 1


# RDATA layouts of the types whose RDATA names may be compressed (RFC 1035 section 4.1.4; RFC 3597
# forbids it for newer types): "n" a name, "2" two bytes; the rest is copied.
_RDATA_NAMES = {2: "n", 5: "n", 12: "n", 15: "2n", 6: "nn"}


def _plain_name(buf, off):
    labels = []
    while True:
        n = buf[off]
        off += 1
        if n == 0:
            return labels, off
        if n >= 0x40:
            raise ValueError("expected an uncompressed name")
        labels.append(buf[off : off + n])
        off += n


def compress_wire(wire):
    """Name compression (RFC 1035 4.1.4) of an uncompressed message: owner names, question names and
    the names in NS/CNAME/PTR/MX/SOA RDATA point back to earlier occurrences of their longest known
    suffix (compared case-insensitively). RRSIG, NSEC and SVCB/HTTPS names stay uncompressed."""
    out = bytearray(wire[:12])
    table = {}

    def name(labels):
        for i in range(len(labels)):
            key = b".".join(labels[i:]).lower()
            ptr = table.get(key)
            if ptr is not None:
                out.extend((0xC0 | ptr >> 8, ptr & 0xFF))
                return
            if len(out) < 0x3FFF:
                table[key] = len(out)
            out.append(len(labels[i]))
            out.extend(labels[i])
        out.append(0)

    qd, an, ns, ar = struct.unpack_from("!HHHH", wire, 4)
    off = 12
    for _ in range(qd):
        labels, off = _plain_name(wire, off)
        name(labels)
        out += wire[off : off + 4]
        off += 4
    for _ in range(an + ns + ar):
        labels, off = _plain_name(wire, off)
        name(labels)
        rtype, rdlen = struct.unpack_from("!H", wire, off)[0], struct.unpack_from("!H", wire, off + 8)[0]
        layout = _RDATA_NAMES.get(rtype)
        if layout is None:
            out += wire[off : off + 10 + rdlen]
        else:
            out += wire[off : off + 8]
            len_pos = len(out)
            out += b"\0\0"
            rdata = wire[off + 10 : off + 10 + rdlen]
            p = 0
            for item in layout:
                if item == "2":
                    out += rdata[p : p + 2]
                    p += 2
                else:
                    labels, p = _plain_name(rdata, p)
                    name(labels)
            out += rdata[p:]
            struct.pack_into("!H", out, len_pos, len(out) - len_pos - 2)
        off += 10 + rdlen
    if off != len(wire):
        raise ValueError("trailing bytes after the last record")
    return bytes(out)


_WORKER_BUILDER = None  # the Builder a forked prebuild worker inherits


def _build_in_worker(key):
    return _WORKER_BUILDER.build(*key)


class Builder:
    """Builds and caches message bodies and OPT records with scapy."""

    def __init__(self, universe, seed):
        from scapy.layers import dns as sdns

        self.s = sdns
        self.u = universe
        self.seed = seed
        self.bodies = {}
        self.opts = {}
        self.build_seconds = 0.0

    # -- OPT records --

    def opt(self, key):
        """OPT RR bytes for key = (udp, do, options...) where options are hashable descriptions."""
        b = self.opts.get(key)
        if b is not None:
            return b
        cookie = [o for o in key[2:] if o[0] == "cookie"]
        if cookie:
            # One scapy-built record per option set; the per-client cookie bytes (last) are patched in.
            _, client, server = cookie[0]
            blank = ("cookie", bytes(len(client)), bytes(len(server)))
            template = self._opt_record(key[:2] + tuple(o for o in key[2:] if o[0] != "cookie") + (blank,))
            return template[: len(template) - len(client) - len(server)] + client + server
        b = self.opts[key] = self._opt_record(key)
        return b

    def _opt_record(self, key):
        b = self.opts.get(key)
        if b is None:
            t0 = time.perf_counter()
            s = self.s
            udp, do, opts = key[0], key[1], key[2:]
            rdata = []
            for o in opts:
                kind = o[0]
                if kind == "cookie":
                    rdata.append(s.EDNS0COOKIE(client_cookie=o[1], server_cookie=o[2]))
                elif kind == "ecs":
                    fam, plen, addr = o[1], o[2], o[3]
                    rdata.append(s.EDNS0ClientSubnet(family=fam, source_plen=plen, scope_plen=o[4], address=addr))
                elif kind == "nsid":
                    rdata.append(s.EDNS0TLV(optcode=3, optlen=len(o[1]), optdata=o[1]))
                elif kind == "ede":
                    rdata.append(s.EDNS0ExtendedDNSError(info_code=o[1], extra_text=o[2]))
            b = self.opts[key] = bytes(s.DNSRROPT(rclass=udp, extrcode=0, version=0, z=0x8000 if do else 0,
                                                  rdata=rdata))
            self.build_seconds += time.perf_counter() - t0
        return b

    # -- bodies --

    def key(self, name, qtype, variant, do):
        """Body cache key. DO only changes a body in a signed zone (RRSIGs) or in the root's NXDOMAIN."""
        if do and variant not in ("servfail", "large"):
            do = variant == "nx-root" or self.u.zone_of(name) in self.u.signed
        else:
            do = False
        return (name, qtype, variant, do)

    def body(self, key):
        b = self.bodies.get(key)
        if b is None:
            t0 = time.perf_counter()
            b = self.bodies[key] = Body(*self.build(*key))
            self.build_seconds += time.perf_counter() - t0
        return b

    def prebuild(self, keys, workers):
        """Build the bodies for keys, in `workers` forked processes. Bodies depend only on their key, so
        who builds one, and when, changes nothing in the output."""
        global _WORKER_BUILDER
        t0 = time.perf_counter()
        todo = [k for k in dict.fromkeys(keys) if k not in self.bodies]
        if workers > 1 and len(todo) > 500 and "fork" in multiprocessing.get_all_start_methods():
            _WORKER_BUILDER = self
            try:
                with multiprocessing.get_context("fork").Pool(workers) as pool:
                    for key, built in zip(todo, pool.imap(_build_in_worker, todo, chunksize=64)):
                        self.bodies[key] = Body(*built)
            finally:
                _WORKER_BUILDER = None
        else:
            for k in todo:
                self.bodies[k] = Body(*self.build(*k))
        self.build_seconds += time.perf_counter() - t0

    def build(self, name, qtype, variant, dnssec):
        """(wire, question length, validated) of one response body, built with scapy."""
        s = self.s
        rng = random.Random(f"body|{self.seed}|{name}|{qtype}|{variant}")
        u = self.u
        zone = u.zone_of(name)
        signed = dnssec and zone in u.signed
        an, ns, ar = [], [], []
        if variant == "nx":
            self._negative(rng, name, zone, ns, signed, nx=True)
        elif variant == "nx-root":
            ns.append(s.DNSRRSOA(rrname=".", ttl=86400, mname="a.root-servers.net", rname="nstld.verisign-grs.com",
                                 serial=2024050100, refresh=1800, retry=900, expire=604800, minimum=86400))
            if dnssec:
                ns.append(self._rrsig(rng, ".", 6, 0, 86400, "."))
                signed = True
        elif variant == "servfail":
            signed = False
        elif variant == "large":
            self._large(rng, name, qtype, zone, an, ns, ar)
        else:
            signed = self._answer(rng, name, qtype, zone, an, ns, ar, signed)
        pkt = s.DNS(id=0, qr=1, opcode=0, rd=1, ra=1, qd=s.DNSQR(qname=name, qtype=qtype, qclass=1),
                    an=an, ns=ns, ar=ar)
        return compress_wire(bytes(pkt)), _qname_wire_len(name) + 4, bool(signed)

    def _rrsig(self, rng, owner, covered, labels, ttl, signer):
        return self.s.DNSRRRSIG(rrname=owner, ttl=ttl, typecovered=covered, algorithm=13, labels=labels,
                                originalttl=ttl, expiration=1715774400 + rng.randrange(86400 * 7),
                                inception=1713960000 + rng.randrange(86400), keytag=rng.randrange(65536),
                                signersname=signer, signature=rng.getrandbits(512).to_bytes(64, "big"))

    def _soa(self, rng, zone):
        return self.s.DNSRRSOA(rrname=zone, ttl=rng.choice((300, 900, 3600)), mname=f"ns1.{zone}",
                               rname=f"hostmaster.{zone}", serial=2024040000 + rng.randrange(10000),
                               refresh=7200, retry=3600, expire=1209600, minimum=rng.choice((300, 600, 3600)))

    def _negative(self, rng, name, zone, ns, signed, nx):
        soa = self._soa(rng, zone)
        ns.append(soa)
        if signed:
            labels = zone.count(".") + 1
            ns.append(self._rrsig(rng, zone, 6, labels, soa.ttl, zone))
            nxt = f"{''.join(rng.choice('abcdefghijklmnopqrstuvwxyz') for _ in range(5))}.{zone}"
            owner = zone if nx else name
            types = [1, 2, 6, 15, 16, 28, 46, 47, 48] if owner == zone else [1, 28, 46, 47]
            ns.append(self.s.DNSRRNSEC(rrname=owner, ttl=soa.minimum, nextname=nxt, typebitmaps=types))
            ns.append(self._rrsig(rng, owner, 47, owner.count(".") + 1, soa.minimum, zone))

    def _addr4(self, rng):
        a = rng.choice(((104, 16), (151, 101), (142, 250), (13, 224), (93, 184), (185, 199), (172, 67),
                        (23, 45), (52, 84), (35, 190)))
        return f"{a[0]}.{a[1] + rng.randrange(4)}.{rng.randrange(256)}.{rng.randrange(1, 255)}"

    def _addr6(self, rng):
        p = rng.choice(("2606:4700", "2a04:4e42", "2607:f8b0", "2600:9000", "2a02:26f0", "2620:1ec"))
        return f"{p}:{rng.getrandbits(16):x}::{rng.getrandbits(16):x}:{rng.getrandbits(16):x}"

    def _answer(self, rng, name, qtype, zone, an, ns, ar, signed):
        """Fill the sections of a NOERROR response; returns whether the answer is validated (AD)."""
        s = self.s
        labels = name.count(".") + 1
        owner, owner_zone = name, zone
        if qtype in (1, 28, 65) and not name.endswith(".arpa") and rng.random() < 0.3:
            # CNAME chain into a CDN (the zone of the chain's end is unsigned).
            cdn, second = CDNS[rng.randrange(len(CDNS))]
            target = f"{name.replace('.', '-')}.{cdn}"
            an.append(s.DNSRR(rrname=name, type="CNAME", ttl=rng.choice((60, 300, 3600)), rdata=target))
            if signed:
                an.append(self._rrsig(rng, name, 5, labels, an[-1].ttl, zone))
            if second:
                nxt = f"e{rng.randrange(1000, 99999)}.{rng.choice('abcdefg')}.{second}"
                an.append(s.DNSRR(rrname=target, type="CNAME", ttl=rng.choice((20, 60, 300)), rdata=nxt))
                target = nxt
            owner, owner_zone, signed = target, None, False
        ttl = rng.choice((20, 60, 120, 300, 600, 3600, 86400))
        rrs = []
        if qtype == 1:
            rrs = [s.DNSRR(rrname=owner, type="A", ttl=ttl, rdata=self._addr4(rng))
                   for _ in range(rng.choice((1, 1, 1, 2, 2, 4)))]
        elif qtype == 28:
            if rng.random() < 0.25:  # no IPv6: NODATA
                self._negative(rng, name, zone, ns, signed, nx=False)
                return signed
            rrs = [s.DNSRR(rrname=owner, type="AAAA", ttl=ttl, rdata=self._addr6(rng))
                   for _ in range(rng.choice((1, 1, 2, 2, 4)))]
        elif qtype == 65:
            if owner == name and rng.random() < 0.5:  # no HTTPS record: NODATA
                self._negative(rng, name, zone, ns, signed, nx=False)
                return signed
            if rng.random() < 0.15:
                rrs = [s.DNSRRHTTPS(rrname=owner, ttl=ttl, svc_priority=0, target_name=f"svc.{zone}")]
            else:
                params = [s.SvcParam(key=1, value=rng.choice(([b"h3", b"h2"], [b"h2"], [b"h3", b"h2", b"http/1.1"]))),
                          s.SvcParam(key=4, value=[self._addr4(rng) for _ in range(rng.choice((1, 2)))])]
                if rng.random() < 0.3:
                    params.append(s.SvcParam(key=5, value=rng.getrandbits(8 * 65).to_bytes(65, "big")))
                params.append(s.SvcParam(key=6, value=[self._addr6(rng) for _ in range(rng.choice((1, 2)))]))
                rrs = [s.DNSRRHTTPS(rrname=owner, ttl=ttl, svc_priority=1, target_name=".", svc_params=params)]
        elif qtype == 12:
            host = "-".join(name.split(".")[:4][::-1]) if name.endswith("in-addr.arpa") else f"h{rng.randrange(10**6)}"
            isp = rng.choice(("dyn.example-isp.net", "static.host.example", "cust.tele.example"))
            rrs = [s.DNSRR(rrname=name, type="PTR", ttl=ttl, rdata=f"{host}.{isp}")]
        elif qtype == 16:
            n = rng.choice((1, 2, 3, 4))
            rrs = []
            for sample in rng.sample(TXT_SAMPLES, n):
                txt = sample % rng.randrange(10**8) if b"%" in sample else sample
                rrs.append(s.DNSRR(rrname=name, type="TXT", ttl=ttl, rdata=[txt]))
        elif qtype == 15:
            if rng.random() < 0.5:
                rrs = [s.DNSRRMX(rrname=name, ttl=ttl, preference=p * 10, exchange=f"mx{p}.{zone}")
                       for p in range(1, rng.choice((2, 3, 4)))]
            else:
                rrs = [s.DNSRRMX(rrname=name, ttl=ttl, preference=p, exchange=f"alt{p}.aspmx.l.google.com")
                       for p in range(1, 5)]
        elif qtype == 2:
            prov = rng.choice(DNS_PROVIDERS + (None,))
            rrs = [s.DNSRR(rrname=name, type="NS", ttl=86400,
                           rdata=f"ns{i}.{zone}" if prov is None else f"ns-{rng.randrange(2000)}.{prov}")
                   for i in range(1, rng.choice((3, 3, 4, 5)))]
        elif qtype == 43:
            if zone not in self.u.signed:
                parent = name.split(".", 1)[1]
                ns.append(self.s.DNSRRSOA(rrname=parent, ttl=900, mname=f"a.nic.{parent}",
                                          rname=f"hostmaster.nic.{parent}", serial=1714560000 + rng.randrange(1000),
                                          refresh=1800, retry=900, expire=604800, minimum=900))
                return False
            rrs = [s.DNSRRDS(rrname=name, ttl=3600, keytag=rng.randrange(65536), algorithm=13, digesttype=2,
                             digest=rng.getrandbits(256).to_bytes(32, "big"))]
            if signed:
                parent = name.split(".", 1)[1]
                an.extend(rrs)
                an.append(self._rrsig(rng, name, 43, labels, 3600, parent))
                return True
        an.extend(rrs)
        if signed and rrs:
            an.append(self._rrsig(rng, owner, qtype, owner.count(".") + 1, ttl, owner_zone or zone))
        return signed

    def _large(self, rng, name, qtype, zone, an, ns, ar):
        """Answers with many RRs: 1,000-1,400 bytes of DNS once compressed, with the OPT record."""
        s = self.s
        target = rng.randrange(1050, 1350)
        ttl = rng.choice((60, 300, 3600))
        if qtype == 48:  # DNSKEY RRset (RSA keys, some mid-rollover) with its signature: 1,040-1,190 bytes
            keys = rng.choice((((257, 260), (256, 260), (256, 132)), ((257, 260), (256, 260), (256, 260)),
                               ((257, 260), (257, 260), (256, 132), (256, 132))))
            for flags, klen in keys:
                an.append(s.DNSRRDNSKEY(rrname=name, ttl=3600, flags=flags, protocol=3, algorithm=8,
                                        publickey=rng.getrandbits(8 * klen).to_bytes(klen, "big")))
            an.append(s.DNSRRRSIG(rrname=name, ttl=3600, typecovered=48, algorithm=8, labels=name.count(".") + 1,
                                  originalttl=3600, expiration=1715774400, inception=1713960000,
                                  keytag=rng.randrange(65536), signersname=name,
                                  signature=rng.getrandbits(8 * 256).to_bytes(256, "big")))
            return
        # Authority NS and glue, then answers up to the target size. Compressed sizes of the answers are
        # known exactly (their owner is the question name, so a 2-byte pointer), so one build suffices.
        for i in range(1, 5):
            ns.append(s.DNSRR(rrname=zone, type="NS", ttl=86400, rdata=f"ns{i}.{zone}"))
            ar.append(s.DNSRR(rrname=f"ns{i}.{zone}", type="A", ttl=86400, rdata=self._addr4(rng)))
        empty = s.DNS(id=0, qr=1, rd=1, ra=1, qd=s.DNSQR(qname=name, qtype=qtype), ns=ns, ar=ar)
        size = len(compress_wire(bytes(empty))) + 11  # + the response's OPT record
        while size < target:
            if qtype == 1:
                an.append(s.DNSRR(rrname=name, type="A", ttl=ttl, rdata=self._addr4(rng)))
                size += 16
            elif qtype == 28:
                an.append(s.DNSRR(rrname=name, type="AAAA", ttl=ttl, rdata=self._addr6(rng)))
                size += 28
            elif qtype == 15:
                host = f"mx{rng.randrange(100)}"
                an.append(s.DNSRRMX(rrname=name, ttl=ttl, preference=rng.randrange(1, 50), exchange=f"{host}.{zone}"))
                size += 12 + 2 + 1 + len(host) + 2
            else:
                sample = rng.choice(TXT_SAMPLES)
                txt = sample % rng.randrange(10**8) if b"%" in sample else sample
                an.append(s.DNSRR(rrname=name, type="TXT", ttl=ttl, rdata=[txt]))
                size += 12 + 1 + len(txt)


# ----------------------------------------------------------------------------------------------
# Frame assembly
# ----------------------------------------------------------------------------------------------

_PCAP_HDR = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 262144, 1)
_REC = struct.Struct("<IIII").pack
_DNS_HDR = struct.Struct("!HHHHHH").pack
_IP4 = struct.Struct("!BBHHHBBH4s4s").pack
_IP6 = struct.Struct("!IHBB16s16s").pack
_UDP = struct.Struct("!HHHH").pack
_TCP = struct.Struct("!HHIIBBHHH").pack
_SYN_OPTS4 = bytes.fromhex("020405b40101040201030307")  # MSS 1460, NOP NOP SACK-permitted, NOP WS 7
_SYN_OPTS6 = bytes.fromhex("020405a00101040201030307")  # MSS 1440
TCP_FIN, TCP_SYN, TCP_PSH, TCP_ACK = 0x01, 0x02, 0x08, 0x10


def _sum16(data):
    """One's-complement sum of 16-bit words, reduced mod 0xFFFF (2**16 ≡ 1 mod 0xFFFF)."""
    if len(data) & 1:
        data += b"\0"
    return int.from_bytes(data, "big") % 0xFFFF


def _fold(total):
    """Checksum field from an accumulated word sum (the data is never all zero)."""
    s = total % 0xFFFF
    return 0xFFFF - (s or 0xFFFF)


class FrameMaker:
    """Ethernet + IPv4/IPv6 + UDP/TCP frames with every field explicit and checksums computed."""

    def __init__(self):
        self.ip_id = 0x1234
        self._asum = {}

    def _addr_sum(self, addr):
        s = self._asum.get(addr)
        if s is None:
            s = self._asum[addr] = _sum16(addr)
        return s

    def _ip(self, v6, src, dst, proto, ttl, seg, csum_pos):
        """IP header + transport segment (whose checksum at csum_pos is still zero) → IP packet."""
        n = len(seg)
        pseudo = self._addr_sum(src) + self._addr_sum(dst) + proto + n
        c = _fold(pseudo + _sum16(seg))
        if proto == 17 and c == 0:
            c = 0xFFFF
        seg = seg[:csum_pos] + c.to_bytes(2, "big") + seg[csum_pos + 2 :]
        if v6:
            return ETH_IP6 + _IP6(0x60000000, n, proto, ttl, src, dst) + seg
        self.ip_id = ident = (self.ip_id + 1) & 0xFFFF
        flags = 0x4000 if proto == 6 else 0  # DF on TCP
        total = 20 + n
        hsum = 0x4500 + total + ident + flags + (ttl << 8 | proto) + self._addr_sum(src) + self._addr_sum(dst)
        return ETH_IP4 + _IP4(0x45, 0, total, ident, flags, ttl, proto, _fold(hsum), src, dst) + seg

    def udp(self, v6, smac, dmac, src, dst, sport, dport, ttl, payload):
        seg = _UDP(sport, dport, 8 + len(payload), 0) + payload
        return dmac + smac + self._ip(v6, src, dst, 17, ttl, seg, 6)

    def tcp(self, v6, smac, dmac, src, dst, sport, dport, ttl, seq, ack, flags, window, payload=b"", opts=b""):
        doff = (20 + len(opts)) // 4
        seg = _TCP(sport, dport, seq, ack, doff << 4, flags, window, 0, 0) + opts + payload
        return dmac + smac + self._ip(v6, src, dst, 6, ttl, seg, 16)


# ----------------------------------------------------------------------------------------------
# Traffic
# ----------------------------------------------------------------------------------------------


class Generator:
    """The traffic of one mix. Two random streams: `rq` draws what is asked (name, type, EDNS), which
    alone decides the message bodies, so the bodies can be planned and built ahead in parallel; `rng`
    draws everything else (clients, ports, IDs, timing, transport)."""

    def __init__(self, mix, seed, workers=None):
        if mix not in MIXES:
            raise ValueError(f"unknown mix {mix!r} (one of {', '.join(MIXES)})")
        self.mix = mix
        self.seed = seed
        self.large = mix == "large"
        self.rng = random.Random(f"traffic|{mix}|{seed}")
        self.rq = random.Random(f"questions|{mix}|{seed}")
        self.workers = workers if workers is not None else len(os.sched_getaffinity(0))
        self.u = Universe(seed, n_domains=300, n_ptr=10) if self.large else Universe(seed)
        self.b = Builder(self.u, seed)
        self.f = FrameMaker()
        self.qtype_choice = _Choice([(QTYPES[t], w) for t, w in STD_QTYPES])
        self.edns_choice = _Choice(EDNS_FLAVOURS)
        self.large_qtypes = _Choice([(1, 35), (28, 20), (16, 20), (15, 10), (48, 15)])
        self.counts = dict.fromkeys(
            ("frames", "transactions", "queries", "responses", "udp_queries", "tcp_connections", "tcp_frames",
             "ipv6_queries", "edns_queries", "do_queries", "cookie_queries", "ecs_queries", "nsid_queries",
             "noerror", "nxdomain", "servfail", "unanswered", "validated_responses", "random_label_names"), 0)
        self.frames_per_tx = 1 if mix == "queries" else 2 if self.large else 2 + TCP_SHARE * 6
        self.mean_gap_ns = 1e9 / PACKET_RATE * self.frames_per_tx

    # -- what is asked --

    def draw(self, rq):
        """(name, qtype, variant, patch_len, edns) of the next query; edns is None or (flavour, udp, do)."""
        if self.large:
            domain = self.u.domain_choice.pick(rq)
            qtype = self.large_qtypes.pick(rq)
            name, variant, patch = (f"www.{domain}" if qtype in (1, 28) else domain), "large", 0
            flavour = "do" if rq.random() < 0.5 else "plain"
            return name, qtype, variant, patch, (flavour, 4096, flavour == "do")
        name, qtype, variant, patch = self._question(rq)
        if rq.random() >= EDNS_SHARE:
            return name, qtype, variant, patch, None
        flavour = self.edns_choice.pick(rq)
        udp = rq.choice((1232, 1232, 1232, 4096, 512))
        do = flavour == "do" or (flavour == "cookie" and rq.random() < 0.5) or (flavour == "ecs" and rq.random() < 0.3)
        return name, qtype, variant, patch, (flavour, udp, do)

    def _question(self, rq):
        u = self.u
        r = rq.random()
        if r < NX_SHARE:
            k = rq.random()
            if k < 0.30:  # Chromium-style probe, one random label: NXDOMAIN from the root zone
                n = rq.randrange(7, 16)
                return "x" * n, 1, "nx-root", n
            if k < 0.50:  # random label under a popular domain (tracking, DGA-like, probes)
                n = rq.choice((8, 10, 12, 16))
                return f"{'x' * n}.{u.random_label_domains.pick(rq)}", rq.choice((1, 1, 28)), "nx", n
            if k < 0.65:
                return u.ptr_nx.pick(rq), 12, "nx", 0
            return u.nx_names.pick(rq), rq.choice((1, 1, 1, 28, 65)), "nx", 0
        if r < NX_SHARE + SERVFAIL_SHARE:
            return u.broken.pick(rq), rq.choice((1, 1, 28, 65)), "servfail", 0
        qtype = self.qtype_choice.pick(rq)
        if qtype == 12:
            return u.ptr_ok.pick(rq), 12, "ok", 0
        domain = u.domain_choice.pick(rq)
        if qtype == 43 or qtype == 2 or qtype == 15 or (qtype == 16 and rq.random() < 0.8):
            return domain, qtype, "ok", 0
        if qtype == 16:
            return f"_dmarc.{domain}", 16, "ok", 0
        host = u.hosts[domain].pick(rq)
        return (f"{host}.{domain}" if host else domain), qtype, "ok", 0

    def plan(self, transactions):
        """Build ahead the bodies of the next `transactions` queries (on a copy of the question stream)."""
        rq = random.Random()
        rq.setstate(self.rq.getstate())
        keys = []
        for _ in range(transactions):
            name, qtype, variant, _, edns = self.draw(rq)
            keys.append(self.b.key(name, qtype, variant, bool(edns and edns[2])))
        self.b.prebuild(keys, self.workers)

    def _edns(self, client, edns):
        """(query OPT key, response OPT key) for the drawn EDNS flavour and this client."""
        c = self.counts
        flavour, udp, do = edns
        c["edns_queries"] += 1
        qopts, ropts = (), ()
        if flavour == "cookie":
            c["cookie_queries"] += 1
            qopts = (("cookie", client.cookie, b""),)
            ropts = (("cookie", client.cookie, client.server_cookie),)
        elif flavour == "ecs":
            c["ecs_queries"] += 1
            fam, plen, scope = (2, 56, 48) if client.v6 else (1, 24, 24)
            qopts = (("ecs", fam, plen, client.ecs, 0),)
            ropts = (("ecs", fam, plen, client.ecs, scope),)
        elif flavour == "nsid":
            c["nsid_queries"] += 1
            qopts = (("nsid", b""),)
            ropts = (("nsid", b"res1.fra.example"),)
        if do:
            c["do_queries"] += 1
        return (udp, do) + qopts, (4096 if self.large else 1232, do) + ropts

    # -- one transaction --

    def transaction(self, ts, budget):
        """Frames of one transaction as [(ts_ns, frame)], the first at ts; at most `budget` frames."""
        rng = self.rng
        c = self.counts
        b = self.b
        mix = self.mix
        name, qtype, variant, patch, edns = self.draw(self.rq)
        v6 = rng.random() < IPV6_SHARE
        client = self.u.pick_client(rng, v6)
        servers = self.u.servers6 if v6 else self.u.servers4
        server = servers[int(rng.random() * len(servers))]
        qopt, ropt = self._edns(client, edns) if edns else (None, None)
        do = bool(edns and edns[2])
        body = b.body(b.key(name, qtype, variant, do))
        mid = rng.getrandbits(16)
        qflags = F_RD
        if rng.random() < 0.1:
            qflags |= F_AD
        if do and rng.random() < 0.1:
            qflags |= F_CD
        query = _DNS_HDR(mid, qflags, 1, 0, 0, 1 if qopt else 0) + body.question + (b.opt(qopt) if qopt else b"")
        label = None
        if patch:
            alphabet = "abcdefghijklmnopqrstuvwxyz0123456789" if variant == "nx" else "abcdefghijklmnopqrstuvwxyz"
            label = "".join(rng.choice(alphabet) for _ in range(patch)).encode()
            query = query[:13] + label + query[13 + patch :]
            c["random_label_names"] += 1
        c["transactions"] += 1
        c["queries"] += 1
        if v6:
            c["ipv6_queries"] += 1
        answered = mix != "queries" and rng.random() >= UNANSWERED_SHARE and budget >= 2
        tcp = mix == "standard" and rng.random() < TCP_SHARE and budget >= 8
        f = self.f
        ttl = client.ttl
        sport = rng.randrange(1024, 65536)
        smac, dmac = client.mac, SERVER_MAC
        if not answered and not tcp:
            if mix != "queries":
                c["unanswered"] += 1
            c["udp_queries"] += 1
            return [(ts, f.udp(v6, smac, dmac, client.addr, server, sport, 53, ttl, query))]
        # The response.
        rcode = SERVFAIL if variant == "servfail" else NXDOMAIN if variant in ("nx", "nx-root") else NOERROR
        c[{NOERROR: "noerror", SERVFAIL: "servfail", NXDOMAIN: "nxdomain"}[rcode]] += 1
        rflags = F_QR | (qflags & (F_RD | F_CD)) | F_RA | rcode
        if body.signed and (do or qflags & F_AD):
            rflags |= F_AD
            c["validated_responses"] += 1
        if ropt and rcode == SERVFAIL:
            ropt = ropt[:2] + (("ede", rng.choice((22, 22, 23, 6, 9)), b""),) + ropt[2:]
        resp = (_DNS_HDR(mid, rflags, body.qd, body.an, body.ns, body.ar + (1 if ropt else 0)) + body.rest
                + (b.opt(ropt) if ropt else b""))
        if label is not None:
            resp = resp[:13] + label + resp[13 + patch :]
        c["responses"] += 1
        # Response delay: cache hits are fast, misses take a round trip or several to authorities.
        if rcode == SERVFAIL:
            delay = rng.uniform(20e6, 50e6)
        elif rng.random() < 0.7:
            delay = min(2e6, 1.1e5 + rng.expovariate(1 / 2.5e5))
        else:
            delay = math.exp(rng.uniform(math.log(2e6), math.log(50e6)))
        delay = int(delay)
        if not tcp:
            c["udp_queries"] += 1
            return [(ts, f.udp(v6, smac, dmac, client.addr, server, sport, 53, ttl, query)),
                    (ts + delay, f.udp(v6, dmac, smac, server, client.addr, 53, sport, 64, resp))]
        # DNS over TCP: handshake, query, response, FIN both ways (timed as seen at the server).
        c["tcp_connections"] += 1
        c["tcp_frames"] += 8
        rtt = int(math.exp(rng.uniform(math.log(2e5), math.log(20e6))))
        cisn, sisn = rng.getrandbits(32), rng.getrandbits(32)
        opts = _SYN_OPTS6 if v6 else _SYN_OPTS4
        q = len(query).to_bytes(2, "big") + query
        r = len(resp).to_bytes(2, "big") + resp
        m32 = 0xFFFFFFFF
        ack, syn, push, fin = TCP_ACK, TCP_SYN, TCP_PSH | TCP_ACK, TCP_FIN | TCP_ACK
        cs = (v6, smac, dmac, client.addr, server, sport, 53, ttl)
        sc = (v6, dmac, smac, server, client.addr, 53, sport, 64)
        t1 = ts + 30_000  # SYN/ACK leaves the server
        t2 = ts + rtt  # client's ACK
        t3 = t2 + 40_000  # query
        t4 = t3 + delay  # response
        t5 = t4 + rtt + 50_000  # client's FIN once it has read the response
        t6 = t5 + 40_000  # server's FIN
        t7 = t6 + rtt  # client's last ACK
        c1, s1 = (cisn + 1) & m32, (sisn + 1) & m32
        c2, s2 = (c1 + len(q)) & m32, (s1 + len(r)) & m32
        return [
            (ts, f.tcp(*cs, cisn, 0, syn, 64240, b"", opts)),
            (t1, f.tcp(*sc, sisn, c1, syn | ack, 65160, b"", opts)),
            (t2, f.tcp(*cs, c1, s1, ack, 502)),
            (t3, f.tcp(*cs, c1, s1, push, 502, q)),
            (t4, f.tcp(*sc, s1, c2, push, 509, r)),
            (t5, f.tcp(*cs, c2, s2, fin, 502)),
            (t6, f.tcp(*sc, s2, (c2 + 1) & m32, fin, 509)),
            (t7, f.tcp(*cs, (c2 + 1) & m32, (s2 + 1) & m32, ack, 502)),
        ]

    def frames(self, packets):
        """Yield (ts_us, frame) in capture order: exactly `packets` frames, timestamps strictly increasing."""
        self.plan(int(packets / self.frames_per_tx * 1.02) + 16)
        rng = self.rng
        heap = []
        seq = 0
        emitted = 0
        ts = CAPTURE_START_NS
        last_us = 0
        gap = self.mean_gap_ns
        while emitted < packets:
            budget = packets - emitted - len(heap)
            if budget > 0:
                ts += int(rng.expovariate(1.0 / gap)) + 1
                txs = self.transaction(ts, budget)
                while heap and heap[0][0] <= ts:
                    t, _, frame = heapq.heappop(heap)
                    last_us = max(t // 1000, last_us + 1)
                    emitted += 1
                    yield last_us, frame
                last_us = max(ts // 1000, last_us + 1)
                emitted += 1
                yield last_us, txs[0][1]
                for t, frame in txs[1:]:
                    seq += 1
                    heapq.heappush(heap, (t, seq, frame))
            else:
                t, _, frame = heapq.heappop(heap)
                last_us = max(t // 1000, last_us + 1)
                emitted += 1
                yield last_us, frame
        self.counts["frames"] = emitted


def cache_path(mix, packets, seed):
    return CACHE_DIR / f"{mix}-n{packets}-s{seed}-v{GEN_VERSION}.pcap"


def write_pcap(mix, packets, seed, path, workers=None):
    """Generate into path (via a .part file); returns the metadata dict (also written to path.json).
    workers: processes building message bodies (default: the CPUs this process may use)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    gen = Generator(mix, seed, workers)
    part = path.with_name(f"{path.name}.{os.getpid()}.part")
    nbytes = len(_PCAP_HDR)
    try:
        with open(part, "wb") as fh:
            fh.write(_PCAP_HDR)
            out = []
            for us, frame in gen.frames(packets):
                n = len(frame)
                out.append(_REC(us // 1_000_000, us % 1_000_000, n, n))
                out.append(frame)
                if len(out) >= 131072:
                    data = b"".join(out)
                    nbytes += len(data)
                    fh.write(data)
                    out = []
            data = b"".join(out)
            nbytes += len(data)
            fh.write(data)
        meta = {
            "mix": mix,
            "packets": packets,
            "seed": seed,
            "generator_version": GEN_VERSION,
            "bytes": nbytes,
            "generation_seconds": round(time.perf_counter() - t0, 3),
            "main_process_cpu_seconds": round(time.process_time() - cpu0, 3),
            "body_build_seconds": round(gen.b.build_seconds, 3),
            "body_build_workers": gen.workers,
            "distinct_bodies": len(gen.b.bodies),
            "distinct_opt_records": len(gen.b.opts),
            "counts": gen.counts,
        }
        path.with_name(path.name + ".json").write_text(json.dumps(meta, indent=2) + "\n")
        os.replace(part, path)
    finally:
        part.unlink(missing_ok=True)
    return meta


def metadata(path):
    """The metadata written next to a generated pcap, or None."""
    p = Path(path)
    p = p.with_name(p.name + ".json")
    return json.loads(p.read_text()) if p.exists() else None


def generate(mix="standard", packets=1_000_000, seed=1, force=False, workers=None):
    """Path of the cached pcap for (mix, packets, seed), generating it first if needed."""
    path = cache_path(mix, packets, seed)
    if force or not path.exists() or metadata(path) is None:
        write_pcap(mix, packets, seed, path, workers)
    return path


def pcap_frames(path):
    """The frames of a classic little-endian microsecond pcap as written by write_pcap, in order."""
    with open(path, "rb") as fh:
        if fh.read(len(_PCAP_HDR)) != _PCAP_HDR:
            raise ValueError(f"{path}: not a pcap written by this generator")
        while hdr := fh.read(16):
            n = struct.unpack_from("<I", hdr, 8)[0] if len(hdr) == 16 else -1
            frame = fh.read(max(n, 0))
            if len(frame) != n:
                raise ValueError(f"{path}: truncated record")
            yield frame


# trafgen (netsniff-ng) packet configuration: one `{ 0x.., ... }` block per frame, bytes in hex, 16 to a line.
TRAFGEN_CFG_VERSION = 1  # part of the config's name: bump whenever the text written changes
_HEX = tuple(f"0x{i:02x}" for i in range(256))


def trafgen_config_path(pcap, frames=None):
    pcap = Path(pcap)
    return pcap.with_name(f"{pcap.stem}.trafgen-v{TRAFGEN_CFG_VERSION}{f'-first{frames}' if frames else ''}.cfg")


def write_trafgen_config(pcap, path, frames=None):
    """Convert a pcap (its first `frames` frames) into a trafgen configuration sending the same frames in the same
    order (trafgen --num <frames> sends each once; more repeats them). Deterministic: the text depends on the
    frames only. Returns the frame count."""
    path = Path(path)
    part = path.with_name(f"{path.name}.{os.getpid()}.part")
    n = 0
    try:
        with open(part, "w") as fh:
            fh.write(f"/* trafgen packet configuration (format {TRAFGEN_CFG_VERSION}) written by benchmarks/traffic.py "
                     "from a pcap: one block per frame, in the pcap's order */\n")
            for frame in itertools.islice(pcap_frames(pcap), frames):
                n += 1
                rows = (",".join(_HEX[b] for b in frame[i : i + 16]) for i in range(0, len(frame), 16))
                fh.write(f"/* {n} */ {{\n  " + ",\n  ".join(rows) + "\n}\n")
        os.replace(part, path)
    finally:
        part.unlink(missing_ok=True)
    return n


def trafgen_config(pcap, frames=None, force=False):
    """Path of the trafgen configuration of the pcap (of its first `frames` frames) cached next to it, writing it
    first if needed."""
    path = trafgen_config_path(pcap, frames)
    if force or not path.exists() or path.stat().st_mtime < Path(pcap).stat().st_mtime:
        write_trafgen_config(pcap, path, frames)
    return path


def repeat_pcap(pcap, frames, packets, out):
    """Write to `out` the stream trafgen sends with the configuration of the first `frames` frames and --num
    `packets`: those frames again and again, `packets` in all."""
    head = list(itertools.islice(pcap_frames(pcap), frames))
    with open(out, "wb") as fh:
        fh.write(_PCAP_HDR)
        for i in range(packets):
            frame = head[i % len(head)]
            fh.write(_REC(i // 1_000_000, i % 1_000_000, len(frame), len(frame)) + frame)


def verify(path, limit):
    """Re-dissect the first `limit` frames with scapy: every checksum right, every DNS message parses."""
    from scapy.layers.dns import DNS
    from scapy.layers.inet import IP, TCP, UDP, Ether
    from scapy.layers.inet6 import IPv6
    from scapy.packet import Padding, Raw
    from scapy.utils import RawPcapReader

    problems = 0
    n = 0
    for n, (frame, _meta) in enumerate(RawPcapReader(str(path)), 1):
        if n > limit:
            n -= 1
            break
        pkt = Ether(frame)
        ip = pkt[IP] if IP in pkt else pkt[IPv6]
        checks = []
        if IP in pkt:
            checks.append((IP, ip.chksum))
        l4 = UDP if UDP in pkt else TCP
        checks.append((l4, pkt[l4].chksum))
        for layer, have in checks:
            clone = Ether(frame)
            del clone[layer].chksum
            want = Ether(bytes(clone))[layer].chksum
            if want != have:
                problems += 1
                print(f"frame {n}: {layer.__name__} checksum {have:#06x}, expected {want:#06x}")
        payload = bytes(pkt[l4].payload)
        if l4 is TCP:
            if not payload:
                continue
            payload = payload[2:]
        dns = DNS(payload)
        sections = (("qd", dns.qdcount), ("an", dns.ancount), ("ns", dns.nscount), ("ar", dns.arcount))
        bad = [f"{sec} {len(getattr(dns, sec) or [])}/{count}" for sec, count in sections
               if len(getattr(dns, sec) or []) != count]
        if bad or Raw in dns or Padding in dns:
            problems += 1
            print(f"frame {n}: DNS message does not dissect cleanly ({', '.join(bad) or 'trailing bytes'})")
    print(f"verified {n} frames, {problems} problem(s)")
    return problems == 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mix", choices=MIXES, default="standard")
    ap.add_argument("--packets", type=int, default=1_000_000, help="frames to generate (default 1,000,000)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("-o", "--output", metavar="FILE", help="write here instead of the cache")
    ap.add_argument("--force", action="store_true", help="regenerate even when cached")
    ap.add_argument("--workers", type=int, metavar="N", help="processes building message bodies (default: all CPUs)")
    ap.add_argument("--verify", type=int, default=0, metavar="N", help="check the first N frames with scapy")
    ap.add_argument("--stats", action="store_true", help="print what the file contains (to stderr)")
    ap.add_argument("--trafgen", action="store_true", help="also write (or reuse) the trafgen configuration of the "
                                                         "pcap next to it and print its path")
    args = ap.parse_args(argv)
    if args.packets < 1:
        ap.error("--packets must be at least 1")
    if args.output:
        path = Path(args.output)
        meta = write_pcap(args.mix, args.packets, args.seed, path, args.workers)
    else:
        path = generate(args.mix, args.packets, args.seed, args.force, args.workers)
        meta = metadata(path)
    if args.stats:
        print(json.dumps(meta, indent=2), file=sys.stderr)
    print(path)
    if args.trafgen:
        print(trafgen_config(path, force=args.force))
    if args.verify and not verify(path, args.verify):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
