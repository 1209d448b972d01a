"""Test helpers shared by every stage's tests: where the data is, running the real `dnsprobe` command and reading
back what it wrote, transactions of a capture, the veth testbed and the capture probe under test."""

import json
import operator
import os
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from scapy.layers.dns import DNS, DNSQR, DNSRR
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Dot1AD, Dot1Q, Ether
from scapy.packet import Raw
from scapy.utils import wrpcap

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
DNSPROBE_DATA = SHARED / "data" / "dns-probe"
COMPACTOR_DATA = SHARED / "data" / "compactor"
# The shared data (DNS Probe's and compactor's captures and expected files, the C-DNS CDDL) sits beside the
# checkout in CI; a clone elsewhere may not have it. Tests that read it skip then, saying so (conftest.py marks
# every test whose parameters name a path in it; needs_shared marks the others).
HAVE_SHARED = DNSPROBE_DATA.is_dir() and COMPACTOR_DATA.is_dir()
NO_SHARED = f"needs the shared test data beside the checkout (no {SHARED})"
needs_shared = pytest.mark.skipif(not HAVE_SHARED, reason=NO_SHARED)


def skip_without_shared(*values):
    """Skip the running test, saying why, when a value is a path into the shared data and that is missing."""
    if not HAVE_SHARED and any(isinstance(v, Path) and v.is_relative_to(SHARED) for v in values):
        pytest.skip(NO_SHARED)


def shared_params(paths):
    """Parameters made of files of the shared data: the paths, or one skipped case saying why there are none."""
    if HAVE_SHARED:
        return paths
    return [pytest.param(SHARED / "missing", marks=pytest.mark.skip(reason=NO_SHARED))]
# The benchmark scripts are plain modules in benchmarks/ (the veth testbed, the traffic generator): importable.
sys.path.insert(0, str(ROOT / "benchmarks"))
from testbed import Testbed  # noqa: E402


def copy_env():
    """The environment for running a copy of the package that stands for an install without an extension: not
    pointed at another build of the extensions (make test-asan sets DNSPROBE_NATIVE_DIR, which would supply it)."""
    return {k: v for k, v in os.environ.items() if k != "DNSPROBE_NATIVE_DIR"}


def run_python(code, *args):
    """Run Python code (sys.argv[1:]: args) in a fresh interpreter from the repository's root (a crash there fails
    the test instead of ending the test run); returns the CompletedProcess (text)."""
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, cwd=ROOT)


def run_dnsprobe(*args, check=True):
    """Run `python -m probe ARGS`; returns CompletedProcess (text). check=True asserts exit 0."""
    skip_without_shared(*args)
    proc = subprocess.run(
        [sys.executable, "-m", "probe", *map(str, args)], capture_output=True, text=True, cwd=ROOT
    )
    if check:
        assert proc.returncode == 0, f"dnsprobe {args} failed ({proc.returncode}):\n{proc.stderr}"
    return proc


def read_output(directory):
    """All records written to a directory, in file-name order, as one Arrow table."""
    files = sorted(Path(directory).glob("*.parquet"))
    assert files, f"no parquet files in {directory}"
    return pa.concat_tables([pq.read_table(f) for f in files])


def as_rows(table):
    """Records as dicts; timestamp columns as integer nanoseconds since the epoch (exact, whatever the unit
    written: microseconds today), so that tests compare them with the capture's nanoseconds through at_us()."""
    for i, field in enumerate(table.schema):
        if pa.types.is_timestamp(field.type):
            table = table.set_column(i, field.name, table.column(i).cast(pa.timestamp("ns", tz="UTC")).cast(pa.int64()))
    return table.to_pylist()


def at_us(ns):
    """A capture time in nanoseconds as the output stores it: cut to the microsecond (whole nanoseconds)."""
    return ns - ns % 1000


def dnsprobe_read(pcap, out_dir, *extra):
    """Run `dnsprobe read PCAP -o OUT_DIR` and return the records as a list of dicts."""
    run_dnsprobe("read", pcap, "-o", out_dir, "-q", "--no-progress", *extra)
    return as_rows(read_output(out_dir))


# Columns DNS Probe's own tests do not compare: it stamps rows with the wall clock.
DNSPROBE_IGNORED = {"unixtime", "time", "time_micro", "tcp_hs_rtt"}


