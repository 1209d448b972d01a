"""dnstap throughput benchmark: messages per CPU-second, from a file and from a socket, Parquet and C-DNS.

    python benchmarks/dnstap.py                  # the standard mix's 500,000 packets as dnstap messages
    python benchmarks/dnstap.py --quick          # 100,000
    python benchmarks/dnstap.py --packets 1000000 --repeat 5

The messages: the standard mix of benchmarks/traffic.py (the offline benchmark's traffic), each DNS message of
it as the CLIENT_QUERY or CLIENT_RESPONSE a resolver would log (its addresses, ports, transport and capture
time; identity and version set), in a Frame Streams file cached under benchmarks/cache/.

  file     `dnsprobe read FILE` in a child pinned to one CPU, charged its user+system CPU time (as
           benchmarks/offline.py measures), also without its start-up (a run over a 10-message file).
  socket   `dnsprobe capture --dnstap-socket` with its one worker on one CPU, fed by libfstrm's fstrm_replay
           (Debian fstrm-bin) on the other; charged the worker process's CPU time (/proc) from before the
           first message to the last one counted, so the start-up and the final flush are not in it.
  mixed    (--mixed, as root; --mixed-only without the others) a live worker's CPU per DNS message with packets
           alone and with packets and a dnstap socket at once: the standard mix's packets by tcpreplay
           (--mixed-rate pkts/s) on a veth of benchmarks/live.py's testbed, the same messages as dnstap, sent
           once by fstrm_replay (each frame its own write) and once as Knot DNS's libfstrm I/O thread writes
           (`batched`: 50 frames a sendmsg, send_batched); the worker's CPU (/proc) from before the first
           message to the last one counted (issue 30: within 10 % of the packet path).
  stages   in-process, the corpus through each stage alone (process_time), to show where the time goes:
           the file source (reading and Frame Streams splitting), the dnstap decoder in Python and in C, matching,
           building the records, writing them.

Target: at least 300,000 messages per CPU-second per worker. Results: benchmarks/results/dnstap.json and .md.
"""

import argparse
import os
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import offline  # noqa: E402  (benchmarks/ is not a package: the machine description, measured runs, results)
import traffic  # noqa: E402

TARGET = 300_000
CORPUS_VERSION = 1  # part of the cache key: bump when the conversion changes
IDENTITY, VERSION = b"bench-resolver", b"dnsprobe benchmark"
CT = "protobuf:dnstap.Dnstap"
# Knot DNS 3.2's mod-dnstap (libfstrm's I/O thread) under benchmarks/dnstap_loss.py, seen by strace: 50 data frames,
# about 8 KB, a sendmsg(); fstrm_replay sends each frame with its own
FRAMES_PER_WRITE = 50
SENDERS = ("fstrm_replay", "batched")


# ----------------------------------------------------------------------------------------------
# The corpus: the standard mix's DNS messages as a resolver's dnstap
# ----------------------------------------------------------------------------------------------


