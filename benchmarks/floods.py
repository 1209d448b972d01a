"""Resource bounds under attack: floods at the highest rate the testbed reaches into `dnsprobe capture` with 2
workers, normal traffic mixed in. Reports each worker's peak RSS, the evictions counted and how much of the
normal traffic was exported.

    python benchmarks/floods.py                                   # the three floods, 60 s each
    python benchmarks/floods.py --seconds 10 --kinds queries      # one, shorter
    python benchmarks/floods.py --set match.max_pending=100000    # with other bounds
    python benchmarks/floods.py --table --set match.max_pending=1000  # the transfers flood in-process only

Kinds (trafgen configurations below; trafgen sends as fast as it can from inside the namespace):
  queries    unanswered UDP queries, random DNS ID, source address (198.18.0.0/16) and port, to 198.19.0.53
  tcp        TCP connections that never finish a message: a SYN, a segment starting a message of 65,535 bytes
             and two segments ahead of a gap, 4 frames a connection (sequential ports and addresses)
  fragments  first fragments (MF, offset 0) of UDP datagrams that never complete, random IP ID and source
  transfers  UDP pairs of an AXFR query and a response to it that does not close the transfer (its last answer
             is not an SOA): each opens a zone transfer (sequential client addresses and ports)

The transfers flood is also measured in-process (--table, and with each live run of it): TRANSFER_PAIRS pairs of
its frames, decoded, through the production matcher at once (well within match.query_timeout): the transfers
it then holds, the memory they take (RSS growth) and what one batch without messages costs after them (its
expiry: the median of 200).

Normal traffic: the benchmark's standard mix (benchmarks/traffic.py, 20,000 packets of queries and their
responses, UDP and TCP, from other addresses) replayed once by tcpreplay across the flood's duration. Its
records are those whose addresses are not the flood's; the share exported is against `dnsprobe read` of the
same file (frames the kernel dropped while its ring was full are lost to both flood and normal traffic, and
counted in kernel_drops).

Peak RSS: VmHWM of each worker, read just before the capture is stopped (after the workers caught up), and
VmRSS sampled every 0.2 s. Must run as root (namespace, veth pair, capture); trafgen and tcpreplay from Debian
(contrib/install-deps.sh). Nothing is sent outside the namespace; the testbed is removed at the end.
Results: benchmarks/results/floods.json and floods.md.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))  # this tree's probe, in-process (the transfers table)

import offline  # noqa: E402  (benchmarks/ is not a package): machine(), dnsprobe_command()
import traffic  # noqa: E402
from testbed import Testbed  # noqa: E402

# The flood's addresses only: RFC 2544's benchmarking range 198.18.0.0/15, as the text of its addresses.
FLOOD_PREFIXES = ("198.18.", "198.19.")
_ETH = "eth(da=02:00:00:00:00:05, sa=02:00:00:00:00:0c)"
_QUERY = ('drnd(2), 0x01, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 5, "flood", 7, "example", 3, "com", '
          "0, 0x00, 0x01, 0x00, 0x01")
_TCP_SRC = "ipv4(sa=198.18.0.7, sa[2]=dinc(), sa[3]=dinc(1, 254), da=198.19.0.53, ttl=64)"
_TCP_SEG = "tcp(sp=dinc(1024, 65535), dp=53, seq={seq}, {flags})"
_XFR_QUESTION = '5, "flood", 7, "example", 3, "com", 0, 0x00, 0xfc, 0x00, 0x01'  # AXFR
_XFR_CLIENT = "198.18.0.1, {end}[2]=dinc(), {end}[3]=dinc(1, 254)"
TRAFGEN = {
    "queries": f"{{ {_ETH}, ipv4(sa=198.18.0.1, sa[2]=drnd(), sa[3]=drnd(), da=198.19.0.53, ttl=64),"
               f" udp(sp=drnd(1024, 65535), dp=53), {_QUERY} }}",
    # (every template's counters step once per round, so the 4 frames of a round share addresses and ports)
    "tcp": "\n".join([
        f"{{ {_ETH}, {_TCP_SRC}, {_TCP_SEG.format(seq=1000, flags='syn')} }}",
        f"{{ {_ETH}, {_TCP_SRC}, {_TCP_SEG.format(seq=1001, flags='ack, aseq=1')}, 0xff, 0xff, fill(0x41, 1398) }}",
        f"{{ {_ETH}, {_TCP_SRC}, {_TCP_SEG.format(seq=5001, flags='ack, aseq=1')}, fill(0x42, 1400) }}",
        f"{{ {_ETH}, {_TCP_SRC}, {_TCP_SEG.format(seq=9001, flags='ack, aseq=1')}, fill(0x43, 1400) }}",
    ]),
    "fragments": f"{{ {_ETH}, ipv4(id=drnd(), mf, sa=198.18.0.1, sa[2]=drnd(), sa[3]=drnd(), da=198.19.0.53,"
                 f" ttl=64), udp(sp=drnd(1024, 65535), dp=53, len=3008, csum=0), fill(0x44, 1400) }}",
    # The query, then its response: an A record as the last answer, so the transfer stays open.
    "transfers": "\n".join([
        f"{{ {_ETH}, ipv4(sa={_XFR_CLIENT.format(end='sa')}, da=198.19.0.53, ttl=64), udp(sp=dinc(1024, 65535), dp=53),"
        f" 0x58, 0x46, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, {_XFR_QUESTION} }}",
        f"{{ {_ETH}, ipv4(sa=198.19.0.53, da={_XFR_CLIENT.format(end='da')}, ttl=64), udp(sp=53, dp=dinc(1024, 65535)),"
        f" 0x58, 0x46, 0x84, 0x00, 0x00, 0x01, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, {_XFR_QUESTION},"
        " 0xc0, 0x0c, 0x00, 0x01, 0x00, 0x01, 0x00, 0x00, 0x0e, 0x10, 0x00, 0x04, 192, 0, 2, 1 }",
    ]),
}
TRANSFER_PAIRS = 200_000
# The counter of each flood's evictions, and the configuration keys that bound what it makes a worker hold.
EVICTIONS = {"queries": ("match_evicted", "query_only"), "tcp": ("tcp_evicted", "tcp_dropped_bytes"),
             "fragments": ("fragments_dropped",), "transfers": ("transfers_evicted", "matched")}
BOUNDS = {"queries": ("match.max_pending", "match.max_pending_per_key", "match.query_timeout"),
          "tcp": ("decode.tcp_max_streams", "decode.tcp_max_bytes", "decode.tcp_max_ooo_bytes",
                  "decode.tcp_max_ooo_segments", "decode.tcp_idle_timeout"),
          "fragments": ("decode.fragment_max_datagrams", "decode.fragment_max_bytes", "decode.fragment_timeout"),
          "transfers": ("match.max_transfers", "match.max_pending", "match.query_timeout")}


def write_config(kind, path):
    Path(path).write_text(f"/* {kind} flood: benchmarks/floods.py */\n{TRAFGEN[kind]}\n")
    return path


def flood_pcap(kind, frames, path):
    """`frames` frames of a flood written to a pcap by trafgen itself (what the tests replay)."""
    with tempfile.TemporaryDirectory(prefix="dnsprobe-flood-") as tmp:
        cfg = write_config(kind, Path(tmp) / f"{kind}.cfg")
        subprocess.run(["trafgen", "-i", str(cfg), "-o", str(path), "-n", str(frames), "--cpus", "1"],
                       check=True, capture_output=True, timeout=120)
    return path


def transfer_table(sets, pairs=TRANSFER_PAIRS):
    """The transfers flood in-process: `pairs` of its query and response frames (retimed 1 µs apart), decoded and
    matched by the production pipeline's decoder and matcher (RecordTable), then batches without messages."""
    import yaml

    from export import reads_raw
    from probe import _records
    from probe.capture.pcapfile import read_capture
    from probe.config import load_config
    from probe.decode.ipfilter import IpFilter
    from probe.decode.packets import PacketDecoder
    from probe.match import RecordTable
    from probe.model import FrameBatch
    from probe.stats import Stats

    cfg = load_config(overrides={k: yaml.safe_load(v) for k, v in (kv.split("=", 1) for kv in sets)})
    stats = Stats()
    decoder = PacketDecoder(cfg.decode, cfg.decode.dns_ports, stats, IpFilter(cfg.filter), keep_raw=reads_raw(cfg))
    table, msgs, out = RecordTable(cfg.match, stats), _records.MsgBatch(), _records.TxBatch()
    with tempfile.TemporaryDirectory(prefix="dnsprobe-flood-") as tmp:
        frames = [f for b in read_capture(flood_pcap("transfers", 2 * pairs, Path(tmp) / "t.pcap")) for f in b.data]
    ts = 1_700_000_000 * 10**9
    rss = proc_rss(os.getpid())[0]
    for i in range(0, len(frames), 4096):
        part = frames[i : i + 4096]
        batch = FrameBatch(1, [ts + (i + k) * 1000 for k in range(len(part))], [len(f) for f in part], part)
        msgs.clear()
        decoder.decode_into(batch, msgs, "flood")
        table.add(msgs, out, batch.ts_ns[-1])
        out.clear()
    held_mib = proc_rss(os.getpid())[0] - rss
    msgs.clear()
    now, costs = ts + len(frames) * 1000, []
    for _ in range(200):
        t0 = time.perf_counter()
        table.add(msgs, out, now)
        costs.append(time.perf_counter() - t0)
    return {"pairs": pairs, "open_transfers": table.open_transfers, "rss_growth_mib": round(held_mib, 1),
            "empty_batch_ms": round(sorted(costs)[len(costs) // 2] * 1000, 3),
            "counters": {k: stats.as_dict()[k] for k in ("matched", "transfers_evicted", "query_only",
                                                          "match_evicted", "response_only")},
            "bounds": bounds("transfers", sets)}


def proc_rss(pid):
    """(VmRSS, VmHWM) of a process in MiB, or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    vals = {line[:6]: int(line.split()[1]) / 1024 for line in text.splitlines() if line[:6] in ("VmRSS:", "VmHWM:")}
    return (vals["VmRSS:"], vals["VmHWM:"]) if len(vals) == 2 else None


def stats_doc(out_dir):
    for f in out_dir.glob("*.stats.json"):
        try:
            return json.loads(f.read_text())
        except (OSError, ValueError):
            pass
    return None


def wait_caught_up(out_dir, timeout=120):
    """Wait until every frame the kernel passed was read or counted as dropped (the workers caught up)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        doc = stats_doc(out_dir)
        c = doc and doc["counters"]
        if c and c["packets"] + c["kernel_drops"] >= c["kernel_received"]:
            return doc
        time.sleep(0.25)
    return stats_doc(out_dir)


def read_normal_rows(out_dir):
    """(records read back, the normal traffic's records as dicts): the flood's millions of rows are counted and
    left in Arrow, only the normal ones become Python objects."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    total, rows = 0, []
    for f in sorted(out_dir.glob("*.parquet")):
        t = pq.read_table(f, columns=["src", "dst", "query_present", "response_present"])
        total += t.num_rows
        flood = None
        for column in ("src", "dst"):
            for prefix in FLOOD_PREFIXES:
                hit = pc.fill_null(pc.starts_with(t[column], prefix), False)
                flood = hit if flood is None else pc.or_(flood, hit)
        rows += t.filter(pc.invert(flood)).to_pylist()
    return total, rows


def retimed(pcap, pps, path):
    """The capture with its frames `1/pps` seconds apart: as tcpreplay --pps sends it, so that `dnsprobe read`
    of this file sees the gaps the live probe sees (a response sent more than match.query_timeout after its
    query is two records in both)."""
    import dpkt

    with open(pcap, "rb") as fin, open(path, "wb") as fout:
        reader = dpkt.pcap.Reader(fin)
        writer = dpkt.pcap.Writer(fout, linktype=reader.datalink(), nano=True)
        for i, (_, frame) in enumerate(reader):
            writer.writepkt(frame, ts=1_700_000_000 + i / pps)
    return path


def normal_expected(pcap):
    with tempfile.TemporaryDirectory(prefix="dnsprobe-flood-") as tmp:
        subprocess.run([*offline.dnsprobe_command(), "read", str(pcap), "-o", tmp, "-q", "--no-progress"], check=True,
                       cwd=ROOT)
        return stats_doc(Path(tmp))["counters"]


def run_flood(bed, kind, seconds, sets, normal, normal_pps):
    with tempfile.TemporaryDirectory(prefix="dnsprobe-flood-") as tmp:
        tmp = Path(tmp)
        out = tmp / "out"
        out.mkdir()
        cfg = write_config(kind, tmp / f"{kind}.cfg")
        cmd = [*offline.dnsprobe_command(), "capture", "-i", bed.iface, "--coremask", "0x3", "-o", str(out),
               "--no-progress", "-q", "--stats-interval", "0.5", *(a for kv in sets for a in ("--set", kv))]
        log = open(tmp / "probe.log", "w")
        probe = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)
        try:
            pids = start_pids(probe, out)
            peak = {pid: 0.0 for pid in pids}
            sampling = threading.Event()

            def sample():
                while not sampling.wait(0.2):
                    for pid in pids:
                        m = proc_rss(pid)
                        if m:
                            peak[pid] = max(peak[pid], m[0])

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            base = {pid: proc_rss(pid)[0] for pid in pids}
            normal_proc = subprocess.Popen(["ip", "netns", "exec", bed.ns, "tcpreplay", "-q", f"--intf1={bed.peer}",
                                            f"--pps={normal_pps}", str(normal)], stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL)
            t0 = time.monotonic()
            gen = subprocess.run(["ip", "netns", "exec", bed.ns, "timeout", "-s", "INT", str(seconds), "trafgen",
                                  "-i", str(cfg), "-o", bed.peer, "--cpus", "1"], capture_output=True, text=True)
            sent_s = time.monotonic() - t0
            normal_proc.wait(max(5, seconds))
            doc = wait_caught_up(out)
            sampling.set()
            sampler.join()
            hwm = {pid: proc_rss(pid)[1] for pid in pids}
            probe.send_signal(signal.SIGTERM)
            rc = probe.wait(120)
        finally:
            if probe.poll() is None:
                os.killpg(probe.pid, signal.SIGKILL)
                probe.wait()
            log.close()
        doc = stats_doc(out)
        rows_read_back, normal_rows = read_normal_rows(out)
        c = doc["counters"]
        return {
            "kind": kind, "seconds": round(sent_s, 1), "exit": rc, "trafgen": gen.stderr.strip().splitlines()[-3:],
            "offered_pps": round((c["kernel_received"]) / sent_s),
            "counters": {k: c[k] for k in ("kernel_received", "kernel_drops", "packets", "dns_messages", "records",
                                           "matched", "query_only", "match_evicted", "tcp_segments", "tcp_streams",
                                           "tcp_evicted", "tcp_dropped_bytes", "fragments", "fragments_dropped",
                                           "transfers_evicted", "worker_restarts", "lost_in_dead_worker")},
            "workers": [{"pid": pid, "rss_start_mib": round(base[pid], 1), "rss_peak_sampled_mib": round(peak[pid], 1),
                         "vmhwm_mib": round(hwm[pid], 1)} for pid in pids],
            "normal_records": len(normal_rows),
            "normal_matched": sum(1 for r in normal_rows if r["query_present"] and r["response_present"]),
            "rows_read_back": rows_read_back,
            "bounds": bounds(kind, sets),
            **({"table": transfer_table(sets)} if kind == "transfers" else {}),
        }


def bounds(kind, sets):
    """The values of the configuration keys that bound what this flood makes a worker hold (YAML, as --set)."""
    import yaml

    from probe.config import load_config

    cfg = load_config(overrides={k: yaml.safe_load(v) for k, v in (kv.split("=", 1) for kv in sets)})
    return {key: getattr(getattr(cfg, key.split(".")[0]), key.split(".")[1]) for key in BOUNDS[kind]}


def start_pids(probe, out):
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if probe.poll() is not None:
            raise RuntimeError(f"dnsprobe capture exited {probe.returncode} at start")
        doc = stats_doc(out)
        workers = doc and doc.get("workers")
        if workers and all(w.get("pid") and w.get("alive") for w in workers.values()):
            return sorted(w["pid"] for w in workers.values())
        time.sleep(0.05)
    raise RuntimeError("dnsprobe capture did not start within 60 s")


def markdown(res):
    lines = [f"# Floods ({res['when']})", "", f"Machine: {res['machine']['cpu_model']}, "
             f"{res['machine']['usable_cpus']} CPUs; settings: {' '.join(res['sets']) or 'defaults'}.", "",
             "| flood | s | offered pkts/s | kernel drops | evictions | peak RSS per worker (MiB, VmHWM) | start RSS "
             "| normal records exported | of which matched | restarts |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["runs"]:
        c = r["counters"]
        ev = ", ".join(f"{k} {c[k]:,}" for k in EVICTIONS[r["kind"]] if k in c)
        lines.append(f"| {r['kind']} | {r['seconds']} | {r['offered_pps']:,} | {c['kernel_drops']:,} | {ev} | "
                     f"{' / '.join(str(w['vmhwm_mib']) for w in r['workers'])} | "
                     f"{' / '.join(str(w['rss_start_mib']) for w in r['workers'])} | "
                     f"{r['normal_records']:,} of {res['normal_expected']:,} | {r['normal_matched']:,} of "
                     f"{res['normal_expected_matched']:,} | "
                     f"{c['worker_restarts']} |")
    for r in res["runs"]:
        if "table" in r:
            t = r["table"]
            bounds_text = ", ".join(f"{k}={v}" for k, v in t["bounds"].items())
            lines += ["", f"Transfers flood in-process ({t['pairs']:,} pairs, {bounds_text}): {t['open_transfers']:,} "
                      f"open, RSS +{t['rss_growth_mib']} MiB, a batch without messages {t['empty_batch_ms']} ms."]
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--kinds", default="queries,tcp,fragments,transfers")
    ap.add_argument("--table", action="store_true", help="the transfers flood in-process only (no capture)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="configuration for the capture")
    ap.add_argument("--no-save", action="store_true", help="print only, do not write benchmarks/results")
    args = ap.parse_args(argv)
    if args.table:
        print(json.dumps(transfer_table(args.set)))
        return
    if os.geteuid() != 0:
        ap.error("must run as root (network namespace, veth pair, capture)")
    normal_pps = max(1, int(20000 / args.seconds))
    with tempfile.TemporaryDirectory(prefix="dnsprobe-flood-") as tmp:
        normal = retimed(traffic.generate("standard", 20000, 1), normal_pps, Path(tmp) / "normal.pcap")
        run_all(args, normal, normal_pps)


def run_all(args, normal, normal_pps):
    expected = normal_expected(normal)
    res = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": offline.machine(), "sets": args.set,
           "normal_expected": expected["records"], "normal_expected_matched": expected["matched"], "runs": []}
    with Testbed("f") as bed:
        for kind in args.kinds.split(","):
            r = run_flood(bed, kind, args.seconds, args.set, normal, normal_pps)
            res["runs"].append(r)
            print(json.dumps(r), flush=True)
    offline.report("floods", res, markdown(res), save=not args.no_save)


if __name__ == "__main__":
    main()