def assert_rows_equal_dnsprobe(expected_file, rows, label):
    """Our rows equal DNS Probe's expected Parquet file, row by row in order, on every column it compares."""
    expected = pq.read_table(expected_file)
    assert len(rows) == expected.num_rows, f"{label}: {len(rows)} rows, DNS Probe has {expected.num_rows}"
    columns = [c for c in expected.column_names if c not in DNSPROBE_IGNORED]
    for i, (want, got) in enumerate(zip(expected.select(columns).to_pylist(), rows)):
        diff = {c: (want[c], got[c]) for c in columns if want[c] != got[c]}
        assert not diff, f"{label} row {i}: (expected, ours) {diff}"


# ---------------------------------------------------------------------------------------------
# Transactions of a capture, through the stages in-process


def transactions(path, keep_raw=True):
    """The transactions of a capture file, decoded and matched with the default configuration (keep_raw: with the
    DNS messages' bytes, as C-DNS and the answers column read them)."""
    skip_without_shared(path)
    from probe.capture.pcapfile import read_capture
    from probe.config import load_config
    from probe.decode.ipfilter import IpFilter
    from probe.decode.packets import PacketDecoder
    from probe.match import TransactionTable
    from probe.stats import Stats

    cfg = load_config()
    stats = Stats()
    decoder = PacketDecoder(cfg.decode, cfg.decode.dns_ports, stats, IpFilter(cfg.filter), keep_raw=keep_raw)
    table = TransactionTable(cfg.match, stats)
    txs = []
    for batch in read_capture(path, 4096):
        txs += table.add(decoder.decode(batch, str(path)))
    decoder.flush()
    return txs + table.flush()


# Every capture of the shared data (pcap, pcapng, compressed).
SHARED_CAPTURES = sorted(
    p for p in list(DNSPROBE_DATA.rglob("*.pcap*")) + list(COMPACTOR_DATA.rglob("*.pcap*"))
    if not p.name.endswith(".info")
)


# ---------------------------------------------------------------------------------------------
# Live capture: traffic, the probe under test, what it wrote

CLIENT_MAC = bytes.fromhex("020000000001")
SERVER_MAC = bytes.fromhex("020000000035")
KEY_COLUMNS = ("src", "srcp", "dst", "dstp", "prot", "id", "qname", "qtype", "rcode", "query_present",
               "response_present", "malformed")
CLIENT_MAC = bytes.fromhex("020000000001")
SERVER_MAC = bytes.fromhex("020000000035")
WAIT_S = 30.0


# ---------------------------------------------------------------------------------------------
# The testbed: benchmarks/testbed.py, shared with the benchmarks


class VethBed(Testbed):
    """The tests' testbed: two veth pairs (dptc<pid> ↔ dptp<pid>, and dptc<pid>b ↔ dptp<pid>b for a second
    interface) in the namespace dnsprobe-t<pid>."""

    def __init__(self):
        super().__init__("t", pairs=2)



class Hugepages:
    """2 MiB hugepages for DPDK's multi-process tests, given back afterwards: `pages` more reserved
    (vm.nr_hugepages, raised and lowered by that many, as other users of this machine may hold some) and a
    hugetlbfs of our own mounted for EAL's --huge-dir. skip_reason is set when they cannot be had (not root, the
    kernel found fewer free pages)."""

    NR = Path("/proc/sys/vm/nr_hugepages")

    def __init__(self, pages=128):
        self.pages = pages
        self.dir = None
        self.raised = 0
        self.skip_reason = None

    def __enter__(self):
        import tempfile

        if os.geteuid() != 0 or not self.NR.exists():
            self.skip_reason = "needs root and hugepage support"
            return self
        try:
            before = int(self.NR.read_text())
            self.NR.write_text(str(before + self.pages))
        except OSError as exc:  # a read-only /proc/sys (a container), a kernel without hugepages
            self.skip_reason = f"cannot reserve hugepages: {self.NR}: {exc.strerror}"
            return self
        self.raised = max(0, int(self.NR.read_text()) - before)
        free = _meminfo("HugePages_Free")
        if self.raised < self.pages or free < self.pages:
            self.skip_reason = f"could reserve {self.raised} of {self.pages} hugepages ({free} free)"
            return self
        self.dir = Path(tempfile.mkdtemp(prefix="dnsprobe-huge-"))
        # size=: the EAL of this mount takes no more than the pages reserved here (others may hold some too).
        mount = subprocess.run(["mount", "-t", "hugetlbfs", "-o", f"pagesize=2M,size={2 * self.pages}M", "none",
                                str(self.dir)], capture_output=True, text=True)
        if mount.returncode:
            self.skip_reason = f"cannot mount a hugetlbfs: {mount.stderr.strip()}"
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
        return self

    def files(self):
        return sorted(p.name for p in self.dir.iterdir()) if self.dir else []

    def __exit__(self, *exc):
        if self.dir is not None:
            subprocess.run(["umount", str(self.dir)], check=False)
            shutil.rmtree(self.dir, ignore_errors=True)
        if self.raised:
            self.NR.write_text(str(max(0, int(self.NR.read_text()) - self.raised)))


