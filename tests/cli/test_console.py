"""The command's entry point (probe.console): dnsprobe runs without NumPy, which pyarrow would import when installed."""

import os
import subprocess
import sys

from support.data import ROOT
from support.dnsprobe import read_output

SAMPLE = ROOT / "samples" / "sample-mix.pcap.xz"

# A NumPy that leaves a mark when imported, then fails as an absent one would.
FAKE_NUMPY = """import os
open(os.environ["NUMPY_MARK"], "w").close()
raise ImportError("the test stand-in for NumPy")
"""


def _env(tmp_path):
    (tmp_path / "site" / "numpy").mkdir(parents=True)
    (tmp_path / "site" / "numpy" / "__init__.py").write_text(FAKE_NUMPY)
    mark = tmp_path / "numpy-imported"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(ROOT)]), "NUMPY_MARK": str(mark)}
    return env, mark


def test_the_command_does_not_import_numpy(tmp_path):
    env, mark = _env(tmp_path)
    # The stand-in is the NumPy pyarrow finds: importing pyarrow alone imports it.
    subprocess.run([sys.executable, "-c", "import pyarrow.parquet"], env=env, check=True, cwd=tmp_path)
    assert mark.exists()
    mark.unlink()
    out = tmp_path / "out"
    out.mkdir()
    for command in ([sys.executable, "-m", "probe"], [sys.executable, "-c", "from probe.console import main; main()"]):
        proc = subprocess.run([*command, "read", str(SAMPLE), "-o", str(out), "-q", "--workers", "2"], env=env,
                              cwd=tmp_path, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        assert not mark.exists(), f"{command} imported NumPy"
    assert read_output(out).num_rows > 0


def test_bench_keeps_numpy_importable(tmp_path):
    # Its plot draws with matplotlib, which needs NumPy.
    env, mark = _env(tmp_path)
    code = "import sys; sys.argv = ['dnsprobe', 'bench']; import probe.cli; probe.cli.main = lambda: 0; " \
           "from probe.console import main; main(); import pyarrow"
    subprocess.run([sys.executable, "-c", code], env=env, check=True, cwd=tmp_path)
    assert mark.exists()


# Modules a plain one-worker `read` to Parquet does without, imported by the options that need them:
# pyarrow.compute (client privacy, the hive layout), multiprocessing (live capture's supervisor), logging (a missing
# C extension's warning), difflib (a suggestion in an error), subprocess and tempfile (export.on_close commands;
# ctypes.util, which imports them, for --filter); the other commands' modules and live capture's (a command line that
# starts with its command builds that command's parser only); Frame Streams (a dnstap input), gzip (a gzip input),
# the forks (--workers); shutil (with zlib, bz2, lzma: the terminal's width, asked for when help is printed). Each is
# start-up time a short read pays for nothing.
NOT_AT_START = ("pyarrow.compute", "multiprocessing", "logging", "difflib", "subprocess", "tempfile", "ctypes.util",
                "probe.cli.capture", "probe.cli.inspect", "probe.cli.report", "probe.cli.top", "probe.capture.afpacket",
                "probe.run.links", "probe.capture.dnstap_file", "gzip", "probe.run.forked", "shutil")


def test_a_plain_read_starts_without_the_modules_of_options_it_does_not_use(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    code = ("import sys; from probe.console import main; args, names = sys.argv[1:4], sys.argv[4:];"
            " sys.argv = ['dnsprobe', 'read', args[0], '-o', args[1], '-q', *(['-c', args[2]] if args[2] else [])];"
            " status = main(); print(' '.join(m for m in names if m in sys.modules)); sys.exit(status)")
    proc = subprocess.run([sys.executable, "-c", code, str(SAMPLE), str(out), "", *NOT_AT_START], cwd=ROOT,
                          capture_output=True, text=True, check=True)
    assert proc.stdout.split() == []
    assert read_output(out).num_rows > 0
    # With client privacy by prefix the run imports pyarrow.compute: the check above sees what it looks for.
    (tmp_path / "c.yml").write_text("privacy:\n  client_ipv4_prefix: 24\n")
    (tmp_path / "o2").mkdir()
    proc = subprocess.run([sys.executable, "-c", code, str(SAMPLE), str(tmp_path / "o2"), str(tmp_path / "c.yml"),
                           *NOT_AT_START], cwd=ROOT, capture_output=True, text=True, check=True)
    assert proc.stdout.split() == ["pyarrow.compute"]


def test_the_command_ends_without_the_teardown_but_runs_the_atexit_functions(tmp_path):
    # A module-level object's __del__ runs in the interpreter's teardown, which run() skips once the command is done
    # (main(), the same command without it, shows the teardown would have run); atexit functions and the buffered
    # output still come out, and the exit status is the command's.
    out = tmp_path / "out"
    out.mkdir()
    code = ("import atexit, sys; from probe.console import main, run\n"
            "class Teardown:\n    def __del__(self): print('teardown')\n"
            "kept = Teardown(); atexit.register(print, 'atexit'); print('before', end=' ')\n"
            "sys.argv = ['dnsprobe', 'read', sys.argv[1], '-o', sys.argv[2], '-q']; sys.exit(ENTRY())")

    def command(entry, directory):
        proc = subprocess.run([sys.executable, "-c", code.replace("ENTRY", entry), str(SAMPLE), str(directory)],
                              cwd=ROOT, capture_output=True, text=True)
        return proc.returncode, proc.stdout.split()

    assert command("run", out) == (0, ["before", "atexit"])
    assert read_output(out).num_rows > 0
    assert command("run", tmp_path / "missing") == (2, ["before", "atexit"])
    assert command("main", tmp_path / "missing") == (2, ["before", "atexit", "teardown"])


def _timeline(out, *flags, timeline="1", python=(), check=True):
    env = {**os.environ, "DNSPROBE_TIMELINE": timeline}
    proc = subprocess.run([sys.executable, *python, "-m", "probe", "read", str(SAMPLE), "-o", str(out), "-q", *flags],
                          cwd=ROOT, env=env, capture_output=True, text=True, check=check)
    return [(float(line.split()[2]), line.split()[5], " ".join(line.split()[6:])) for line in proc.stderr.splitlines()
            if line.startswith("dnsprobe timeline:")]


def test_the_timeline_gives_the_points_of_a_read_in_order(tmp_path):
    # DNSPROBE_TIMELINE=1 (probe/timeline.py): a line per point, the shared monotonic clock's time, in the order passed.
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
    marks = _timeline(tmp_path / "a")
    assert [point for _, _, point in marks] == [
        "main", "commands imported", "configuration read", "pipeline made", "first batch read", "first frame decoded",
        "exporter made", "exit"]
    times = [t for t, _, _ in marks]
    assert times == sorted(times)
    assert len({pid for _, pid, _ in marks}) == 1
    # Two read workers: each its own pipeline and first frame, after the parent forked them; the parent joins them
    # once both have finished.
    marks = _timeline(tmp_path / "b", "--workers", "2")
    points = [point for _, _, point in marks]
    assert points.index("forking the read workers") < points.index("read worker 0 started")
    for k in (0, 1):
        pid = next(p for _, p, point in marks if point == f"read worker {k} started")
        assert [point for _, p, point in marks if p == pid][1:] == ["pipeline made", "first batch read",
                                                                     "first frame decoded", "exporter made",
                                                                     f"read worker {k} finished"]
        assert points.index(f"read worker {k} finished") < points.index("read workers joined")
    assert _timeline(tmp_path / "c", timeline="") == []
    assert read_output(tmp_path / "c").num_rows > 0


def test_the_first_frame_is_decoded_before_pyarrow_is_imported(tmp_path):
    # A plain read makes its exporter at the first export (probe.run.pipeline): the first frame is decoded before
    # pyarrow (40 ms of a quiet start) and the configuration digest. -X importtime writes a line on stderr as each
    # import ends, in order with the timeline's lines.
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "DNSPROBE_TIMELINE": "1"}
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "probe", "read", str(SAMPLE), "-o", str(out),
                           "-q"], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    lines = [line.split("|")[-1].strip() if line.startswith("import time:") else line.split(" ", 6)[-1]
             for line in proc.stderr.splitlines()]
    assert lines.index("first frame decoded") < lines.index("pyarrow") < lines.index("exporter made")
    assert read_output(out).num_rows > 0


def test_an_exporter_that_refuses_files_is_made_before_the_reading(tmp_path):
    # Enrichment's lists are read when the exporter is made (export.checks_when_made): made at once, its refusal
    # comes before any frame is read, with its message and exit status 2.
    (tmp_path / "c.yml").write_text(f"enrich:\n  public_suffix: true\n  public_suffix_file: {tmp_path / 'none.dat'}\n")
    (tmp_path / "out").mkdir()
    env = {**os.environ, "DNSPROBE_TIMELINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "probe", "read", str(SAMPLE), "-o", str(tmp_path / "out"), "-q",
                           "-c", str(tmp_path / "c.yml")], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 2
    assert "config key 'enrich.public_suffix_file'" in proc.stderr
    assert "first batch read" not in proc.stderr and "pipeline made" not in proc.stderr
    assert list((tmp_path / "out").iterdir()) == []
