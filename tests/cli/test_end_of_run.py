"""A run ends with what matters (issue 31, point 6): the statistics when something was read, the elapsed time and
rate, the files written, all within 80 columns and naming no source-tree path; the errors last, on stderr; -q
prints only errors. The `inspect` table fits the terminal's width."""

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios

from support.data import ROOT
from support.dnsprobe import run_dnsprobe

SAMPLE = ROOT / "samples" / "sample-mix.pcap.xz"  # 20,000 packets, 9,473 records
GARBAGE = b"GARBAGE!" + bytes(range(64)) + b"this is not a capture"


def dnsprobe_merged(*args, env=None):
    """Run dnsprobe with stderr into stdout, as a terminal shows them: (exit status, lines in order)."""
    proc = subprocess.run([sys.executable, "-m", "probe", *map(str, args)], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, env=env, timeout=120)
    return proc.returncode, proc.stdout.splitlines()


def test_a_read_ends_with_the_rate_and_the_files_written(out_dir):
    proc = run_dnsprobe("read", SAMPLE, "-o", out_dir)
    lines = proc.stdout.splitlines()
    assert max(len(line) for line in lines[:-1]) <= 80, proc.stdout  # (the last line names a file in full)
    assert lines[0].strip() == "dnsprobe statistics"  # a title on one line, naming no path
    assert "docs/" not in proc.stdout and ".md" not in proc.stdout
    assert re.fullmatch(r"read 20,000 packets \(2\.3 MB\) in [\d.,]+ s: [\d,]+ packets/s, 9,473 records", lines[-2])
    (written,) = out_dir.glob("*.parquet")
    assert lines[-1] == f"files written: {written}"
    assert proc.stderr == ""


def test_many_files_are_counted_in_their_directory(out_dir):
    proc = run_dnsprobe("read", SAMPLE, "-o", out_dir, "--set", "export.rotate_records=1000")
    count = len(list(out_dir.glob("*.parquet")))
    assert count == 10 and proc.stdout.splitlines()[-1] == f"files written: 10 in {out_dir}/"


def test_a_failed_read_ends_with_its_error_and_prints_no_table(tmp_path, out_dir):
    junk = tmp_path / "junk.pcap"
    junk.write_bytes(GARBAGE)
    status, lines = dnsprobe_merged("read", junk, "-o", out_dir)
    assert status == 1
    # Nothing was read: no table of zeros; the error is the last line.
    assert lines == ["files written: none",
                     f"dnsprobe: error: {junk}: not a pcap, pcapng or dnstap file (first bytes 4741524241474521)"]
    # After a file that was read, the table, then the error last.
    status, lines = dnsprobe_merged("read", SAMPLE, junk, "-o", out_dir)
    assert status == 1 and "│ packets" in "\n".join(lines)
    assert lines[-1].startswith(f"dnsprobe: error: {junk}: not a pcap") and lines[-2].startswith("files written: ")


def on_terminal(args, columns=80, stderr=False):
    """Run dnsprobe ARGS with stdout (or, stderr=True, stderr) on a terminal `columns` wide: (exit status, what the
    terminal showed, the other stream)."""
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    streams = {"stderr": terminal, "stdout": subprocess.PIPE} if stderr else {"stdout": terminal,
                                                                               "stderr": subprocess.PIPE}
    try:
        proc = subprocess.Popen([sys.executable, "-m", "probe", *map(str, args)], cwd=ROOT, **streams)
        os.close(terminal)
        terminal = None
        shown = b""
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: the other end is closed and everything was read
                break
            if not chunk:
                break
            shown += chunk
        other = (proc.stdout if stderr else proc.stderr).read()
        status = proc.wait(timeout=120)
    finally:
        os.close(controller)
        if terminal is not None:
            os.close(terminal)
    plain = re.sub(r"\x1b\[[0-9;]*m", "", shown.decode().replace("\r\n", "\n"))  # (rich's styles)
    return status, plain, other.decode()


def test_quiet_prints_only_errors_even_on_a_terminal(tmp_path, out_dir):
    """-q: no table, no rate, no files line, and no progress bar on a terminal (unless --progress)."""
    junk = tmp_path / "junk.pcap"
    junk.write_bytes(GARBAGE)
    status, shown, stdout = on_terminal(["read", SAMPLE, junk, "-o", out_dir, "-q"], stderr=True)
    assert status == 1 and stdout == ""
    assert shown.splitlines() == [f"dnsprobe: error: {junk}: not a pcap, pcapng or dnstap file (first bytes"
                                  " 4741524241474521)"]
    assert list(out_dir.glob("*.parquet"))


def test_the_inspect_table_fits_the_terminal(out_dir):
    run_dnsprobe("read", SAMPLE, "-o", out_dir, "-q")
    (parquet,) = out_dir.glob("*.parquet")
    for width, left_out in ((80, "prot, src"), (66, "prot, src, delay_us")):
        status, shown, _ = on_terminal(["inspect", parquet, "--limit", "3"], width)
        lines = shown.splitlines()
        assert status == 0 and max(len(line) for line in lines) <= width, shown
        assert "time" in lines[1] and "qname" in lines[1]
        assert f"(hidden for the width: {left_out}; --all-columns)" in lines
    status, wide, _ = on_terminal(["inspect", parquet, "--limit", "3", "--all-columns"], 80)
    assert "edns_client_subnet" in wide and "hidden" not in wide  # asked for all: as wide as it takes
    # Into a pipe (no width): as wide as before, 120 columns.
    piped = run_dnsprobe("inspect", parquet, "--limit", "3").stdout
    assert "UDP" in piped and "hidden" not in piped
