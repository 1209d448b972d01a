"""Scaling past two cores: the bench's core plan for N workers, the model of the expected loss-free rate by worker
count (docs/performance.md, "Scaling model"), and the results in the shape of DNS Probe's table.

    python benchmarks/scaling.py                       # the model's table (the one in docs/performance.md)
    python benchmarks/scaling.py --plan 1,2,4,8,16 --cpus 16   # the bench's core plans on a 16-CPU host

The core plan: one generator process per pair of workers (ceil(N/2) generators), each on a core of its own, and
one worker per core on the others. On the veth testbed the kernel's receive path (veth, the AF_PACKET fanout, the
copy into the ring) runs on the sending core, so a generator core pays the kernel's share of its packets too.
"""

import argparse
import math
import os
import struct
import sys
import zlib
from pathlib import Path

# The model's reference figures (docs/performance.md, "Scaling model"): CPU µs per packet.
WORKER_US = {"parquet": 1.05, "cdns": 0.62, "dpdk-parquet": 1.14}  # a live worker, all of it (suite, 4 Dec 04:42)
GENERATOR_SEND_US = 0.57  # tcpreplay --topspeed on the veth, nothing capturing: 1.75M pkts/s (same run)
# The kernel's delivery (the fanout's demux, the copy into a worker's ring) on the sending core, as a share of the
# sending: tcpreplay's CPU per packet with dnsprobe capturing / without, alternated (5 Dec: 1.60 / 1.33 µs).
KERNEL_DELIVERY_SHARE = 0.2
TRAFGEN_SPEEDUP = 1.5  # trafgen as fast as it goes (TX_RING) against tcpreplay --topspeed on the veth
IMBALANCE = 1.03  # the busiest worker's share × N: the standard mix's 142k flows per 300k packets hashed to 16 workers
CORUN_SLOWDOWN = 0.08  # each worker's cost grows by this when others run beside it (2 reads at once: ×1.85)
DNS_PROBE_PER_THREAD = {"parquet": 487_000, "cdns": 805_000}  # DNS Probe's published table, AF_PACKET


def generators_for(workers):
    """Generator processes for N workers: one per pair of workers."""
    return math.ceil(workers / 2)


def core_plan(workers, usable, generator_core=0, worker_cores=None, generators=None):
    """The cores of an N-worker run: {"workers", "generators", "needs", "generator_cores", "worker_cores",
    "short"}. Generators come first (generator_core, then the lowest usable cores), workers on the rest
    (or on `worker_cores`, the first N of them). short: the cores missing (0: the plan runs here).
    generators: None for ceil(N/2); 0 when the traffic comes from elsewhere (--generator-cmd)."""
    gens = generators_for(workers) if generators is None else generators
    usable = sorted(usable)
    pool = [generator_core] + [c for c in usable if c != generator_core] if generator_core in usable else usable
    if worker_cores:
        wcores = list(worker_cores)[:workers]
        gcores = [c for c in pool if c not in worker_cores][:gens]
        short = max(0, workers - len(wcores)) + max(0, gens - len(gcores))
    else:
        gcores, wcores = pool[:gens], pool[gens:gens + workers]
        short = max(0, workers + gens - len(pool))
    return {"workers": workers, "generators": gens, "needs": workers + gens, "short": short,
            "generator_cores": gcores if not short else [], "worker_cores": wcores if not short else []}


def plan_text(plan, have):
    """One line: the plan's cores, or why it is not run."""
    n, g = plan["workers"], plan["generators"]
    head = f"{n} worker{'s' if n > 1 else ''}, {g} generator{'s' if g != 1 else ''}"
    if plan["short"]:
        return f"{head}: not measured: needs {plan['needs']} cores (this machine has {have})"
    return f"{head}: generator cores {plan['generator_cores']}, worker cores {plan['worker_cores']}"


