"""What `capture.top` costs: the worker's pipeline CPU per packet without and with the counting of `dnsprobe top`.

    python benchmarks/top_cost.py                       # 1,000,000 packets of the standard mix, 16 rounds
    python benchmarks/top_cost.py --packets 100000 --rounds 3

The pipeline a live worker runs (probe.run.pipeline.Pipeline, live, Parquet, no rotation) fed by the file in this
process, as `dnsprobe read` feeds it; with top, an export.live_top.TopCounts counts what it writes (made before the
clock starts, as a worker makes it at its start) and is taken at the end. CPU time of the process (all threads)
over the packets. Rounds interleave the two, in alternating order, after a warm-up run (the imports); the machine
may be shared, so what counts is the median of each round's ratio, beside the medians of each. docs/usage.md gives
the last figures.
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


def run(pcap, top):
    """CPU seconds of the pipeline over the file, with top counting or without."""
    cfg = load_config()
    cfg = dataclasses.replace(cfg, export=dataclasses.replace(cfg.export, rotate_seconds=0))
    counts = TopCounts() if top else None
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
    run(pcap, False)  # (warm-up)
    cpu = {False: [], True: []}
    for r in range(args.rounds):
        for top in (False, True) if r % 2 == 0 else (True, False):
            cpu[top].append(run(pcap, top))
    without, with_top = (statistics.median(cpu[top]) / args.packets * 1e6 for top in (False, True))
    ratio = statistics.median(t / n for t, n in zip(cpu[True], cpu[False]))
    print(f"without top {without:.3f} µs/packet, with {with_top:.3f} ({(with_top / without - 1) * 100:+.1f} %); "
          f"median of the rounds' ratios {(ratio - 1) * 100:+.1f} % ({args.rounds} rounds)")


if __name__ == "__main__":
    main()
