"""An opt-in timeline of a run's start (DNSPROBE_TIMELINE=1 in the environment): one line on stderr per point the
command passes, with the time of CLOCK_MONOTONIC, which every process of the machine shares, so that a caller that
notes the clock before starting the command (benchmarks/stage_profile.py) gets each point's offset from its start, the
interpreter's own included. Unset, mark() costs a test."""

import os
import sys
import time

ON = bool(os.environ.get("DNSPROBE_TIMELINE"))


def mark(point):
    """Say on stderr that this process reached `point` now (only with DNSPROBE_TIMELINE set)."""
    if ON:
        sys.stderr.write(f"dnsprobe timeline: {time.monotonic_ns() / 1e6:.3f} ms pid {os.getpid()} {point}\n")
        sys.stderr.flush()