def predict(workers, worker_us, generators=None, generator_us=GENERATOR_SEND_US * (1 + KERNEL_DELIVERY_SHARE),
            imbalance=IMBALANCE, corun=CORUN_SLOWDOWN):
    """The model's loss-free rate for N workers (pkts/s) and what bounds it:
        workers:    N / (b(N) · s(N) · c_w)     b(1) = 1, b(N>1) = imbalance; s(1) = 1, s(N>1) = 1 + corun
        generators: G / c_g                     G = ceil(N/2) on the testbed (a NIC: its receive queues)
        rate = min(workers, generators)
    worker_us: c_w, a worker's CPU µs per packet alone; generator_us: c_g, a generator core's µs per packet sent
    (its sending, the veth and the kernel's delivery into the fanout's rings). Returns (pkts/s, "workers" or
    "generators")."""
    gens = generators_for(workers) if generators is None else generators
    b, s = (1.0, 1.0) if workers == 1 else (imbalance, 1 + corun)
    by_workers = workers / (b * s * worker_us) * 1e6
    by_generators = gens / generator_us * 1e6 if gens else math.inf
    return (round(min(by_workers, by_generators)), "workers" if by_workers <= by_generators else "generators")


def model_lines(counts=(1, 2, 4, 8, 16)):
    """The model's table for the reference figures (pkts/s): each bound, and the rate expected on the testbed
    with auto's generators (trafgen as fast as it goes) = the lower bound; per worker beside it."""
    c_g = {"tcpreplay": GENERATOR_SEND_US * (1 + KERNEL_DELIVERY_SHARE)}
    c_g["trafgen"] = c_g["tcpreplay"] / TRAFGEN_SPEEDUP
    lines = ["| N workers | G generators | workers' bound: Parquet | C-DNS | generators' bound: tcpreplay | trafgen "
             "| expected on the testbed (auto): Parquet | per worker | C-DNS | per worker |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for n in counts:
        bounds = [predict(n, WORKER_US[f], generators=0)[0] for f in ("parquet", "cdns")]
        gens = [round(generators_for(n) / c_g[g] * 1e6) for g in ("tcpreplay", "trafgen")]
        cells = [f"{b:,}" for b in bounds + gens]
        for f in ("parquet", "cdns"):
            rate, bound = predict(n, WORKER_US[f], generator_us=c_g["trafgen"])
            cells += [f"{rate:,} ({bound})", f"{rate // n:,}"]
        lines.append(f"| {n} | {generators_for(n)} | " + " | ".join(cells) + " |")
    return lines


def row_prediction(res, series):
    """The model's rate for one measured series of the suite, from the run's own figures: c_w is the same row's
    1-worker CPU µs per packet at the fixed rate (the reference when there is none), c_g tcpreplay's measured
    --topspeed cost (auto with trafgen: trafgen's, TRAFGEN_SPEEDUP times less) plus the kernel's delivery.
    None for a row the model does not cover."""
    fmt = series["format"]
    if series["tool"] != "dnsprobe" or fmt not in WORKER_US:
        return None
    one = next((s for s in res["series"] if s["label"] == series["label"] and s["workers"] == 1), None)
    worker_us = ((one or {}).get("fixed") or {}).get("cpu_us_per_packet") or WORKER_US[fmt]
    gens = res.get("generators") or {}
    top = gens.get("tcpreplay_topspeed_pps")
    send_us = 1e6 / top if top else GENERATOR_SEND_US
    if gens.get("requested") == "auto" and gens.get("trafgen"):
        send_us /= TRAFGEN_SPEEDUP
    gen_us = send_us * (1 + KERNEL_DELIVERY_SHARE)
    local = res.get("generator_cmd") is None
    rate, bound = predict(series["workers"], worker_us, None if local else 0, gen_us)
    return {"pps": rate, "bound": bound, "worker_us": worker_us, "generator_us": round(gen_us, 3)}


def format_backend(row_format):
    """'dpdk-parquet' → ('parquet', 'DPDK (net_af_packet)'); 'cdns' → ('cdns', 'AF_PACKET')."""
    if row_format.startswith("dpdk-"):
        return row_format.removeprefix("dpdk-"), "DPDK (net_af_packet)"
    return row_format, "AF_PACKET"


def comparison_lines(res):
    """The measured dnsprobe rows beside DNS Probe's published ones, in its table's columns (threads, pkts/s,
    format), with the model's prediction and measured / model."""
    lines = ["| threads (workers) | pkts/s | pkts/s per thread | format | backend | model (bound) | measured / model "
             "| worker CPU, busiest / mean |", "|---|---|---|---|---|---|---|---|"]
    for s in res["series"]:
        if s["tool"] != "dnsprobe":
            continue
        fmt, backend = format_backend(s["format"])
        pred = s.get("model")
        rate = s["best_rate"]
        shown = (f"{'≥' if s['first_fail'] is None else ''}{rate:,}" if rate else "none")
        # ≥: no rate tried failed, so the measured rate (and its ratio) is a lower bound
        ratio = f"{'≥' if s['first_fail'] is None else ''}{rate / pred['pps']:.2f}" if rate and pred else "—"
        cpu = [c for c in ((s.get("fixed") or {}).get("cpu_seconds_per_worker") or []) if c]
        spread = f"{max(cpu) / (sum(cpu) / len(cpu)):.2f}" if cpu else "—"  # the model's b(N): IMBALANCE
        lines.append(f"| {s['workers']} | {shown} | {rate // s['workers'] if rate else 0:,} | {fmt} | {backend} | "
                     + (f"{pred['pps']:,} ({pred['bound']})" if pred else "—") + f" | {ratio} | {spread} |")
    labels = {s["label"]: s for s in res["series"] if s["tool"] == "dnsprobe"}
    for n in map(int, res.get("not_measured", {})):
        for s in labels.values():  # what the model expects of this host's run, from its 1-worker figures
            pred = row_prediction(res, {**s, "workers": n})
            if pred:
                fmt, backend = format_backend(s["format"])
                lines.append(f"| {n} | not measured | — | {fmt} | {backend} | {pred['pps']:,} ({pred['bound']}) "
                             "| — | — |")
    for fmt, pps in DNS_PROBE_PER_THREAD.items():
        lines.append(f"| DNS Probe, per thread | {pps:,} | {pps:,} | {fmt} | AF_PACKET | — | (published) | — |")
    return lines


def split_pcap(pcap, parts):
    """The pcap split by client into `parts` files (cached beside it): every frame between the same two
    addresses (a transaction, a TCP stream, a datagram's fragments) in the same part, in the file's order.
    One generator sends each part. Returns the part paths (the pcap itself for 1 part)."""
    if parts == 1:
        return [Path(pcap)]
    pcap = Path(pcap)
    paths = [pcap.with_name(f"{pcap.stem}-part{i}of{parts}.pcap") for i in range(parts)]
    if all(p.exists() and p.stat().st_mtime >= pcap.stat().st_mtime for p in paths):
        return paths
    with open(pcap, "rb") as src:
        head = src.read(24)
        endian = "<" if head[:4] in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
        outs = [open(p.with_suffix(f".{os.getpid()}.part"), "wb") for p in paths]  # noqa: SIM115 - closed below
        try:
            for out in outs:
                out.write(head)
            while len(rec := src.read(16)) == 16:
                frame = src.read(struct.unpack_from(endian + "I", rec, 8)[0])
                outs[flow_part(frame, parts)].write(rec + frame)
        finally:
            for out in outs:
                out.close()
    for p in paths:
        os.replace(p.with_suffix(f".{os.getpid()}.part"), p)
    return paths


def flow_part(frame, parts):
    """Which part a frame goes to: a hash of its two IP addresses, in either direction (non-IP frames: part 0)."""
    off = 14
    ethertype = frame[12:14]
    while ethertype in (b"\x81\x00", b"\x88\xa8") and len(frame) >= off + 4:  # VLAN tags
        ethertype, off = frame[off + 2:off + 4], off + 4
    if ethertype == b"\x08\x00":
        a, b = frame[off + 12:off + 16], frame[off + 16:off + 20]
    elif ethertype == b"\x86\xdd":
        a, b = frame[off + 8:off + 24], frame[off + 24:off + 40]
    else:
        return 0
    return zlib.crc32(min(a, b) + max(a, b)) % parts


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan", help="worker counts: print the bench's core plan for each (e.g. 1,2,4,8,16)")
    ap.add_argument("--cpus", type=int, help="plan for a host with this many CPUs (default: this one's usable)")
    args = ap.parse_args(argv)
    if args.plan:
        usable = range(args.cpus) if args.cpus else sorted(os.sched_getaffinity(0))
        for n in map(int, args.plan.split(",")):
            print(plan_text(core_plan(n, usable), len(usable)))
        return 0
    print("\n".join(model_lines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