def _meminfo(key):
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


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


class Probe:
    def __init__(self, testbed, out_dir, *args, coremask="0x1", config=None, netns=None, command=None):
        """config: a YAML file naming the interfaces and the coremask instead of the flags; testbed None: no
        interface (dnstap sockets only, in args); netns: run it in this network namespace; command: what runs
        `dnsprobe capture` (default: this Python's `-m probe capture`)."""
        self.out_dir = Path(out_dir)
        where = ["-c", str(config)] if config else ["--coremask", coremask]
        if testbed is not None and not config:
            where += ["-i", testbed.iface]
        cmd = [*(command or [sys.executable, "-m", "probe", "capture"]), *where,
               "-o", str(out_dir), "--stats-interval", "0.3", "--no-progress", "-q", *map(str, args)]
        if netns:
            cmd = ["ip", "netns", "exec", netns, *cmd]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines = []
        self.ready = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stderr:
            self.lines.append(line)
            if "capturing on" in line:
                self.ready.set()
        self.ready.set()

    @property
    def stderr(self):
        return "".join(self.lines)

    def wait_ready(self):
        assert self.ready.wait(60), "probe did not start"
        assert self.proc.poll() is None, f"probe exited ({self.proc.returncode}):\n{self.stderr}"

    def stats(self):
        """This capture's statistics JSON (the one naming its pid, when captures share the directory)."""
        for f in sorted(self.out_dir.glob("*.stats.json")):
            try:
                doc = json.loads(f.read_text())
            except ValueError:  # taken (created empty), not written yet
                continue
            if doc.get("pid", self.proc.pid) == self.proc.pid:
                return doc
        return None

    def wait_for(self, predicate, what):
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            doc = self.stats()
            if doc is not None and predicate(doc):
                return doc
            assert self.proc.poll() is None, f"probe exited ({self.proc.returncode}) waiting for {what}:\n{self.stderr}"
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}; last stats: {self.stats()}\n{self.stderr}")

    def wait_counter(self, name, at_least):
        return self.wait_for(lambda d: d["counters"][name] >= at_least, f"{name} >= {at_least}")

    def signal(self, sig):
        self.proc.send_signal(sig)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(60)
        finally:
            self.reader.join(5)
        return rc

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def rows_of(out_dir, pattern="*.parquet"):
    files = sorted(Path(out_dir).glob(pattern))
    return [row for f in files for row in as_rows(pq.read_table(f))]




# ---------------------------------------------------------------------------------------------
# Crafted traffic: scapy packets written as real capture files, run through the real `dnsprobe read`

NS = 1_000_000_000
T0 = 1_597_844_513_851_855_123  # 2020-08-19 13:41:53.851855123 UTC: sub-microsecond digits, cut in the output
MAC_C, MAC_S = "02:00:00:00:00:0c", "02:00:00:00:00:05"
C4, S4 = "192.0.2.1", "198.51.100.53"
C6, S6 = "2001:db8::1", "2001:db8:53::53"
TTL_C, TTL_S = 61, 250  # client and server TTL / hop limit, different so a swap shows
ETH_IPV4, ETH_IPV6 = 0x0800, 0x86DD
CPORT = 40000


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


def ip_layer(to_server, v6=False, ttl=None, **kw):
    c, s = (C6, S6) if v6 else (C4, S4)
    src, dst = (c, s) if to_server else (s, c)
    ttl = (TTL_C if to_server else TTL_S) if ttl is None else ttl
    if v6:
        return IPv6(src=src, dst=dst, hlim=ttl, **kw)
    return IP(src=src, dst=dst, ttl=ttl, **kw)


def udp_l3(dns, to_server=True, cport=CPORT, port=53, v6=False, ext=None, ttl=None):
    """IP/UDP/DNS bytes; client→server when to_server. ext: extension headers between IP and UDP."""
    ip = ip_layer(to_server, v6, ttl) if v6 else ip_layer(to_server, v6, ttl, flags="DF")
    if ext is not None:
        ip = ip / ext
    udp = UDP(sport=cport, dport=port) if to_server else UDP(sport=port, dport=cport)
    return bytes(ip / udp / Raw(dns))


