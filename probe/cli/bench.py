"""`dnsprobe bench`: the benchmark suite (benchmarks/suite.py) of the source tree dnsprobe runs from."""

import sys
from pathlib import Path

from probe.cli.output import error


def add_parser(sub):
    sub.add_parser("bench", add_help=False, help="benchmark suite: pkts/s by worker count against dnscap, netsniff-ng "
                   "(source tree only; dnsprobe bench --help)")


def run(argv):
    """`dnsprobe bench ARGS`: benchmarks/suite.py's main(ARGS), from the source tree dnsprobe runs from."""
    suite = Path(__file__).resolve().parents[2] / "benchmarks" / "suite.py"
    if not suite.exists():
        error(f"dnsprobe bench needs the source tree (no {suite}): run it from a git checkout")
        return 2
    sys.path.insert(0, str(suite.parent))
    import suite as bench_suite

    return bench_suite.main(argv)


