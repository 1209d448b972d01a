"""Write the seed corpus (fuzz/corpus/<harness>/) from the bundled sample and the tests' oracle
captures (tests/data): frames and messages split out of real traffic, a few of each kind, kept small.
Run from the repository root: python fuzz/make_corpus.py. (Seeds are named by their content's hash.)"""

import hashlib
import lzma
import random
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

from probe.capture.pcapfile import read_capture
from probe.config import DecodeConfig
from probe.decode.link import LINK_NAMES
from probe.decode.packets import PacketDecoder
from probe.model import M
from probe.stats import Stats

ROOT = Path(__file__).resolve().parent.parent

DATA = ROOT / "tests" / "data"  # the tests' oracle captures (tests/data/README.md)
CAPTURES = [ROOT / "samples" / "sample-mix.pcap.xz"] + sorted(
    p for p in [*(DATA / "dns-probe" / "test_pcaps").glob("*.pcap*"), *(DATA / "compactor").glob("*.pcap*")]
    if not p.name.endswith(".info")
)
OUT = ROOT / "fuzz" / "corpus"


def join_frames(frames):
    """The frames as the harnesses split them (fuzz/harness.py split_frames)."""
    return b"".join(struct.pack("!H", len(f)) + f for f in frames)


def save(harness, data):
    d = OUT / harness
    d.mkdir(parents=True, exist_ok=True)
    (d / hashlib.sha1(data).hexdigest()[:16]).write_bytes(data)


def column_address(packed):
    """An address as the src column writes it."""
    import socket

    return socket.inet_ntop(socket.AF_INET6 if len(packed) == 16 else socket.AF_INET, packed)


