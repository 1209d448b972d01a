"""What the fuzz harnesses share: running one under atheris, and turning fuzz bytes into frames.

A harness is a program, `python fuzz/fuzz_NAME.py [libFuzzer flags] [corpus dirs]`, run by `make fuzz` with
the extensions built for fuzzing (clang, ASan + UBSan + libFuzzer's coverage, in build/fuzz, loaded through
DNSPROBE_NATIVE_DIR) and atheris' ASan+libFuzzer runtime preloaded. Each one is differential where the stage
has a Python twin: the C result must equal the Python reference, or both must refuse the input the same way;
a difference raises, like a crash. They live outside tests/ because they are not pytest tests: they run for a
time budget under a special runtime, and what they find becomes a test in tests/ with its input.
"""

import os
import struct
import sys
from pathlib import Path

import atheris

ROOT = Path(__file__).resolve().parent.parent

# Coverage of the Python code too (the twins, the pure-Python stages): every module of probe and export that the
# harness imports from here until run() is instrumented by atheris. FUZZ_PYTHON_COVERAGE=0 leaves the Python code
# as it is (C coverage only: several times the executions a second, for a campaign's volume), but in the harnesses
# of stages that have no C at all, whose only guidance it is.
PYTHON_ONLY = {"fuzz_cdns_reader"}
_INSTRUMENT = atheris.instrument_imports(include=["probe", "export"])
if os.environ.get("FUZZ_PYTHON_COVERAGE", "1") != "0" or Path(sys.argv[0]).stem in PYTHON_ONLY:
    _INSTRUMENT.__enter__()
else:
    _INSTRUMENT.__exit__ = lambda *_: None
import probe.native  # noqa: E402,F401 (first: the fuzz build is found through DNSPROBE_NATIVE_DIR)


def run(one_input):
    """Fuzz one_input(data: bytes) with libFuzzer's command line (sys.argv)."""
    _INSTRUMENT.__exit__(None, None, None)
    # libFuzzer runs argv[0] again through the shell for -merge=1 (and -fork, -jobs): the script with this Python,
    # since it is not executable itself.
    atheris.Setup([f"{sys.executable} {sys.argv[0]}", *sys.argv[1:]], one_input)
    atheris.Fuzz()


def typed(value):
    """The value with the type of every part, so that == also compares types (True != 1 here)."""
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(typed(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((typed(k), typed(v)) for k, v in value.items())))
    return (type(value).__name__, value)


def split_frames(data):
    """Frames from fuzz bytes: each a 2-byte big-endian length and that many bytes (the last one takes what
    is left). The corpus seeds are made the same way (fuzz/make_corpus.py), from real captures."""
    frames, pos = [], 0
    while pos < len(data):
        if pos + 2 > len(data):
            break
        (n,) = struct.unpack_from("!H", data, pos)
        frames.append(data[pos + 2 : pos + 2 + n])
        pos += 2 + n
    return frames


def join_frames(frames):
    return b"".join(struct.pack("!H", len(f)) + f for f in frames)


def check(same, what, data, a, b):
    """Raise (a finding, like a crash) when the C result a and the Python result b differ."""
    if not same:
        raise AssertionError(f"{what}: C and Python differ on input {data.hex()}\n C:  {a!r}\n Py: {b!r}")
