"""`dnsprobe read --workers N` / `--coremask`: the union of the workers' transactions is exactly the one-worker
output (order aside) and the counters add up to its counters (output files aside), on every oracle capture, the
sample, the live-capture traffic, the benchmark mix and traffic that only a flow-keeping split reads right
(IPv6 extension headers, fragments of both families in both directions, TCP).

The split: each frame goes to the worker its IP address pair hashes to (include/wire.h flow_hash): every worker
gets its share and no frame is in two shares; the hash is the same both ways and for every fragment."""

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from scapy.layers.inet import IP, UDP, fragment
from scapy.layers.inet6 import IPv6, IPv6ExtHdrFragment, fragment6
from scapy.layers.l2 import Dot1Q, Ether
from scapy.packet import Raw
from support.captures import bench_mix, build_traffic
from support.data import DATA_CAPTURES, ROOT
from support.dnsprobe import as_rows, probe_run, read_output, run_dnsprobe
from support.frames import C4, MAC_C, MAC_S, NS, S4, T0, TcpConn, ether, framed, udp_frame, write_pcap
from support.messages import q_dns, r_dns

from probe import _records
from probe.capture.pcapfile import read_capture
from probe.decode import _decoderec

CORES = len(os.sched_getaffinity(0))


@pytest.fixture(scope="module")
def captures(traffic_pcap, edge_pcap):
    return DATA_CAPTURES + [traffic_pcap, edge_pcap[0], bench_mix()]


def rows_and_counters(pcap, out, *extra):
    """The records of `dnsprobe read PCAP` (as a sorted list) and its counters but for the number of files; pcap
    None: of the run already made into out."""
    if pcap is None:
        counters = json.loads(next(out.glob("*.stats.json")).read_text())["counters"]
        rows = as_rows(read_output(out)) if list(out.glob("*.parquet")) else []
    else:
        rows, counters = probe_run(pcap, out, *extra)
    return sorted(map(repr, (sorted(r.items()) for r in rows))), {k: v for k, v in counters.items() if k != "files"}


@pytest.fixture(scope="module")
def one_worker(tmp_path_factory):
    """rows_and_counters of a one-worker read of a capture, made once per capture for the module."""
    made = {}

    def of(path):
        if path not in made:
            made[path] = rows_and_counters(path, tmp_path_factory.mktemp("one") / path.name)
        return made[path]

    return of


@pytest.mark.parametrize("workers", [2, 3])
def test_union_equals_one_worker(captures, one_worker, workers, tmp_path):
    if workers > CORES:
        pytest.skip(f"needs {workers} cores (read refuses more workers than cores)")
    for path in captures:
        label = f"{path.name} x{workers}"
        one = one_worker(path)
        many = rows_and_counters(path, tmp_path / f"{path.name}-{workers}", "--workers", str(workers))
        assert many[0] == one[0], label
        assert many[1] == one[1], label