def ether(l3, vlans=(), tpids=(), pad=True):
    """Ethernet frame around IP bytes; vlans with their tag protocol ids (outermost first).

    Frames shorter than Ethernet's 60-byte minimum are padded as on the wire, with 0xEE bytes so that padding
    taken for payload would show (a bare TCP ACK of 54 bytes gets 6 bytes of it). pad=False: as captured on the
    sending host, where outgoing frames are not padded yet.
    """
    etype = ETH_IPV6 if l3[0] >> 4 == 6 else ETH_IPV4
    types = list(tpids) + [etype]
    frame = Ether(src=MAC_C, dst=MAC_S, type=types[0])
    for i, vid in enumerate(vlans):
        tag = Dot1AD if types[i] == 0x88A8 else Dot1Q
        frame = frame / tag(prio=5, vlan=vid, type=types[i + 1])
    data = bytes(frame / Raw(l3))
    return data + b"\xee" * (60 - len(data)) if pad else data


def udp_frame(dns, **kw):
    return ether(udp_l3(dns, **kw))


def framed(dns):
    """RFC 1035 TCP framing: 2-byte length prefix."""
    return struct.pack("!H", len(dns)) + dns


class TcpConn:
    """Frames of one TCP connection (client port → server port), sequence numbers tracked per side."""

    def __init__(self, cport, isn_c=1000, isn_s=900_000, v6=False, port=53):
        self.cport = cport
        self.port = port
        self.v6 = v6
        self.next = {"c": isn_c, "s": isn_s}

    def frame(self, side, flags, payload=b"", seq=None):
        to_server = side == "c"
        other = "s" if to_server else "c"
        s = self.next[side] if seq is None else seq
        ack = self.next[other] if "A" in flags else 0
        ports = (self.cport, self.port) if to_server else (self.port, self.cport)
        tcp = TCP(sport=ports[0], dport=ports[1], flags=flags, seq=s, ack=ack, window=65535)
        pkt = ip_layer(to_server, self.v6) / tcp
        if payload:
            pkt = pkt / Raw(payload)
        if seq is None:
            self.next[side] = (s + len(payload) + (1 if ("S" in flags or "F" in flags) else 0)) % (1 << 32)
        return ether(bytes(pkt))

    def data(self, side, payload):
        return self.frame(side, "PA", payload)

    def handshake(self, t_syn, t_synack, t_ack):
        return [(t_syn, self.frame("c", "S")), (t_synack, self.frame("s", "SA")), (t_ack, self.frame("c", "A"))]


def write_pcap(path, frames, linktype=1):
    """Nanosecond pcap via scapy; frames: (ts_ns, bytes) or (ts_ns, captured bytes, wire length)."""
    pkts = []
    for ts, data, *wirelen in frames:
        p = Raw(data)
        p.time = Decimal(ts) / NS
        if wirelen:
            p.wirelen = wirelen[0]
        pkts.append(p)
    wrpcap(str(path), pkts, linktype=linktype, nano=True)
    if linktype == 0:  # scapy takes 0 (BSD loopback) for "not given" and writes 1: patch the header
        data = bytearray(path.read_bytes())
        endian = "<" if data[:4] == b"\x4d\x3c\xb2\xa1" else ">"
        data[20:24] = struct.pack(endian + "I", linktype)
        path.write_bytes(bytes(data))
    return path


def write_pcapng_ns(path, frames, linktype=1):
    """pcapng written by hand with if_tsresol=9 (scapy's writer only does microseconds)."""

    def block(btype, body):
        body += bytes(-len(body) % 4)
        return struct.pack("<II", btype, len(body) + 12) + body + struct.pack("<I", len(body) + 12)

    out = block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))
    options = struct.pack("<HHB3x", 9, 1, 9) + struct.pack("<HH", 0, 0)
    out += block(1, struct.pack("<HHI", linktype, 0, 262144) + options)
    for ts, data in frames:
        out += block(6, struct.pack("<IIIII", 0, ts >> 32, ts & 0xFFFFFFFF, len(data), len(data)) + data)
    path.write_bytes(out)
    return path


# --- running dnsprobe -------------------------------------------------------------------------------------------


