"""What `capture.top` costs: the worker's pipeline CPU per packet with capture.top false (nothing counted), on-demand
while no `dnsprobe top` asks (the counter attached, not counting), and true (counting).

    python benchmarks/top_cost.py                       # 1,000,000 packets of the standard mix, 16 rounds
    python benchmarks/top_cost.py --packets 100000 --rounds 3

The pipeline a live worker runs (probe.run.pipeline.Pipeline, live, Parquet, no rotation) fed by the file in this
process, as `dnsprobe read` feeds it; on-demand and true attach an export.live_top.TopCounts as a worker does (made
before the clock starts, as at a worker's start; true's counts taken at the end). CPU time of the process (all
threads) over the packets. Rounds interleave the three, in an order rotating each round, after a warm-up run (the
imports); the machine may be shared, so what counts is the median of each round's ratio to false, beside the
medians of each. docs/usage.md gives the last figures.
"""

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import traffic  # noqa: E402  (benchmarks/ is not a package)

from export.live_top import TopCounts  # noqa: E402
from probe.config import load_config  # noqa: E402
from probe.run.offline import _feed_files  # noqa: E402
from probe.run.pipeline import Pipeline  # noqa: E402

MODES = ("false", "on-demand", "true")


def run(pcap, mode):
    """CPU seconds of the pipeline over the file with capture.top `mode` (on-demand: nobody asks)."""
    cfg = load_config()
    cfg = dataclasses.replace(cfg, export=dataclasses.replace(cfg.export, rotate_seconds=0))
    counts = None if mode == "false" else TopCounts(counting=mode == "true")
    with tempfile.TemporaryDirectory() as out:
        start = time.process_time()
        pipeline = Pipeline(cfg, out, 0, live=True)
        if counts is not None:
            pipeline.count_dns(counts)
        _feed_files(pipeline, cfg, [str(pcap)])
        pipeline.finish()
        if counts is not None:
            counts.take()
        return time.process_time() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packets", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=16)
    args = parser.parse_args(argv)
    pcap = traffic.generate("standard", args.packets, 1)
    run(pcap, "false")  # (warm-up)
    cpu = {mode: [] for mode in MODES}
    for r in range(args.rounds):
        for mode in MODES[r % 3:] + MODES[:r % 3]:
            cpu[mode].append(run(pcap, mode))
    base = statistics.median(cpu["false"]) / args.packets * 1e6
    line = [f"false {base:.3f} µs/packet"]
    for mode in MODES[1:]:
        each = statistics.median(cpu[mode]) / args.packets * 1e6
        ratio = statistics.median(t / n for t, n in zip(cpu[mode], cpu["false"]))
        spread = sorted(t / n for t, n in zip(cpu[mode], cpu["false"]))
        line.append(f"{mode} {each:.3f} ({(each / base - 1) * 100:+.1f} %; median of the rounds' ratios "
                    f"{(ratio - 1) * 100:+.1f} %, quartiles {(spread[len(spread) // 4] - 1) * 100:+.1f} to "
                    f"{(spread[3 * len(spread) // 4] - 1) * 100:+.1f} %)")
    print("; ".join(line) + f" ({args.rounds} rounds)")


if __name__ == "__main__":
    main()