def corpus(packets, seed=1):
    """(path of the Frame Streams file, number of messages); built once, then cached."""
    pcap = Path(traffic.generate("standard", packets, seed))
    path = pcap.with_name(f"{pcap.stem}.dnstap-v{CORPUS_VERSION}.fstrm")
    count = path.with_suffix(".count")
    if path.exists() and count.exists():
        return path, int(count.read_text())
    from probe.capture.fstrm import START, STOP, encode_control
    from probe.capture.pcapfile import read_capture
    from probe.config import load_config
    from probe.decode.dnstap_schema import Dnstap
    from probe.decode.packets import PacketDecoder
    from probe.model import M
    from probe.stats import Stats

    cfg = load_config()
    decoder = PacketDecoder(cfg.decode, cfg.decode.dns_ports, Stats())
    t0 = time.perf_counter()
    n = 0
    tmp = path.with_suffix(".part")
    with open(tmp, "wb") as out:
        out.write(encode_control(START, [CT.encode()]))
        for batch in read_capture(pcap):
            frames = []
            for m in decoder.decode(batch):
                response = bool(m[M.FLAGS] is not None and m[M.FLAGS] & 0x8000)
                d = Dnstap(type=1, identity=IDENTITY, version=VERSION)
                msg = d.message
                msg.type = 6 if response else 5
                msg.socket_family = 1 if m[M.IPV] == 4 else 2
                msg.socket_protocol = 1 if m[M.PROTO] == 17 else 2
                if response:
                    client, cport, server, sport = m[M.DST], m[M.DPORT], m[M.SRC], m[M.SPORT]
                else:
                    client, cport, server, sport = m[M.SRC], m[M.SPORT], m[M.DST], m[M.DPORT]
                msg.query_address, msg.query_port = client, cport
                msg.response_address, msg.response_port = server, sport
                half = "response" if response else "query"
                setattr(msg, f"{half}_time_sec", m[M.TS_NS] // 1_000_000_000)
                setattr(msg, f"{half}_time_nsec", m[M.TS_NS] % 1_000_000_000)
                setattr(msg, f"{half}_message", m[M.RAW])
                data = d.SerializeToString()
                frames.append(struct.pack("!I", len(data)) + data)
            out.write(b"".join(frames))
            n += len(frames)
        out.write(encode_control(STOP))
    tmp.rename(path)
    count.write_text(str(n))
    print(f"built {path.name}: {n:,} messages in {time.perf_counter() - t0:.1f} s", flush=True)
    return path, n


def head(path, frames, out):
    """The first `frames` data frames of a Frame Streams file, as a file."""
    data = path.read_bytes()
    pos = 4 + 4 + struct.unpack_from("!I", data, 4)[0]
    for _ in range(frames):
        pos += 4 + struct.unpack_from("!I", data, pos)[0]
    out.write_bytes(data[:pos] + b"\0\0\0\0\0\0\0\x04\0\0\0\x03")
    return out


# ----------------------------------------------------------------------------------------------
# Measurements
# ----------------------------------------------------------------------------------------------


def dnsprobe_command():
    """This checkout's dnsprobe, run in it (the console script of an editable install runs the checkout it was
    installed from, which need not be this one), its bytecode written first."""
    offline.compile_bytecode(ROOT)
    return [sys.executable, "-m", "probe"]


def measure_file(path, core, tmp_root, fmt):
    out = Path(tempfile.mkdtemp(prefix="dnsprobe-dnstap-", dir=tmp_root))
    try:
        cmd = [*dnsprobe_command(), "read", str(path), "-o", str(out), "-q", "--no-progress",
               "--format", fmt]
        _, m = offline.run_measured(cmd, core, cwd=ROOT)
        m["records"] = offline.parquet_rows(out) if fmt == "parquet" else None
        return m
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _cpu_of(pid):
    """(user, system) CPU seconds of a process so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def _stats(out):
    import json

    files = list(out.glob("*.stats.json"))
    return json.loads(files[0].read_text()) if files else None


def measure_socket(path, messages, worker_core, sender_core, tmp_root, fmt):
    out = Path(tempfile.mkdtemp(prefix="dnsprobe-dnstap-", dir=tmp_root))
    sock = out / "tap.sock"
    cmd = [*dnsprobe_command(), "capture", "--dnstap-socket", str(sock), "--coremask", hex(1 << worker_core),
           "-o", str(out), "--stats-interval", "0.2", "--no-progress", "-q", "--format", fmt]
    log = open(out / "capture.log", "w")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log)
    try:
        deadline = time.monotonic() + 60
        while (doc := _stats(out)) is None or not doc["workers"]["0"]["pid"] or not sock.exists():
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"dnsprobe capture did not start: {(out / 'capture.log').read_text()}")
            time.sleep(0.05)
        worker = doc["workers"]["0"]["pid"]
        (user0, sys0), t0 = _cpu_of(worker), time.perf_counter()
        sender = subprocess.run(["fstrm_replay", "-t", CT, "-r", str(path), "-u", str(sock)], capture_output=True,
                                text=True, preexec_fn=lambda: os.sched_setaffinity(0, {sender_core}))
        if sender.returncode:
            raise RuntimeError(f"fstrm_replay failed: {sender.stderr}")
        while (doc := _stats(out))["counters"]["dnstap_frames"] < messages:
            if time.monotonic() > deadline + 600:
                raise RuntimeError(f"only {doc['counters']['dnstap_frames']} of {messages} messages arrived")
            time.sleep(0.02)
        (user, system), wall = _cpu_of(worker), time.perf_counter() - t0
        user, system = user - user0, system - sys0
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
        c = _stats(out)["counters"]
        return {"cpu_seconds": round(user + system, 3), "user_seconds": round(user, 3),
                "sys_seconds": round(system, 3), "wall_seconds": round(wall, 3), "records": c["records"],
                "dnstap_frames": c["dnstap_frames"], "dnstap_decode_errors": c["dnstap_decode_errors"]}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(out, ignore_errors=True)


def send_batched(path, sock_path, frames_per_write=FRAMES_PER_WRITE):
    """The corpus to a dnstap socket as libfstrm's I/O thread (Knot DNS) writes it: the bidirectional handshake,
    then frames_per_write data frames a sendmsg(), then STOP and FINISH."""
    import socket

    from probe.capture.fstrm import ACCEPT, FINISH, READY, START, STOP, decode_control, encode_control

    def answer():
        head = sock.recv(8, socket.MSG_WAITALL)
        payload = sock.recv(struct.unpack_from("!I", head, 4)[0], socket.MSG_WAITALL)
        return decode_control(payload)[0]

    data = memoryview(Path(path).read_bytes())
    pos = 8 + struct.unpack_from("!I", data, 4)[0]  # after the file's START
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(sock_path))
    sock.sendall(encode_control(READY, [CT.encode()]))
    if answer() != ACCEPT:
        raise RuntimeError("the reader did not ACCEPT")
    sock.sendall(encode_control(START, [CT.encode()]))
    frames = []
    while (length := struct.unpack_from("!I", data, pos)[0]) or frames:
        if length:
            frames.append(data[pos : pos + 4 + length])
            pos += 4 + length
        if len(frames) == frames_per_write or (frames and not length):
            sent, size = sock.sendmsg(frames), sum(len(f) for f in frames)
            if sent < size:  # a signal in the middle of a blocking write
                sock.sendall(b"".join(frames)[sent:])
            frames = []
    sock.sendall(encode_control(STOP))
    if answer() != FINISH:
        raise RuntimeError("the reader did not FINISH")
    sock.close()


def sender_command(sender, path, sock):
    """The producer of SENDERS that sends the corpus to the socket, as a command."""
    if sender == "fstrm_replay":
        return ["fstrm_replay", "-t", CT, "-r", str(path), "-u", str(sock)]
    return [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(HERE)!r}); import dnstap; "
            f"dnstap.send_batched({str(path)!r}, {str(sock)!r})"]


def measure_mixed(path, messages, packets, rate, sender):
    """Worker CPU per DNS message of `dnsprobe capture` on a veth fed the standard mix's packets, and with a sender
    (of SENDERS, or None) also the dnstap corpus on its socket at the same time."""
    import live

    live.OPTIONS["code_dir"] = ROOT  # this checkout's code, run by `python -m probe` in it
    pcap = Path(traffic.generate("standard", packets, 1))
    out = Path(tempfile.mkdtemp(prefix="dnsprobe-dnstap-mixed-"))
    sock = out / "tap.sock"
    with_dnstap = sender is not None
    extra = ("--stats-interval", "0.2") + (("--dnstap-socket", str(sock)) if with_dnstap else ())
    log = open(out / "capture.log", "w")
    with live.Testbed() as bed:
        proc, worker, _ = live.start_probe(bed, out, log, extra=extra)
        try:
            time.sleep(0.5)  # the worker's start-up over
            (user0, sys0) = _cpu_of(worker)
            gen = subprocess.Popen(live.tcpreplay_command(bed, pcap, rate), stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
            if with_dnstap:
                subprocess.run(sender_command(sender, path, sock), check=True, capture_output=True, cwd=ROOT,
                               preexec_fn=lambda: os.sched_setaffinity(0, {live.GENERATOR_CORE}))
            sent = live.parse_tcpreplay(gen.communicate()[0])["actual_packets"]
            deadline, taps = time.monotonic() + 300, messages if with_dnstap else 0
            while (c := _stats(out)["counters"])["packets"] < sent or c.get("dnstap_frames", 0) < taps:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{c['packets']} of {sent} packets, {c.get('dnstap_frames')} dnstap messages")
                time.sleep(0.05)
            time.sleep(0.5)  # the last batch through matching
            (user, system), c = _cpu_of(worker), _stats(out)["counters"]
        finally:
            live.stop_process(proc)
            log.close()
            shutil.rmtree(out, ignore_errors=True)
    user, system = user - user0, system - sys0
    return {"cpu_seconds": round(user + system, 3), "user_seconds": round(user, 3), "sys_seconds": round(system, 3),
            "dns_messages": c["dns_messages"], "packets": c["packets"], "kernel_drops": c.get("kernel_drops"),
            "dnstap_frames": c.get("dnstap_frames", 0),
            "us_per_message": round((user + system) / c["dns_messages"] * 1e6, 3)}


def mixed(path, messages, packets, rate, repeat):
    """measure_mixed without and with the dnstap socket fed by each of SENDERS, interleaved; the medians and the
    dnstap message's own cost (the difference of the runs' CPU over the dnstap messages), also as the median of
    each round's ratio to the packet's message."""
    runs = {"packets": []} | {f"packets+{sender}": [] for sender in SENDERS}
    for i in range(repeat):
        for sender in (None, *SENDERS):
            label = f"packets+{sender}" if sender else "packets"
            m = measure_mixed(path, messages, packets, rate, sender)
            runs[label].append(m)
            print(f"mixed {label} run {i + 1}/{repeat}: {m['us_per_message']} µs of worker CPU per DNS message "
                  f"({m['cpu_seconds']} s, {m['sys_seconds']} s in the kernel)", flush=True)
    alone = statistics.median(m["cpu_seconds"] for m in runs["packets"])
    per_packet_message = alone / statistics.median(m["dns_messages"] for m in runs["packets"]) * 1e6
    res = {"rate": rate, "runs": runs, "us_per_packet_message": round(per_packet_message, 3), "senders": {}}
    for sender in SENDERS:
        both = runs[f"packets+{sender}"]
        per_dnstap_message = (statistics.median(m["cpu_seconds"] for m in both) - alone) / messages * 1e6
        ratios = [(b["cpu_seconds"] - a["cpu_seconds"]) / messages / (a["cpu_seconds"] / a["dns_messages"])
                  for a, b in zip(runs["packets"], both)]
        res["senders"][sender] = {"us_per_dnstap_message": round(per_dnstap_message, 3),
                                  "dnstap_over_packets": round(per_dnstap_message / per_packet_message, 3),
                                  "dnstap_over_packets_per_round": [round(r, 3) for r in ratios],
                                  "dnstap_over_packets_median_of_rounds": round(statistics.median(ratios), 3)}
    return res


def stages(path, messages):
    """Seconds of CPU per message of each stage alone, in this process."""
    from export.parquet.rows import RowBuilder
    from export.parquet.writer import open_parquet, write_row_groups
    from probe import _records
    from probe.capture.files import open_file_source
    from probe.config import load_config
    from probe.decode.dnstap import DnstapDecoder
    from probe.match import RecordTable
    from probe.stats import Stats

    cfg = load_config()
    out = {}

    def timed(name, fn):
        t0 = time.process_time()
        result = fn()
        out[name] = round((time.process_time() - t0) / messages * 1e6, 3)
        return result

    def read_file(keep):
        """The file source's work as `dnsprobe read` does it: the file read in pieces, batches of 4096 frames taken,
        each dropped once taken (as the pipeline drops it once decoded) unless kept for the stages after."""
        source, batches = open_file_source(path, 4096), []
        while (batch := source.read()) is not None:
            if keep:
                batches.append(batch)
        source.close()
        return batches

    # Timed without keeping the batches: kept, every piece of the file is new memory, whose page faults were about
    # half of what this stage measured (0.108 against 0.048 µs a message), a cost the pipeline does not have.
    timed("frame streams reading and splitting (the file source)", lambda: read_file(False))
    batches = read_file(True)
    decoder = DnstapDecoder(cfg.dnstap, cfg.decode, Stats(), keep_raw=False, python=True)
    timed("dnstap decoder, Python (upb; message tuples)", lambda: [m for b in batches for m in decoder.decode(b)])
    decoder = DnstapDecoder(cfg.dnstap, cfg.decode, Stats(), keep_raw=False)
    msgs = _records.MsgBatch()

    def decode_batches():
        """As the pipeline decodes: each batch into the one MsgBatch, cleared (not one buffer of every record,
        whose growth, copies and page faults were 40 % of what this stage measured: 0.29 against 0.17 µs)."""
        for b in batches:
            msgs.clear()
            decoder.decode_into(b, msgs)

    timed("dnstap decoder, C (message records)", decode_batches)
    msgs.clear()
    for b in batches:  # every record at once, for the stages after (untimed)
        decoder.decode_into(b, msgs)
    table, txs = RecordTable(cfg.match, Stats()), _records.TxBatch()
    timed("matching (message records)", lambda: (table.add(msgs, txs), table.flush(txs)))
    builder = RowBuilder()
    (table,) = timed("Parquet records (Arrow columns, before the writer)", lambda: builder.build_from_records(txs))

    def write():
        with tempfile.TemporaryDirectory(prefix="dnsprobe-dnstap-stage-") as tmp:
            f = SimpleNamespace(pending=([table], []), stream_rows=[table.num_rows, 0])  # (one stream)
            f.writer, sink = open_parquet(Path(tmp) / "stage.parquet", cfg.export)
            write_row_groups(f, cfg.export, True)
            f.writer.close()
            sink.close()

    timed("Parquet writing (the exporter's row groups, sort and compression)", write)
    return out


# ----------------------------------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------------------------------


def summary(samples, messages, startup=None):
    cpu = statistics.median(s["cpu_seconds"] for s in samples)
    res = {"runs": len(samples), "cpu_seconds_median": round(cpu, 3), "messages_per_cpu_second": round(messages / cpu),
           "best": round(messages / min(s["cpu_seconds"] for s in samples)), "samples": samples}
    if startup is not None:
        res["startup_cpu_seconds"] = startup
        res["messages_per_cpu_second_excluding_startup"] = round(messages / (cpu - startup))
    return res


def _throughput_lines(res):
    """The file and socket runs, the target, the stages (none with --mixed-only)."""
    lines = ["", "| input | format | runs | CPU s (median) | messages per CPU-second | best run | excl. start-up |",
             "|---|---|---|---|---|---|---|"]
    for key, r in res["results"].items():
        kind, fmt = key.split("/")
        if "startup_cpu_seconds" in r:
            excl = f"{r['messages_per_cpu_second_excluding_startup']:,} (start-up {r['startup_cpu_seconds']} s)"
        else:
            system = statistics.median(x["sys_seconds"] for x in r["samples"])
            excl = f"(worker CPU only, of which {system} s in the kernel)"
        lines.append(f"| {kind} | {fmt} | {r['runs']} | {r['cpu_seconds_median']} | "
                     f"**{r['messages_per_cpu_second']:,}** | {r['best']:,} | {excl} |")
    lines += ["", f"Target: at least {TARGET:,} messages per CPU-second per worker: "
              + ("met." if all(r["messages_per_cpu_second"] >= TARGET for r in res["results"].values()) else
                 "NOT met everywhere."), "",
              "file: the whole `dnsprobe read` command, user+system CPU of the child pinned to one CPU. socket: the"
              " capture worker's CPU (/proc) while fstrm_replay sends the file on the other CPU; its kernel time is"
              " mostly recv() taking the producer's many small writes (a cost per write: fstrm_replay writes each"
              f" frame alone, libfstrm's I/O thread in Knot DNS {FRAMES_PER_WRITE} a write, as `batched` does).", "",
              "## Where the time goes (in-process, µs per message, one stage alone)", "",
              "| stage | µs per message |", "|---|---|"]
    return lines + [f"| {k} | {v} |" for k, v in res["stages_us_per_message"].items()]


def markdown(res):
    lines = [
        "# dnstap benchmark", "",
        f"Run {res['started']} by `python benchmarks/dnstap.py {' '.join(res['argv'])}`.", "",
        f"Input: {res['messages']:,} dnstap messages (CLIENT_QUERY/CLIENT_RESPONSE) made from "
        f"`{res['pcap']}` ({res['packets']:,} packets of the standard mix), {res['corpus_bytes'] / 1e6:.1f} MB of "
        "Frame Streams.",
    ]
    if res["results"]:
        lines += _throughput_lines(res)
    if "mixed" in res:
        x = res["mixed"]
        lines += ["", f"Live worker, packets at {x['rate']:,} pkts/s alone and with the dnstap socket at once: "
                  f"{x['us_per_packet_message']} µs of worker CPU per packet's DNS message; per dnstap message:", ""]
        for sender, r in x["senders"].items():
            lines.append(f"- sent by {sender}: {r['us_per_dnstap_message']} µs ({r['dnstap_over_packets']}×; each "
                         f"round's ratio {', '.join(map(str, r['dnstap_over_packets_per_round']))})")
    m, c = res["machine"], res["code"]
    lines += ["", "## Machine and code", "",
              f"- CPU: {m['cpu_model']}, {m['logical_cpus']} logical CPUs ({m['usable_cpus']} usable), "
              f"{m['memory_gib']} GiB", f"- kernel {m['kernel']}; {m['python']}; pyarrow {m['pyarrow']}; "
              f"protobuf {res['protobuf']}",
              f"- load average at start {m['load_average_at_start']}, at end {res['load_average_at_end']}",
              f"- dnsprobe {c['dnsprobe_version']} at {c['git_commit']}"
              + (" (with uncommitted changes)" if c["uncommitted_changes_in_probe_or_export"] else ""), ""]
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--packets", type=int, default=500_000, help="packets of the standard mix made into messages")
    ap.add_argument("--quick", action="store_true", help="100,000 packets, 2 runs")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-save", action="store_true", help="print only, do not write benchmarks/results/")
    ap.add_argument("--mixed", action="store_true", help="also a live worker with packets and a dnstap socket (root)")
    ap.add_argument("--mixed-rate", type=int, default=100_000, help="the packets' rate in --mixed (pkts/s)")
    ap.add_argument("--mixed-only", action="store_true", help="--mixed alone: no file, socket or stage measures")
    args = ap.parse_args(argv)
    packets, repeat = (100_000, 2) if args.quick else (args.packets, args.repeat)
    cores = sorted(os.sched_getaffinity(0))
    worker_core, sender_core = cores[-1], cores[0]
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    machine = offline.machine()
    path, messages = corpus(packets)
    res = {"started": started, "argv": argv if argv is not None else sys.argv[1:], "packets": packets,
           "pcap": str(Path(traffic.generate("standard", packets, 1)).relative_to(ROOT)), "messages": messages,
           "corpus_bytes": path.stat().st_size, "results": {}}
    with tempfile.TemporaryDirectory(prefix="dnsprobe-dnstap-bench-") as tmp:
        small = head(path, 10, Path(tmp) / "small.fstrm")
        measures = []
        for fmt in () if args.mixed_only else ("parquet", "cdns"):
            measures.append((f"file/{fmt}", lambda i, f=fmt: measure_file(path, worker_core, tmp, f)))
            if shutil.which("fstrm_replay") and len(cores) > 1:
                measures.append((f"socket/{fmt}", lambda i, f=fmt: measure_socket(path, messages, worker_core,
                                                                                sender_core, tmp, f)))
        samples = {label: [] for label, _ in measures}
        for i in range(repeat):
            for label, measure in measures:
                s = measure(i)
                samples[label].append(s)
                print(f"{label} run {i + 1}/{repeat}: {s['cpu_seconds']:.2f} s CPU "
                      f"({messages / s['cpu_seconds']:,.0f} messages/s)", flush=True)
        for label, runs in samples.items():
            startup = None
            if label.startswith("file/"):
                startup = round(statistics.median(measure_file(small, worker_core, tmp, label.split("/")[1])
                                                  ["cpu_seconds"] for _ in range(3)), 3)
            res["results"][label] = summary(runs, messages, startup)
    if args.mixed or args.mixed_only:
        res["mixed"] = mixed(path, messages, packets, args.mixed_rate, repeat)
    res["stages_us_per_message"] = {} if args.mixed_only else stages(path, messages)
    import google.protobuf

    res.update(machine=machine, code=offline.code(), protobuf=google.protobuf.__version__,
               load_average_at_end=[round(x, 2) for x in os.getloadavg()])
    offline.report("dnstap", res, markdown(res), save=not args.no_save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