def timeout_traffic(path):
    """Flows whose outcome hangs on when timeouts fire (with TIMEOUTS: query 5 s, fragments 5 s, TCP idle 3 s), all
    between the client C4 and the server S4, among 14 s of other clients' transactions (one every 100 ms) whose
    address pairs hash to other workers, with 2 and with 3: the worker of the timed flows decodes no message of its
    own for seconds, and has only the other frames' times to fire its timeouts by.

    A late response (after the query timeout); a fragmented response whose last fragments come after the fragment
    timeout; an idle TCP stream; and a zone transfer whose second message comes just after the query timeout has
    closed the transfer (a single worker's clock, its other flows' messages, passed that time; a worker running on
    its own messages' time would still take the message into the transfer)."""
    from scapy.layers.dns import DNS, DNSQR, DNSRR, DNSRRSOA

    frames = []

    def at(seconds, frame):
        frames.append((T0 + int(seconds * NS), frame))

    timed = _decoderec.flow_hash(udp_frame(q_dns(1)), 1)
    others = []
    for i in range(5000):
        query = ether(bytes(IP(src=f"10.77.{i // 250}.{i % 250 + 1}", dst="192.0.2.53") / UDP(sport=3000, dport=53)))
        if all(_decoderec.flow_hash(query, 1) % n != timed % n for n in (2, 3)):
            others.append(f"10.77.{i // 250}.{i % 250 + 1}")
    for i, client in enumerate(others[:140]):
        at(i / 10, ether(bytes(IP(src=client, dst="192.0.2.53") / UDP(sport=3000 + i, dport=53) / Raw(q_dns(i)))))
        at(i / 10 + 0.002, ether(bytes(IP(src="192.0.2.53", dst=client) / UDP(sport=53, dport=3000 + i)
                                       / Raw(r_dns(i)))))
    at(0.01, udp_frame(q_dns(1, "late.example"), cport=41000))
    at(6.2, udp_frame(r_dns(1, "late.example"), to_server=False, cport=41000))
    at(0.03, udp_frame(q_dns(2, "frag.example", "TXT"), cport=41001))
    big = DNS(id=2, qr=1, rd=1, ra=1, qd=DNSQR(qname="frag.example", qtype="TXT"),
              an=[DNSRR(rrname="frag.example", type="TXT", rdata=["x" * 200]) for _ in range(6)])
    first, *rest = fragment(IP(src=S4, dst=C4, id=4242) / UDP(sport=53, dport=41001) / big, fragsize=600)
    at(0.04, ether(bytes(first)))
    for k, f in enumerate(rest):
        at(6.005 + k / 10000, ether(bytes(f)))
    zone = TcpConn(41002)
    for t, f in zone.handshake(1.0, 1.001, 1.002):
        at(t, f)
    soa = DNSRRSOA(rrname="zone.example", mname="ns.zone.example", rname="h.zone.example", serial=1)
    a = DNSRR(rrname="www.zone.example", type="A", rdata="192.0.2.7")
    axfr = DNSQR(qname="zone.example", qtype="AXFR")
    at(1.003, zone.data("c", framed(bytes(DNS(id=3, qd=axfr)))))
    at(1.004, zone.data("s", framed(bytes(DNS(id=3, qr=1, aa=1, qd=axfr, an=[soa, a])))))
    at(6.15, zone.data("s", framed(bytes(DNS(id=3, qr=1, aa=1, qd=axfr, an=[a, a, soa])))))
    idle = TcpConn(41003)
    for t, f in idle.handshake(2.0, 2.001, 2.002):
        at(t, f)
    at(2.003, idle.data("c", framed(q_dns(4, "idle.example"))))
    at(6.5, idle.data("s", framed(r_dns(4, "idle.example"))))
    frames.sort(key=lambda f: f[0])
    write_pcap(path, frames)


TIMEOUTS = ("--set", "run.batch_size=3", "--set", "match.query_timeout=5", "--set", "decode.fragment_timeout=5",
            "--set", "decode.tcp_idle_timeout=3")


def test_timeouts_fire_as_in_one_worker(tmp_path):
    """Every worker runs its decoder's and its matcher's clock on every frame it reads, its own or not, and expires
    on every batch (batches end where one worker's do): the timeouts fire at one worker's times, so the timed flows
    of timeout_traffic come out as with one worker."""
    pcap = tmp_path / "timeouts.pcap"
    timeout_traffic(pcap)
    rows, counters = probe_run(pcap, tmp_path / "first", *TIMEOUTS)
    timed = sorted((r["qname"], r["query_present"], r["response_present"]) for r in rows if r["src"] == C4)
    assert timed == [("frag.example", True, False), ("idle.example", True, True), ("late.example", False, True),
                     ("late.example", True, False), ("zone.example", False, True), ("zone.example", True, True)]
    assert counters["fragments_dropped"] == 3 and counters["zone_transfer_messages"] == 0
    one = rows_and_counters(pcap, tmp_path / "one", *TIMEOUTS)
    for workers in range(2, min(CORES, 3) + 1):  # (read refuses more workers than cores)
        many = rows_and_counters(pcap, tmp_path / f"w{workers}", "--workers", str(workers), *TIMEOUTS)
        assert many == one, f"{workers} workers"


