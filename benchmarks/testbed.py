"""The veth testbed of the live tests and the benchmarks: a network namespace of our own and veth pairs whose
far ends sit in it. Traffic is sent into the far end (the peer) from inside the namespace and captured on the
near end (the interface) in the root namespace, so nothing leaves this machine's own sandbox.

Names carry the process id, so several runs (tests and benchmarks at once) never meet on a name; everything
is removed by down(), also after a failure (the namespace takes its ends of the pairs with it).
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

RAW_SENDER = r"""
import socket, struct, sys, time
path, iface, pps = sys.argv[1], sys.argv[2], float(sys.argv[3])
data = open(path, "rb").read()
endian = "<" if data[:4] in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
frames, pos = [], 24
while pos + 16 <= len(data):
    caplen = struct.unpack_from(endian + "IIII", data, pos)[2]
    frames.append(data[pos + 16 : pos + 16 + caplen])
    pos += 16 + caplen
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((iface, 0))
t0 = time.perf_counter()
for i, frame in enumerate(frames):
    if pps:
        delay = t0 + i / pps - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
    while True:
        try:
            s.send(frame)
            break
        except OSError:
            time.sleep(0.001)
"""


def _sh(*cmd, check=True):
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


class Testbed:
    """A namespace `dnsprobe-<kind><pid>` and `pairs` veth pairs: iface ↔ peer (and iface2 ↔ peer2 for two).

    kind tells the users apart in `ip link` ("t" for the tests, "b" for the benchmarks); a context manager, or
    up()/down() by hand."""

    __test__ = False  # not a test class, although pytest sees its name in the test modules that import it

    def __init__(self, kind="t", pairs=1):
        tag = os.getpid() % 100000
        self.ns = f"dnsprobe-{kind}{tag}"
        self.iface = f"dp{kind}c{tag}"  # captured by the probe, in the root namespace
        self.peer = f"dp{kind}p{tag}"  # inside the namespace: traffic is sent here
        self.pairs = [(self.iface, self.peer)]
        self.iface2 = self.peer2 = None
        if pairs == 2:
            self.iface2, self.peer2 = f"{self.iface}b", f"{self.peer}b"
            self.pairs.append((self.iface2, self.peer2))

    def __enter__(self):
        self.up()
        return self

    def __exit__(self, *exc):
        self.down()
        return False

    def up(self):
        self.down()
        try:
            _sh("ip", "netns", "add", self.ns)
            for iface, peer in self.pairs:
                _sh("ip", "link", "add", iface, "type", "veth", "peer", "name", peer, "netns", self.ns)
                # No IPv6 autoconfiguration chatter on the pair: only the frames sent cross it.
                _sh("sysctl", "-qw", f"net.ipv6.conf.{iface}.disable_ipv6=1", check=False)
                _sh("ip", "netns", "exec", self.ns, "sysctl", "-qw", f"net.ipv6.conf.{peer}.disable_ipv6=1",
                    check=False)
                # Strict reverse-path filtering on the near end: no route leads back through the pair, so no IP
                # packet sent into it (crafted, hostile) reaches the host's own stack, let alone an answer out.
                _sh("sysctl", "-qw", f"net.ipv4.conf.{iface}.rp_filter=1", check=False)
                _sh("ip", "link", "set", iface, "up")
                _sh("ip", "-n", self.ns, "link", "set", peer, "up")
        except BaseException:
            self.down()
            raise

    def down(self):
        _sh("ip", "netns", "del", self.ns, check=False)  # takes the peers, and so the pairs, with it
        for iface, _ in self.pairs:
            _sh("ip", "link", "del", iface, check=False)

    def rx(self, iface=None):
        """The near end's receive counters (rx_packets, rx_dropped)."""
        base = Path("/sys/class/net") / (iface or self.iface) / "statistics"
        return {k: int((base / k).read_text()) for k in ("rx_packets", "rx_dropped")}

    def send(self, pcap, pps=None, peer=None):
        """Replay a pcap from inside the namespace: pps frames a second, or as fast as possible. With tcpreplay
        when installed (DNSPROBE_TEST_SENDER=raw: always the raw-socket sender above)."""
        peer = peer or self.peer
        if shutil.which("tcpreplay") and os.environ.get("DNSPROBE_TEST_SENDER") != "raw":
            rate = [f"--pps={pps}"] if pps else ["--topspeed"]
            cmd = ["tcpreplay", "-q", f"--intf1={peer}", *rate, str(pcap)]
        else:
            cmd = [sys.executable, "-c", RAW_SENDER, str(pcap), peer, str(pps or 0)]
        proc = subprocess.run(["ip", "netns", "exec", self.ns, *cmd], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"sending {pcap} failed: {proc.stderr}"