def probe_run(pcap, out_dir, *extra):
    """`dnsprobe read PCAP -o OUT_DIR EXTRA`; returns (rows, counters).

    Like dnsprobe_read, with the statistics; timestamps as integer nanoseconds (as_rows). No Parquet file → no rows.
    """
    out_dir.mkdir(exist_ok=True)
    run_dnsprobe("read", *(pcap if isinstance(pcap, (list, tuple)) else [pcap]), "-o", out_dir, "-q",
                 "--no-progress", *extra)
    stats_files = list(out_dir.glob("*.stats.json"))
    assert len(stats_files) == 1, stats_files
    counters = json.loads(stats_files[0].read_text())["counters"]
    if not list(out_dir.glob("*.parquet")):
        return [], counters
    return as_rows(read_output(out_dir)), counters


def by_id(rows):
    out = {r["id"]: r for r in rows}
    assert len(out) == len(rows), f"duplicate ids in {rows}"
    return out


def total_len(*frames):
    return sum(len(f) for f in frames)


# --- 1. UDP over IPv4: every column -----------------------------------------------------------------------------




def dns_messages(path):
    """Every DNS message payload of a capture, as `dnsprobe read` finds them."""
    skip_without_shared(path)
    bufs = []

    def grab(buf):
        bufs.append(bytes(buf))
        return parse_message(buf)

    from probe.capture.pcapfile import read_capture
    from probe.config import DecodeConfig
    from probe.decode.dnswire import parse_message
    from probe.decode.packets import PacketDecoder
    from probe.stats import Stats

    decoder = PacketDecoder(DecodeConfig(parser="wire"), (53,), Stats())  # every message through self.parse
    decoder.parse = grab
    for batch in read_capture(path):
        decoder.decode(batch, str(path))
    decoder.flush()
    return bufs




# ---------------------------------------------------------------------------------------------
# dnstap: messages and Frame Streams built with the project's own schema table and codec