def test_edge_traffic_splits_and_still_matches(edge_pcap, tmp_path):
    pcap = edge_pcap[0]
    out = tmp_path / "out"
    rows, counters = probe_run(pcap, out, "--workers", "2")
    assert counters["matched"] == len(rows) == 270 and counters["fragments_reassembled"] == 150
    written = {p.name.split(".w")[1][0] for p in out.glob("*.parquet")}
    assert written == {"0", "1"}  # both workers had flows
    doc = json.loads(next(out.glob("*.stats.json")).read_text())
    assert len(doc["files_written"]) == 2 and sorted(doc["workers"]) == ["0", "1"]
    for name, total in doc["counters"].items():  # each worker's part, and they add up
        assert sum(w["counters"][name] for w in doc["workers"].values()) == total, name
    assert all(w["cpu_seconds"] > 0 and len(w["files_written"]) == 1 for w in doc["workers"].values())


def test_coremask_pins_one_worker_per_core(tmp_path):
    pcap = tmp_path / "t.pcap"
    build_traffic(pcap, 1, 50)
    rows, _ = probe_run(pcap, tmp_path / "out", "--coremask", "0x1")
    assert len(rows) == 50
    if len(os.sched_getaffinity(0)) >= 2:
        rows, _ = probe_run(pcap, tmp_path / "two", "--coremask", "0x3")
        doc = json.loads(next((tmp_path / "two").glob("*.stats.json")).read_text())
        assert len(rows) == 50 and doc["coremask"] == "0x3"
        assert {w["core"] for w in doc["workers"].values()} == {0, 1}
    proc = run_dnsprobe("read", pcap, "-o", tmp_path / "out", "--coremask", "0x0", check=False)
    assert proc.returncode == 2 and "run.coremask" in proc.stderr


def read_with_stdin(inputs, out, stdin, *extra):
    """`dnsprobe read INPUTS` with stdin's bytes; returns (exit status, error lines, rows and counters)."""
    out.mkdir()
    cmd = [sys.executable, "-m", "probe", "read", *map(str, inputs), "-o", str(out), "-q", "--no-progress", *extra]
    proc = subprocess.run(cmd, cwd=ROOT, input=stdin, capture_output=True)
    lines = sorted(line for line in proc.stderr.decode().splitlines() if line.strip())
    return proc.returncode, lines, rows_and_counters(None, out)


def test_compressed_files_and_pipes_are_read_once(tmp_path):
    """Parts of one capture as a plain file (each worker opens it), xz, gzip and zstd files and a pipe (the parent
    decompresses each once and copies it to the workers): 2 workers give the records and counters of one."""
    frames = [(b.ts_ns[i], b.data[i]) for b in read_capture(bench_mix(), 2000) for i in range(len(b))]
    assert len(frames) == 20000
    parts = [write_pcap(tmp_path / f"part{k}.pcap", frames[k * 4000 : (k + 1) * 4000]) for k in range(5)]
    for part, tool in zip(parts[1:4], ("xz", "gzip", "zstd")):
        subprocess.run([tool, "-q", "-1", str(part)], check=True)
    inputs = [parts[0], f"{parts[1]}.xz", f"{parts[2]}.gz", f"{parts[3]}.zst", "/dev/stdin"]
    stdin = parts[4].read_bytes()
    one = read_with_stdin(inputs, tmp_path / "one", stdin)
    assert one[0] == 0 and one[2][1]["packets"] == 20000, one[1]
    two = read_with_stdin(inputs, tmp_path / "two", stdin, "--workers", "2")
    assert two == one


