"""Options that do not apply are refused (exit status 2, one line, nothing written), and `dnsprobe config` refuses
what `read` and `capture` refuse: one validation for the three commands, so that a file `config` prints or
`config --check` passes is one `capture -c` takes."""

import os
import subprocess
import sys

import pytest
from support.data import ROOT
from support.dnsprobe import read_output, run_dnsprobe

SAMPLE = ROOT / "samples" / "sample-mix.pcap.xz"
CORES = len(os.sched_getaffinity(0))


def refused(*args, needle):
    """Run dnsprobe ARGS: exit status 2 and one line on stderr holding needle; returns that line. (A capture that
    is not refused would run until the timeout.)"""
    proc = subprocess.run([sys.executable, "-m", "probe", *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2, (args, proc.returncode, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and needle in lines[0], (args, proc.stderr)
    return lines[0]


NOT_APPLYING = [
    (["--format", "parquet", "--cdns-compression", "xz"], "'export.cdns_compression': 'xz' is for C-DNS output"),
    (["--format", "cdns", "--compression", "snappy"], "'export.compression': 'snappy' is for Parquet output"),
    (["--format", "cdns", "--row-group-size", "500"], "'export.row_group_size': 500 is for Parquet output"),
    (["--set", "export.rotate_blocks=3"], "'export.rotate_blocks': 3 is for C-DNS output"),
    (["--format", "cdns", "--set", "export.layout=hive"], "'export.layout': 'hive' is for Parquet output"),
]


@pytest.mark.parametrize("args, needle", NOT_APPLYING)
def test_an_option_of_the_other_format_is_refused(out_dir, args, needle):
    refused("read", SAMPLE, "-o", out_dir, "-q", *args, needle=needle)
    assert not list(out_dir.iterdir())
    refused("capture", "-i", "lo", "-o", out_dir, *args, needle=needle)
    refused("config", *args, needle=needle)


def test_an_option_at_its_default_is_not_refused(out_dir):
    """A configuration file from `dnsprobe config --defaults` lists every key: the other format's defaults pass."""
    run_dnsprobe("read", SAMPLE, "-o", out_dir, "-q", "--format", "cdns", "--compression", "zstd",
                 "-c", ROOT / "config" / "dnsprobe.yml")
    assert [p.suffix for p in out_dir.glob("*.w0.*")] == [".cdns"]


def test_read_workers_and_coremask_are_refused_together(out_dir):
    refused("read", SAMPLE, "-o", out_dir, "-q", "--workers", "2", "--coremask", "0x1",
            needle="config keys 'run.workers' (2) and 'run.coremask' (0x1): give one")
    assert not list(out_dir.iterdir())


def test_more_read_workers_than_cores_are_refused(out_dir):
    """`--workers 64` on 2 cores wrote .w0 ... .w63; now it names the cores there are."""
    refused("read", SAMPLE, "-o", out_dir, "-q", "--workers", str(CORES + 1),
            needle=f"config key 'run.workers': {CORES + 1} workers, but this process may run on {CORES} core(s)")
    refused("read", SAMPLE, "-o", out_dir, "-q", "--workers", "64", needle="config key 'run.workers'")
    assert not list(out_dir.iterdir())


@pytest.mark.skipif(CORES < 2, reason="needs 2 cores")
def test_several_read_workers_show_the_progress_asked_for(tmp_path, out_dir):
    proc = run_dnsprobe("read", SAMPLE, "-o", out_dir, "-q", "--workers", "2", "--progress")
    assert "sample-mix.pcap.xz" in proc.stderr and "━" in proc.stderr and "MB" in proc.stderr, proc.stderr
    assert read_output(out_dir).num_rows > 0
    (tmp_path / "quiet").mkdir()
    quiet = run_dnsprobe("read", SAMPLE, "-o", tmp_path / "quiet", "-q", "--workers", "2", "--no-progress")
    assert quiet.stderr == ""


@pytest.mark.parametrize("args, needle, command", [
    (["--coremask", "0xZ"], "config key 'capture.coremask': '0xZ' is not a hexadecimal mask", "capture"),
    (["--anonymize-key", "nokey"], "key file nokey: no such file", "capture"),
    (["-o", "nosuchdir"], "output directory nosuchdir does not exist", "capture"),
    (["--user", "no-such-user-x"], "config key 'capture.user': no user 'no-such-user-x'", "capture"),
    (["-i", "lo", "-i", "lo"], "an interface is named twice", "capture"),
    (["--set", "run.coremask=0xZ"], "config key 'run.coremask': '0xZ' is not a hexadecimal mask", "read"),
    (["--set", "run.workers=2", "--set", "run.coremask=0x1"], "give one", "read"),
])
def test_config_refuses_what_read_and_capture_refuse(tmp_path, args, needle, command):
    """`dnsprobe config` exits 2 where it printed a configuration `capture -c` (or `read -c`) then refused; the
    file it would have printed, given to `config --check -c` and to that command, is refused with the same
    line."""
    line = refused("config", *args, needle=needle)
    out = tmp_path / "out"
    out.mkdir()
    saved = tmp_path / "saved.yml"
    saved.write_text(run_dnsprobe("config", "-i", "lo", "-o", out).stdout)
    assert refused("config", "--check", "-c", saved, *args, needle=needle) == line
    inputs = [SAMPLE, "-q"] if command == "read" else []
    assert refused(command, *inputs, "-c", saved, *args, needle=needle) == line


def test_config_check_refuses_what_only_capture_refuses(tmp_path, out_dir):
    conf = tmp_path / "c.yml"
    conf.write_text(f"export:\n  directory: {out_dir}\n")
    run_dnsprobe("config", "-c", conf)  # a configuration `read` takes
    line = refused("config", "--check", "-c", conf, needle="nothing to capture: give -i IFACE")
    assert refused("capture", "-c", conf, needle="nothing to capture") == line
    conf.write_text(f"export:\n  directory: {out_dir}\ncapture:\n  interfaces: [lo]\n")
    ok = run_dnsprobe("config", "--check", "-c", conf)
    assert ok.stdout == f"{conf}: `dnsprobe capture` would start with it\n" and ok.stderr == ""