def raw_bytes(path):
    data = path.read_bytes()
    return lzma.decompress(data) if path.suffix == ".xz" else data


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    rng = random.Random(18)
    rng21 = random.Random(21)  # (the later harnesses' own: the seeds of the others stay as they were)
    ethernet = sorted(LINK_NAMES).index(1)
    seeds = 0
    for path in CAPTURES:
        if not path.exists():
            continue
        frames = [(lt, f) for b in read_capture(path, 4096) for lt, f in ((b.linktype, f) for f in b.data)]
        eth = [f for lt, f in frames if lt == 1]
        save("fuzz_pcap", raw_bytes(path)[:2048])  # the header and the first records (the last one cut)
        for _ in range(6):  # runs of consecutive frames: queries with their responses, TCP streams
            if eth:
                i = rng.randrange(len(eth))
                run = join_frames(eth[i : i + rng.randint(2, 24)])
                save("fuzz_cdnsblock", run)
                save("fuzz_parquetrec", bytes([seeds % 2]) + run)  # (the answers column on or off)
                match = [rng.randrange(256) for _ in range(3)]
                save("fuzz_matchrec", bytes(match[:1] + [match[1] | 0x80] + match[2:]) + run)  # decoded messages
                # Frames packed or as lists, the raw message kept or not, the IP lists on or off, VLAN offload.
                mode = (0x08 if seeds % 2 else 0) | (0x10 if seeds % 3 else 0) | (0x20 if seeds % 4 == 0 else 0)
                mode |= 0x40 if seeds % 5 == 0 else 0
                save("fuzz_decoderec", bytes([ethernet | mode]) + join_frames(eth[i : i + 3]))
                seeds += 1
        decoder = PacketDecoder(DecodeConfig(parser="wire"), (53,), Stats())
        decoded = [m for b in read_capture(path, 4096) for m in decoder.decode(b, str(path))]
        for raw in rng.sample([m[M.RAW] for m in decoded], min(12, len(decoded))):
            save("fuzz_dnswire", raw)
            save("fuzz_answers", join_frames([raw]))
        # QNAMEs and client addresses as the qname and src columns write them (ECS options too), a line each.
        names = sorted({m[M.QNAME] for m in decoded if m[M.QNAME]})
        clients = sorted({c for m in decoded for c in (column_address(m[M.SRC]), column_address(m[M.DST]))})
        for _ in range(3):
            if names:
                save("fuzz_psl", bytes([rng21.randrange(256)]) + "\n".join(rng21.sample(names, min(8, len(names))))
                     .encode("utf-8", "surrogateescape"))
            if clients:
                sample = rng21.sample(clients, min(6, len(clients)))
                save("fuzz_lookup", bytes([rng21.randrange(256)]) + "\n".join(sample + [sample[0] + "/24"]).encode())
    # C-DNS files: the sample's first frames written by our own writer, and compactor's gold file.
    with tempfile.TemporaryDirectory() as tmp:
        eth = [f for b in read_capture(CAPTURES[0], 4096) for f in b.data][:40]
        pcap = Path(tmp) / "small.pcap"
        with open(pcap, "wb") as fh:
            fh.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
            for i, f in enumerate(eth):
                fh.write(struct.pack("<IIII", 1_700_000_000 + i, 0, len(f), len(f)) + f)
        subprocess.run([sys.executable, "-m", "probe", "read", pcap, "-o", tmp, "-q", "--no-progress", "--format",
                        "cdns"], check=True, cwd=ROOT)
        for f in Path(tmp).glob("*.cdns"):
            save("fuzz_cdns_reader", f.read_bytes())
    gold = DATA / "compactor" / "gold.cbor.xz"
    save("fuzz_cdns_reader", lzma.decompress(gold.read_bytes())[:30000])  # preamble and first block(s)
    for _ in range(8):
        save("fuzz_tcpstream", bytes(rng.randrange(256) for _ in range(6 * rng.randint(2, 20))))
    # The Public Suffix List's hard cases: wildcards, exceptions, IDNs in both forms, case, empty labels.
    save("fuzz_psl", "\x00\nwww.City.Kawasaki.JP\na.b.kawasaki.jp\nxn--p1ai\nпример.РФ\nİ.com.tr\na..b\n.\n\x00"
         .encode())
    save("fuzz_lookup", b"\x10\n::ffff:8.8.4.4\n2001:4860:4860::8888\n8.8.8.8/24\n\n\x00\n08.8.8.8\n1.1.1.1")
    save("fuzz_answers", join_frames(text_floods()))
    # Space-Saving: k 1 to 16, a cycle of k + 1 items (every update evicts), equal weights (ties), skipped items.
    for k in (0, 2, 15):
        save("fuzz_topk", bytes([k]) + bytes(b for i in range(40) for b in (i % (k + 2) | (0x80 if i % 9 == 8 else 0),
                                                                             (0, 1, 7)[i % 3])))
    new_harnesses(rng)


def text_floods():
    """Responses whose text passes the answers caps (export/parquet/answers.py): CNAMEs whose owner and target
    point to a 255-byte name of zero bytes (2008 bytes of text for 14), and an NSEC naming every type of 2
    windows."""
    qname = b"".join(bytes([n]) + bytes(n) for n in (63, 63, 63, 61)) + b"\x00"
    rr = b"\xc0\x0c\x00\x05\x00\x01\x00\x00\x00\x3c\x00\x02\xc0\x0c"
    flood = b"\x12\x34\x81\x80\x00\x01\x00\x50" + bytes(4) + qname + b"\x00\x05\x00\x01" + rr * 80
    rdata = b"\x00" + b"".join(bytes([w, 32]) + b"\xff" * 32 for w in (1, 2))
    nsec_rr = b"\x00\x00\x2f\x00\x01\x00\x00\x00\x3c" + struct.pack("!H", len(rdata)) + rdata
    nsec = bytes(6) + b"\x00\x01" + bytes(4) + nsec_rr
    return [flood, nsec]


def transfers_seed():
    """fuzz/crafted.py messages that open zone transfers beyond match.max_transfers (2), one transfer kept young by
    its next message while another is evicted, one opened again under its key, one expiring: random seeds open
    transfers rarely and two at once hardly ever."""
    def message(ident, response, step=1):  # template 0, port 0, client 0, UDP; AXFR, the last answer an A
        return bytes([0, ident, 0, response, 0, step, 12, 0])

    order = [(0, 0), (0, 1), (1, 0), (1, 1), (0, 1), (2, 0), (2, 1), (2, 0), (2, 1), (0, 1, 255), (0, 1, 255), (1, 1)]
    return bytes([7, 15, 4]) + b"".join(message(*m) for m in order)  # 8 ms timeout, one message a batch