def test_damaged_inputs_are_reported_once(tmp_path):
    """A cut xz file (the parent's decompressor fails), a gzip file with a corrupt record (each worker stops there
    and closes its pipe) and a pipe cut in a record, among good inputs: each error once, with one worker's message,
    and the records read before each problem, as with one worker."""
    frames = [(b.ts_ns[i], b.data[i]) for b in read_capture(bench_mix(), 2000) for i in range(len(b))]
    parts = [write_pcap(tmp_path / f"part{k}.pcap", frames[k * 4000 : (k + 1) * 4000]) for k in range(5)]
    subprocess.run(["xz", "-1", str(parts[1])], check=True)
    xz = Path(f"{parts[1]}.xz")
    xz.write_bytes(xz.read_bytes()[: xz.stat().st_size // 2])
    data = bytearray(parts[2].read_bytes())
    at = 24 + 2000 * 16 + sum(len(f) for _, f in frames[8000:10000]) + 8  # the 2000th record's captured length
    data[at : at + 4] = b"\xff\xff\xff\x7f"
    parts[2].write_bytes(bytes(data))
    subprocess.run(["gzip", "-1", str(parts[2])], check=True)
    inputs = [parts[0], xz, f"{parts[2]}.gz", parts[3], "/dev/stdin"]
    stdin = parts[4].read_bytes()[:-50]
    one = read_with_stdin(inputs, tmp_path / "one", stdin)
    assert one[0] == 1 and len(one[1]) == 3, one[1]
    for problem in ("pcap.xz: decompression failed", "pcap.gz: corrupt record", "/dev/stdin: truncated record"):
        assert sum(problem in line for line in one[1]) == 1, (problem, one[1])
    two = read_with_stdin(inputs, tmp_path / "two", stdin, "--workers", "2")
    assert two == one


def test_shares_partition_every_batch(captures):
    for path in captures:
        for batch in read_capture(path, 1000):
            frames = batch.packed
            if frames is None:
                frames = _records.Frames()
                for ts, wl, data in zip(batch.ts_ns, batch.wirelen, batch.data):
                    frames.add(data, ts, wl)
            for n in (2, 3):
                shares = [_decoderec.select_share(frames, batch.linktype, k, n).lists() for k in range(n)]
                assert sum(len(s[0]) for s in shares) == len(frames)
                got = sorted((t, d) for s in shares for t, d in zip(s[0], s[2]))
                assert got == sorted(zip(*frames.lists()[::2]))


def test_a_tag_the_kernel_took_off_counts_in_the_share():
    """A ring frame whose VLAN tag the kernel took off (kept beside it) goes to the share of the whole frame: with
    three 0x9100 tags (one more than the hash passes) that is worker 0's, not the share of the frame without it."""
    frames, whole = _records.Frames(), []
    for i in range(64):
        ip = IP(src=f"10.0.0.{i}", dst="192.0.2.1") if i % 2 else IPv6(src=f"2001:db8::{i}", dst="2001:db8::53")
        tags = Dot1Q(vlan=i) if i % 4 < 2 else Dot1Q(type=0x9100) / Dot1Q(type=0x9100) / Dot1Q()
        frame = bytes(Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02", type=0x9100) / tags / ip / UDP())
        frames.add(frame[:12] + frame[16:], i, len(frame) - 4, struct.unpack("!I", frame[12:16])[0])
        whole.append(frame)
    assert any(_decoderec.flow_hash(f, 1) == 0 != _decoderec.flow_hash(f[:12] + f[16:], 1) for f in whole)
    for k in range(3):
        want = [i for i, f in enumerate(whole) if _decoderec.flow_hash(f, 1) % 3 == k]
        assert _decoderec.select_share(frames, 1, k, 3).lists()[0] == want


def test_hash_is_symmetric_and_fragments_share_it():
    def h(pkt):
        return _decoderec.flow_hash(bytes(Ether(src=MAC_C, dst=MAC_S) / pkt), 1)  # (Ether() looks the MAC up)

    for a, b, ip in (("10.0.0.1", "192.0.2.9", IP), ("2001:db8::1", "2001:db8:53::53", IPv6)):
        there, back = h(ip(src=a, dst=b) / UDP(sport=5353, dport=53)), h(ip(src=b, dst=a) / UDP(sport=53, dport=5353))
        assert there == back != 0
        big = ip(src=b, dst=a) / UDP(sport=53, dport=5353) / Raw(b"x" * 3000)
        frags = fragment(big, 1000) if ip is IP else fragment6(IPv6(src=b, dst=a) / IPv6ExtHdrFragment() / big[1], 1280)
        assert len(frags) > 1 and {h(f) for f in frags} == {there}
    assert _decoderec.flow_hash(bytes(Ether(type=0x0806) / Raw(b"\0" * 28)), 1) == 0  # not IP
    assert _decoderec.flow_hash(b"\0" * 12 + struct.pack("!H", 0x0800) + b"\x45" + b"\0" * 10, 1) == 0  # cut


def test_dnstap_files_go_to_one_worker_each(tmp_path):
    """pcap and dnstap files mixed: each dnstap file is read by one worker (the hash of its name), so its queries
    and responses meet; the union is the one-worker output and a dnstap file's error is reported once."""
    from support.dnsprobe import as_rows, read_output
    from support.dnstap import dnstap_frame, fstrm_file
    from support.frames import NS, T0
    from support.messages import q_dns, r_dns

    from probe.run.offline import dnstap_worker

    pcap = tmp_path / "t.pcap"
    build_traffic(pcap, 1, 60)
    names = []
    for k in range(4):
        frames = []
        for i in range(20):
            qid, ts = 100 * k + i, T0 + i * NS // 10
            client = f"192.0.2.{10 + i}"
            frames += [dnstap_frame("CLIENT_QUERY", dns=q_dns(qid), ts=ts, qaddr=client),
                       dnstap_frame("CLIENT_RESPONSE", dns=r_dns(qid), ts=ts + 500_000, qaddr=client)]
        path = tmp_path / f"server{k}.dnstap"
        path.write_bytes(fstrm_file(frames, stop=k != 3)[: -3 if k == 3 else None])  # the last one cut
        names.append(path)
    assert len({dnstap_worker(str(p), 2) for p in names}) == 2  # both workers have some
    results = []
    for out, extra in ((tmp_path / "one", ()), (tmp_path / "two", ("--workers", "2"))):
        out.mkdir()
        proc = run_dnsprobe("read", pcap, *names, "-o", out, "-q", "--no-progress", *extra, check=False)
        assert proc.returncode == 1 and proc.stderr.count("server3.dnstap: truncated") == 1, proc.stderr
        doc = json.loads(next(out.glob("*.stats.json")).read_text())
        assert len(doc["errors"]) == 1 and "server3.dnstap" in doc["errors"][0]
        rows = sorted(map(repr, (sorted(r.items()) for r in as_rows(read_output(out)))))
        results.append((rows, {k: v for k, v in doc["counters"].items() if k != "files"}))
    assert results[1] == results[0]
    assert results[0][1]["matched"] == 60 + 80 - 1  # (the cut file loses its last response)


@pytest.mark.parametrize("whom, piped", [("group", False), ("parent", True)])
def test_an_interrupt_writes_what_was_read(tmp_path, whom, piped):
    """^C from a terminal (every process of the group; the inputs files) or SIGINT to the command alone (the input a
    pipe that would not end): each worker stops reading, writes what it read and reports it; exit status 130, no
    .part file left, the counters add up to the records written."""
    import signal
    import threading
    import time

    out = tmp_path / "out"
    out.mkdir()
    mix = bench_mix().read_bytes()
    inputs = ["/dev/stdin"] if piped else [bench_mix()] * 200
    cmd = [sys.executable, "-m", "probe", "read", *map(str, inputs), "-o", str(out), "-q", "--no-progress",
           "--workers", "2"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)

    def endless():  # the mix's records again and again, until the reader closes the pipe
        try:
            proc.stdin.write(mix)
            while True:
                proc.stdin.write(mix[24:])
        except (BrokenPipeError, ValueError):
            pass

    writer = threading.Thread(target=endless, daemon=True)
    if piped:
        writer.start()
    deadline = time.monotonic() + 60
    while len(list(out.glob("*.part"))) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "finished before it could be interrupted"
    if whom == "group":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGINT)
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 130, stderr
    if piped:
        writer.join(timeout=10)
    assert [line for line in stderr.splitlines() if line.strip()] == [
        "dnsprobe: error: interrupted; writing what was decoded"], stderr
    assert not list(out.glob("*.part")) and len(list(out.glob("*.parquet"))) == 2
    rows, counters = rows_and_counters(None, out)
    assert 0 < counters["packets"] < 200 * 20000 and len(rows) == counters["records"]