def dnstap_frame(mtype="CLIENT_QUERY", identity=b"srv", dns=None, family="INET", protocol="UDP", qaddr=C4, raddr=S4,
                 qport=CPORT, rport=53, ts=T0, embedded=None, **extra):
    """A serialized dnstap message. dns: the DNS message (query_message for a query type, response_message for a
    response type; default a query or response for www.example.com id 1); embedded: a query_message also
    carried in a response; ts: ns, set as query_time or response_time; None omits a field. extra: more
    Message fields by name (a value None clears a field set above)."""
    import ipaddress

    from probe.decode.dnstap_schema import Dnstap
    from probe.decode.dnstap_types import MESSAGE_TYPES

    numbers = {name: n for n, (name, _, _) in MESSAGE_TYPES.items()}
    response = MESSAGE_TYPES[numbers[mtype]][2]
    d = Dnstap(type=1)
    if identity is not None:
        d.identity = identity
    m = d.message
    m.type = numbers[mtype]
    if family is not None:
        m.socket_family = {"INET": 1, "INET6": 2}[family]
    if protocol is not None:
        m.socket_protocol = {"UDP": 1, "TCP": 2, "DOT": 3, "DOH": 4, "DNSCryptUDP": 5, "DNSCryptTCP": 6,
                             "DOQ": 7}[protocol]
    for name, value in (("query_address", qaddr), ("response_address", raddr)):
        if value is not None:
            setattr(m, name, ipaddress.ip_address(value).packed if isinstance(value, str) else value)
    if qport is not None:
        m.query_port = qport
    if rport is not None:
        m.response_port = rport
    half = "response" if response else "query"
    if dns is None:
        dns = r_dns(1) if response else q_dns(1)
    setattr(m, f"{half}_message", dns)
    if embedded is not None:
        m.query_message = embedded
    if ts is not None:
        setattr(m, f"{half}_time_sec", ts // NS)
        setattr(m, f"{half}_time_nsec", ts % NS)
    for name, value in extra.items():
        if value is None:
            m.ClearField(name)
        else:
            setattr(m, name, value)
    return d.SerializeToString()


def fstrm_file(frames, content_type=b"protobuf:dnstap.Dnstap", stop=True):
    """The bytes of a Frame Streams file: START, one data frame per item, STOP."""
    from probe.capture.fstrm import START, STOP, encode_control

    out = [encode_control(START, [content_type] if content_type else [])]
    out += [struct.pack("!I", len(f)) + f for f in frames]
    if stop:
        out.append(encode_control(STOP))
    return b"".join(out)


class FstrmProducer:
    """A dnstap producer on a Unix or TCP socket, by hand: the bidirectional handshake, frames, STOP/FINISH."""

    def __init__(self, address, content_type=b"protobuf:dnstap.Dnstap"):
        import socket as socketlib

        family = socketlib.AF_UNIX if isinstance(address, (str, Path)) else socketlib.AF_INET
        self.sock = socketlib.socket(family, socketlib.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(str(address) if family == socketlib.AF_UNIX else address)
        self.content_type = content_type

    def control(self, ctype, types=()):
        from probe.capture.fstrm import encode_control

        self.sock.sendall(encode_control(ctype, types))

    def answer(self):
        """The next control frame from the reader as (type, [content types]); None when it closed."""
        from probe.capture.fstrm import FrameReader

        reader, data = FrameReader(), b""
        while True:
            control = reader.take([], 1, data_allowed=False) if data else None
            if control is not None:
                return control
            try:
                data = self.sock.recv(4096)
            except ConnectionResetError:
                return None
            if not data:
                return None
            reader.feed(data)

    def handshake(self):
        from probe.capture.fstrm import ACCEPT, READY, START

        self.control(READY, [self.content_type])
        assert self.answer() == (ACCEPT, [self.content_type])
        self.control(START, [self.content_type])
        return self

    def send(self, frames):
        self.sock.sendall(b"".join(struct.pack("!I", len(f)) + f for f in frames))

    def stop(self):
        """STOP; returns the reader's answer (FINISH expected)."""
        from probe.capture.fstrm import STOP

        self.control(STOP)
        return self.answer()

    def close(self):
        self.sock.close()


# ---------------------------------------------------------------------------------------------
# Real DNS servers from Debian (Knot DNS, Knot Resolver, Unbound) in a network namespace with only loopback:
# nothing they send can leave it (no recursion to the internet, even by accident).

SERVER_PACKAGES = {  # binary -> the Debian package that has it (contrib/install-deps.sh installs them)
    "knotd": "knot", "kdig": "knot-dnsutils", "kresd": "knot-resolver", "unbound": "unbound",
    "dnsperf": "dnsperf", "openssl": "openssl", "dnstap": "golang-github-dnstap-golang-dnstap-cli",
}
KNOT_DNSTAP_MODULE = "knot-module-dnstap"


def missing_servers(*binaries):
    """Why tests with these binaries cannot run (a reason for pytest.skip), or None."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        return "needs root and iproute2 (network namespaces)"
    gone = [f"{b} (package {SERVER_PACKAGES.get(b, b)})" for b in binaries if not shutil.which(b)]
    if "knotd" in binaries and not list(Path("/usr/lib").glob("*/knot/modules-*/dnstap.so")):
        gone.append(f"Knot's mod-dnstap (package {KNOT_DNSTAP_MODULE})")
    if gone:
        return "missing: " + ", ".join(gone) + " (contrib/install-deps.sh installs them)"
    return None


class Netns:
    """A network namespace with only loopback up; its name carries the test process id."""

    def __init__(self, tag):
        self.name = f"dnsprobe-{tag}{os.getpid() % 100000}"

    def up(self):
        self.down()
        subprocess.run(["ip", "netns", "add", self.name], check=True, capture_output=True)
        subprocess.run(["ip", "-n", self.name, "link", "set", "lo", "up"], check=True, capture_output=True)
        return self

    def down(self):
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)

    def cmd(self, *args):
        """The command line that runs args in the namespace (ip execs it: its pid is the program's)."""
        return ["ip", "netns", "exec", self.name, *map(str, args)]

    def run(self, *args, timeout=60):
        return subprocess.run(self.cmd(*args), capture_output=True, text=True, timeout=timeout)

    def start(self, log, *args):
        """A server in the foreground, its output to the file log."""
        with open(log, "w") as out:
            return subprocess.Popen(self.cmd(*args), stdout=out, stderr=subprocess.STDOUT)

    def kdig(self, server, name, *opts, port=53, qtype="A"):
        """One query (kdig, no retry); its answer's text, or None when none came."""
        proc = self.run("kdig", f"@{server}", "-p", port, name, qtype, *opts, "+timeout=2", "+retry=0", "+short")
        return proc.stdout.strip() if proc.returncode == 0 and proc.stdout.strip() else None


def stop_servers(procs, timeout=20):
    """SIGTERM them all at once (each sends STOP and flushes its dnstap), then wait; kill what does not stop."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def make_certificate(directory):
    """A throw-away certificate for DoT and DoH (kdig does not verify it)."""
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-days", "2", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.2",
                    "-keyout", f"{directory}/key.pem", "-out", f"{directory}/cert.pem"],
                   check=True, capture_output=True)


EXAMPLE_ZONE = """$ORIGIN example.test.
$TTL 300
@       SOA ns1 hostmaster 1 3600 900 604800 300
@       NS  ns1
ns1     A   127.0.0.1
www     A   192.0.2.1
www     AAAA 2001:db8::1
mail    MX  10 www
big     TXT "{}"
""".format("a" * 200)


def knot_config(d, sink_socket, sink_file, identity):
    """Knot DNS 3.2 for example.test on 127.0.0.1@53 and ::1@53, dnstap of queries and responses (responses
    with their queries) to our socket and to a file at once (two mod-dnstap instances; sink_file None: the
    socket only)."""
    taps = []
    sinks = [(tap_id, sink) for tap_id, sink in (("sock", f"unix:{sink_socket}"), ("file", sink_file)) if sink]
    for tap_id, sink in sinks:
        taps.append(f"""  - id: {tap_id}
    sink: "{sink}"
    identity: "{identity}"
    log-queries: on
    log-responses: on
    responses-with-queries: on""")
    return f"""server:
    rundir: "{d}/knot"
    listen: [ 127.0.0.1@53, ::1@53 ]
database:
    storage: "{d}/knot/db"
log:
  - target: stderr
    any: info
mod-dnstap:
{chr(10).join(taps)}
template:
  - id: default
    storage: "{d}/knot"
    global-module: [ {", ".join(f"mod-dnstap/{tap_id}" for tap_id, _ in sinks)} ]
zone:
  - domain: example.test
    file: "example.test.zone"
"""


def kresd_config(d, sink_socket, identity, names):
    """Knot Resolver 5.6 on 127.0.0.2: DNS on 53, DoT on 853, DoH (doh2) on 443; answers `names` from hints and
    refuses everything else (no module that would reach the internet); dnstap of its clients' messages."""
    hints = "\n".join(f"hints.set('{n} 192.0.2.{i % 200 + 7}')" for i, n in enumerate(names))
    return f"""net.listen('127.0.0.2', 53, {{ kind = 'dns' }})
net.listen('127.0.0.2', 853, {{ kind = 'tls' }})
net.listen('127.0.0.2', 443, {{ kind = 'doh2' }})
net.tls('{d}/cert.pem', '{d}/key.pem')
cache.size = 10 * MB
trust_anchors.remove('.')
for _, m in ipairs({{ 'priming', 'detect_time_skew', 'ta_signal_query', 'ta_update' }}) do
  pcall(modules.unload, m)
end
modules = {{
  'hints > iterate',
  dnstap = {{
    socket_path = '{sink_socket}',
    identity = '{identity}',
    client = {{ log_queries = true, log_responses = true }},
  }},
}}
{hints}
policy.add(policy.suffix(policy.PASS, {{ todname('local.test.') }}))
policy.add(policy.all(policy.DENY_MSG('no internet here')))
"""


def unbound_config(d, sink_socket, identity, names):
    """Unbound 1.17 on 127.0.0.3: DNS on 53, DoT on 853; local data only (never recursion), dnstap of its
    clients' messages."""
    data = "\n".join(f'    local-data: "{n}. A 192.0.2.{i % 200 + 9}"' for i, n in enumerate(names))
    return f"""server:
    username: ""
    chroot: ""
    directory: "{d}/unbound"
    pidfile: ""
    use-syslog: no
    logfile: ""
    verbosity: 1
    num-threads: 2
    interface: 127.0.0.3@53
    interface: 127.0.0.3@853
    tls-port: 853
    tls-service-key: "{d}/key.pem"
    tls-service-pem: "{d}/cert.pem"
    access-control: 127.0.0.0/8 allow
    module-config: "iterator"
    local-zone: "." refuse
    local-zone: "local.test." static
{data}
remote-control:
    control-enable: no
dnstap:
    dnstap-enable: yes
    dnstap-bidirectional: yes
    dnstap-socket-path: "{sink_socket}"
    dnstap-send-identity: yes
    dnstap-identity: "{identity}"
    dnstap-send-version: yes
    dnstap-log-client-query-messages: yes
    dnstap-log-client-response-messages: yes
"""


# The benchmark's standard mix (benchmarks/traffic.py), 20,000 packets: cached by the generator


def bench_mix():
    """The path of the standard mix of 20,000 packets, generated (once, then cached) when missing."""
    path = ROOT / "benchmarks" / "cache" / "standard-n20000-s1-v2.pcap"
    if not path.exists():
        sys.path.insert(0, str(ROOT / "benchmarks"))
        import traffic

        return traffic.generate("standard", 20000, 1)
    return path


def columnar_captures(tmp_path):
    """The captures the columnar pipeline's tests run on beside the shared ones: the sample, the live-capture
    test's generated traffic (written into tmp_path) and the benchmark mix."""
    traffic = tmp_path / "traffic.pcap"
    build_traffic(traffic, 1, 400)
    return SHARED_CAPTURES + [ROOT / "samples" / "sample-mix.pcap.xz", traffic, bench_mix()]


# ---------------------------------------------------------------------------------------------
# Traffic that splits across workers only if the split keeps flows whole


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


# ---------------------------------------------------------------------------------------------
# A classic BPF interpreter: what the kernel does with the programs of probe.capture.bpf


_CBPF_ALU = {0x00: operator.add, 0x10: operator.sub, 0x20: operator.mul, 0x30: operator.floordiv, 0x40: operator.or_,
             0x50: operator.and_, 0x60: operator.lshift, 0x70: operator.rshift, 0x90: operator.mod, 0xA0: operator.xor}


def received(frame):
    """An Ethernet frame as the kernel's receive path holds it when AF_PACKET's fanout runs: an outer 802.1Q or
    802.1ad tag taken off (VLAN untagging), skb->protocol the ethertype after it, the network header just after
    the Ethernet header. Returns (frame without that tag, protocol, network header offset)."""
    etype = int.from_bytes(frame[12:14], "big")
    if etype in (0x8100, 0x88A8) and len(frame) >= 18:
        frame = frame[:12] + frame[16:]
        etype = int.from_bytes(frame[12:14], "big")
    return frame, etype, 14


def run_cbpf(program, packet, protocol=0, net=0, pkttype=0):
    """The return value of the classic BPF program (a list of (code, jt, jf, k)) on the packet bytes, as the
    kernel's interpreter computes it: a load outside the packet ends the program with 0. pkttype, protocol: the
    SKF_AD_PKTTYPE and SKF_AD_PROTOCOL ancillary loads; net: where loads relative to SKF_NET_OFF start."""
    a = x = 0
    mem = [0] * 16
    pc = 0
    mask = 0xFFFFFFFF

    def load(size, at):
        signed = at - (1 << 32) if at & 0x80000000 else at
        if -0x1000 <= signed < 0:  # ancillary data
            return {0: protocol, 4: pkttype}[signed + 0x1000]
        if -0x100000 <= signed < -0x1000:  # SKF_NET_OFF: from the network header
            at = net + signed + 0x100000
        if at < 0 or at + size > len(packet):
            raise IndexError
        return int.from_bytes(packet[at : at + size], "big")

    try:
        while True:
            code, jt, jf, k = program[pc]
            pc += 1
            cls = code & 0x07
            if cls == 0x00:  # BPF_LD
                size = {0x00: 4, 0x08: 2, 0x10: 1}[code & 0x18]
                mode = code & 0xE0
                if mode == 0x20:  # ABS
                    a = load(size, k)
                elif mode == 0x40:  # IND
                    a = load(size, (x + k) & mask)
                elif mode == 0x60:  # MEM
                    a = mem[k]
                elif mode == 0x00:  # IMM
                    a = k
                else:
                    raise ValueError(f"unknown load {code:#x}")
            elif cls == 0x01:  # BPF_LDX
                mode = code & 0xE0
                if mode == 0xA0:  # MSH
                    x = 4 * (load(1, k) & 0x0F)
                elif mode == 0x00:
                    x = k
                elif mode == 0x60:
                    x = mem[k]
                else:
                    raise ValueError(f"unknown ldx {code:#x}")
            elif cls == 0x02:  # BPF_ST
                mem[k] = a
            elif cls == 0x03:  # BPF_STX
                mem[k] = x
            elif cls == 0x04:  # BPF_ALU
                op, src = code & 0xF0, (x if code & 0x08 else k)
                a = (-a if op == 0x80 else _CBPF_ALU[op](a, src)) & mask
            elif cls == 0x05:  # BPF_JMP
                op = code & 0xF0
                src = x if code & 0x08 else k
                if op == 0x00:
                    pc += k
                    continue
                cond = {0x10: a == src, 0x20: a > src, 0x30: a >= src, 0x40: bool(a & src)}[op]
                pc += jt if cond else jf
            elif cls == 0x06:  # BPF_RET
                return a if (code & 0x18) == 0x10 else k
            elif cls == 0x07:  # BPF_MISC
                if (code & 0xF8) == 0x00:  # TAX
                    x = a
                else:
                    a = x
    except IndexError:
        return 0