def new_harnesses(rng):
    """Seeds of the columnar path's harnesses and of the dnstap and ring ones, from the seeds above."""
    msgs = [f.read_bytes() for f in sorted((OUT / "fuzz_dnswire").iterdir())]
    for i in range(0, len(msgs), 8):
        save("fuzz_decoderec", bytes([0x80 | 0x18]) + join_frames(msgs[i : i + 8]))
    for _ in range(6):  # (fuzz/crafted.py: queries, most followed by their response, some repeated)
        steps = []
        for _ in range(rng.randint(4, 30)):
            q = [rng.randrange(256) for _ in range(8)]
            q[3] &= ~3
            steps.append(q)
            if rng.random() < 0.7:
                steps.append(q[:3] + [q[3] | 1] + q[4:])
        crafted = bytes(rng.randrange(256) for _ in range(3)) + bytes(b for s in steps for b in s)
        save("fuzz_matchrec", crafted)
        save("fuzz_parquetrec", bytes([2 | rng.randrange(2)]) + crafted[3:])
    save("fuzz_matchrec", transfers_seed())
    import fuzz_dnstap  # (its valid frames)

    for frame in fuzz_dnstap.corpus():
        save("fuzz_dnstap", frame)
    eth = [f for b in read_capture(CAPTURES[0], 4096) for f in b.data if len(f) < 200]
    for k in range(6):
        save("fuzz_ring", ring_seed(rng, eth, k))
    dpdk_seeds()


def dpdk_seeds():
    """fuzz_dpdk's input (fuzz/fuzz_dpdk.py): real frames as mbuf chains of 1 to 4 segments, most with pkt_len what
    the segments hold, some with it above or below, some with their VLAN tag taken off."""
    rng = random.Random(32)
    eth = [f for b in read_capture(CAPTURES[0], 4096) for f in b.data]
    for _ in range(8):
        out = bytearray([rng.randrange(256)])
        for f in rng.sample(eth, rng.randint(1, 6)):
            nseg, mode = rng.choice((1, 1, 2, 3, 4)), rng.choice((0, 0, 0, 1, 2))
            vlan = rng.random() < 0.3
            change = rng.randrange(4096) if vlan else rng.randrange(1, 64)
            out += struct.pack("!BHH", (nseg - 1) << 4 | mode << 2 | vlan, change, len(f))
            out += bytes(rng.randrange(256) for _ in range(nseg - 1)) + f
        save("fuzz_dpdk", bytes(out))


def ring_seed(rng, frames, k):
    """fuzz_ring's input: 3 bytes (block count, ready blocks, frame limit), then blocks of 512 bytes laid out as
    the kernel lays out TPACKET_V3 blocks (tests/capture/test_ring.py), holding real frames."""
    block, blocks = 512, k % 4 + 1
    ring = bytearray(block * blocks)
    for b in range(blocks):
        off, pos, num = b * block, 48, 0
        while True:
            data, mac = rng.choice(frames), 66
            size = (mac + len(data) + 15) & ~15
            if pos + size > block:
                break
            vlan = 0x10 if rng.random() < 0.3 else 0
            struct.pack_into("<IIIIIIHHIIH", ring, off + pos, size, 1_700_000_000 + k, rng.randrange(10**9),
                             len(data), len(data), vlan, mac, mac, 0, rng.randrange(4096), 0)
            ring[off + pos + mac : off + pos + mac + len(data)] = data
            pos, num = pos + size, num + 1
        struct.pack_into("<IIIIQ", ring, off + 8, 1, num, 48, pos, 100 + b)
    return bytes([blocks - 1 | (k % blocks) << 2, 0xFF, 3]) + bytes(ring)


if __name__ == "__main__":
    main()
