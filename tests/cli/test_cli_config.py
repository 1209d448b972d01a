"""Configuration and command line: defaults file complete, overrides, errors with exit status 2."""

import json
import re

import pyarrow.parquet as pq
import pytest
import yaml
from support.data import DNSPROBE_DATA, ROOT
from support.dnsprobe import read_output, run_dnsprobe

from probe.config import load_config, options, render_default_yaml

REFERENCE_CONFIG = ROOT / "config" / "dnsprobe.yml"  # a copy of the built-in defaults, for reading

PCAP = DNSPROBE_DATA / "test_pcaps" / "udp_simple.pcap"


def test_default_yaml_lists_every_option_with_its_default():
    assert REFERENCE_CONFIG.read_text() == render_default_yaml(), "regenerate: dnsprobe config --defaults"
    doc = yaml.safe_load(REFERENCE_CONFIG.read_text())
    keys = {f"{s}.{k}" for s, body in doc.items() for k in body}
    assert keys == {key for key, _, _ in options()}


def test_config_file_and_flags_override_defaults(tmp_path):
    conf = tmp_path / "c.yml"
    conf.write_text("match:\n  query_timeout: 2.5\nexport:\n  compression: snappy\n")
    cfg = load_config(conf, {"export.compression": "gzip"})
    assert cfg.match.query_timeout == 2.5
    assert cfg.export.compression == "gzip"
    assert cfg.decode.dns_ports == (53,)


@pytest.mark.parametrize(("written", "mode"), [("on-demand", "on-demand"), ("true", "true"), ("yes", "true"),
                                             ("On", "true"), ("false", "false"), ("off", "false"), ("NO", "false")])
def test_capture_top_booleans_mean_what_they_meant(tmp_path, written, mode):
    """capture.top was a boolean: YAML's booleans still say always or never; on-demand is the default."""
    assert load_config().capture.top == "on-demand"
    conf = tmp_path / "c.yml"
    conf.write_text(f"capture:\n  top: {written}\n")
    assert load_config(conf).capture.top == mode
    assert load_config(overrides={"capture.top": mode == "true"}).capture.top == ("true" if mode == "true" else "false")
    shown = run_dnsprobe("config", "-c", conf).stdout
    assert f"\n  top: {mode}\n" in shown  # (true and false unquoted: read back as the same)
    again = tmp_path / "again.yml"
    again.write_text(shown)
    assert load_config(again).capture.top == mode


@pytest.mark.parametrize(
    "text, key",
    [
        ("match:\n  query_timeot: 3\n", "match.query_timeot"),
        ("matching:\n  query_timeout: 3\n", "matching"),
        ("match:\n  query_timeout: soon\n", "match.query_timeout"),
        ("match:\n  query_timeout: -1\n", "match.query_timeout"),
        ("export:\n  rotate_records: true\n", "export.rotate_records"),
        ("export:\n  compression: rar\n", "export.compression"),
        ("decode:\n  dns_ports: [53, 70000]\n", "decode.dns_ports"),
        ("run:\n  batch_size: 0\n", "run.batch_size"),
        ("match:\n  query_timeout: .nan\n", "match.query_timeout': expected a finite number, got nan"),
        ("decode:\n  tcp_idle_timeout: .inf\n", "decode.tcp_idle_timeout': expected a finite number, got inf"),
        ("match:\n  max_pending: 18446744073709551616\n", "match.max_pending': 18446744073709551616 does not fit"),
        ("export:\n  file_prefix: sub/dnsprobe.\n", "export.file_prefix': 'sub/dnsprobe.' is not a file name prefix"),
        ("capture:\n  top: sometimes\n", "capture.top': 'sometimes' is not one of on-demand, true, false"),
        ("capture:\n  top: 1\n", "capture.top': '1' is not one of on-demand, true, false"),
    ],
)
def test_bad_config_names_the_key_and_exits_2(tmp_path, out_dir, text, key):
    conf = tmp_path / "bad.yml"
    conf.write_text(text)
    proc = run_dnsprobe("read", PCAP, "-o", out_dir, "-c", conf, check=False)
    assert proc.returncode == 2
    assert key in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not list(out_dir.iterdir())


def test_exponents_without_a_dot_are_numbers(tmp_path):
    # PyYAML follows YAML 1.1, which reads 1e-3 (no dot, or no exponent sign) as a string.
    conf = tmp_path / "exp.yml"
    conf.write_text("match:\n  query_timeout: 2e-3\ndecode:\n  tcp_idle_timeout: 1e2\n")
    cfg = load_config(conf, {"export.rotate_seconds": "1.5e1"})
    assert (cfg.match.query_timeout, cfg.decode.tcp_idle_timeout, cfg.export.rotate_seconds) == (0.002, 100.0, 15.0)


def test_bad_yaml_and_missing_config_file(tmp_path, out_dir):
    conf = tmp_path / "broken.yml"
    conf.write_text("match: [unclosed\n")
    proc = run_dnsprobe("read", PCAP, "-o", out_dir, "-c", conf, check=False)
    assert proc.returncode == 2 and "not valid YAML" in proc.stderr
    proc = run_dnsprobe("read", PCAP, "-o", out_dir, "-c", tmp_path / "nope.yml", check=False)
    assert proc.returncode == 2 and "nope.yml: no such file" in proc.stderr
    latin1 = tmp_path / "latin1.yml"
    latin1.write_bytes("export:\n  file_prefix: sonde-\u00e9t\u00e9.\n".encode("latin-1"))
    proc = run_dnsprobe("read", PCAP, "-o", out_dir, "-c", latin1, check=False)
    assert proc.returncode == 2 and "latin1.yml: not UTF-8 text (byte 29)" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not list(out_dir.iterdir())


def test_bad_flags_exit_2(out_dir):
    proc = run_dnsprobe("read", PCAP, "-o", out_dir, "--query-timeout", "abc", check=False)
    assert proc.returncode == 2 and "--query-timeout" in proc.stderr
    proc = run_dnsprobe("read", PCAP, "-o", out_dir, "--set", "match.nothing=1", check=False)
    assert proc.returncode == 2 and "match.nothing" in proc.stderr
    proc = run_dnsprobe("read", PCAP, "-o", out_dir, "--compression", "rar", check=False)
    assert proc.returncode == 2 and "export.compression" in proc.stderr
    for flag in ("nan", "inf", "-inf"):  # argparse's float() takes them; the config check must not
        proc = run_dnsprobe("read", PCAP, "-o", out_dir, f"--query-timeout={flag}", check=False)
        assert proc.returncode == 2 and "expected a finite number" in proc.stderr and "Traceback" not in proc.stderr
    assert not list(out_dir.iterdir())
    proc = run_dnsprobe("frobnicate", check=False)
    assert proc.returncode == 2


def test_help_reads_like_a_man_page():
    top = run_dnsprobe("--help").stdout
    for word in ("read", "inspect", "exit status", "dnsprobe config --defaults"):
        assert word in top
    read = run_dnsprobe("read", "--help").stdout
    for word in ("--output", "--config", "--query-timeout", "--set", "examples:", "pcapng"):
        assert word in read
    assert "--json" in run_dnsprobe("inspect", "--help").stdout
    # Every subcommand's help renders (a stray '%' in a help string breaks argparse's formatting).
    for command, word in (("capture", "--coremask"), ("config", "--defaults"), ("keygen", "key"),
                          ("bench", "--generator")):
        assert word in run_dnsprobe(command, "--help").stdout, command


def test_flags_reach_the_output(tmp_path, out_dir):
    run_dnsprobe("read", PCAP, "-o", out_dir, "-q", "--prefix", "probe-a.", "--rotate-records", "40",
                 "--compression", "none", "--row-group-size", "7")
    files = sorted(out_dir.glob("probe-a.*.parquet"))
    assert len(files) >= 3  # 92 records, 40 per file

    meta = pq.ParquetFile(files[0]).metadata
    assert meta.num_rows == 40
    assert meta.num_row_groups == 6  # 40 rows in groups of 7
    assert meta.row_group(0).column(0).compression == "UNCOMPRESSED"
    assert not list(out_dir.glob("*.part"))
    stats = json.loads(next(out_dir.glob("*.stats.json")).read_text())
    assert stats["counters"]["files"] == 3 and stats["counters"]["records"] == 92
    assert stats["files_written"] == [f.name for f in files]


def test_runs_sharing_a_directory_keep_every_file(out_dir):
    # Statistics JSON names carry the run's start to the second: repeated runs into one directory meet on them.
    # Files standing on every name this run could take (from a second before now to a minute after) must
    # survive, and the run must still get its own. Data names come from the input: a second read of it is
    # refused (tests/cli/test_output_names.py), so the runs here write different formats.
    import time

    now = int(time.time())
    decoys = {}
    for t in range(now - 1, now + 60):
        p = out_dir / f"_dnsprobe.{time.strftime('%Y%m%d.%H%M%S', time.gmtime(t))}.stats.json"
        decoys[p] = f'{{"decoy": {t}}}\n'
        p.write_text(decoys[p])
    runs = []
    for fmt in ("parquet", "cdns"):
        before = set(out_dir.iterdir())
        run_dnsprobe("read", PCAP, "-o", out_dir, "-q", "--format", fmt)
        (new_stats,) = [p for p in set(out_dir.iterdir()) - before if p.name.endswith(".stats.json")]
        assert re.fullmatch(r"_dnsprobe\.\d{8}\.\d{6}\.[1-9]\d*\.stats\.json", new_stats.name), new_stats.name
        runs.append(json.loads(new_stats.read_text()))
    for p, text in decoys.items():
        assert p.read_text() == text, f"{p.name} was overwritten"
    written = [name for doc in runs for name in doc["files_written"]]
    assert len(written) == 2 and len(set(written)) == 2
    assert all((out_dir / name).exists() for name in written)
    assert [doc["counters"]["records"] for doc in runs] == [92, 92]
    assert not list(out_dir.glob("*.part"))


def test_default_compression_is_zstd_and_names_carry_utc_start(out_dir):
    run_dnsprobe("read", PCAP, "-o", out_dir, "-q")
    (f,) = out_dir.glob("*.parquet")

    assert pq.ParquetFile(f).metadata.row_group(0).column(0).compression == "ZSTD"
    first = read_output(out_dir).column("time")[0].as_py()
    import datetime

    start = datetime.datetime.fromtimestamp(first / 1e6, datetime.timezone.utc)
    assert f.name == f"dnsprobe.{start:%Y%m%d.%H%M%S}.{first % 1_000_000:06d}.w0.parquet"


def test_rotation_by_capture_time(out_dir):
    # udp_simple has traffic in seconds 0-3, 8-11 and 16 of its capture; rotate every 4 s of it.
    run_dnsprobe("read", PCAP, "-o", out_dir, "-q", "--rotate-seconds", "4", "--set", "run.batch_size=8")
    files = sorted(out_dir.glob("*.parquet"))
    assert len(files) >= 3

    for f in files:
        t = pq.read_table(f, columns=["time"]).column("time").to_pylist()
        assert max(t) - min(t) < 4.5e6  # 4 s plus a batch of 8 frames


def test_inspect_table_and_json(out_dir):
    run_dnsprobe("read", PCAP, "-o", out_dir, "-q")
    (f,) = out_dir.glob("*.parquet")
    text = run_dnsprobe("inspect", f, "--limit", "3").stdout
    assert "tcpreplay.appneta.com" in text and "qname" in text
    lines = run_dnsprobe("inspect", f, "--json", "--limit", "4").stdout.splitlines()
    assert len(lines) == 4
    first = json.loads(lines[0])
    assert first["qname"] == "tcpreplay.appneta.com" and first["id"] == 5223
    cols = run_dnsprobe("inspect", f, "--json", "--limit", "1", "--columns", "id,rcode").stdout
    assert json.loads(cols) == {"id": 5223, "rcode": 0}
    proc = run_dnsprobe("inspect", f, "--columns", "nope", check=False)
    assert proc.returncode == 2 and "nope" in proc.stderr


def test_inspect_json_prints_every_record_unless_limited(out_dir):
    """JSON is for pipes: all records by default (92 here), while the table shows the first 20."""
    run_dnsprobe("read", PCAP, "-o", out_dir, "-q")
    (f,) = out_dir.glob("*.parquet")
    records = pq.read_metadata(f).num_rows
    assert records > 20
    assert len(run_dnsprobe("inspect", f, "--json").stdout.splitlines()) == records
    table = run_dnsprobe("inspect", f, "--columns", "id").stdout
    assert sum(1 for line in table.splitlines() if line.strip("│ ").isdigit()) == 20


def test_read_table_lists_only_the_counters_of_a_file_run(out_dir):
    text = run_dnsprobe("read", PCAP, "-o", out_dir).stdout
    assert "packets" in text and "matched" in text and "lengths_capped" in text
    for live_only in ("kernel_received", "kernel_drops", "dpdk_ipackets", "dpdk_rx_nombuf", "worker_restarts"):
        assert live_only not in text


CHANGED = ["-i", "eth0", "-i", "eth1", "--coremask", "3", "--query-timeout", "2.5", "--dns-port", "53",
           "--dns-port", "5353", "--prefix", "yes", "--set", "capture.prometheus_address=::",
           "--set", "export.cdns_server_addresses=[::1, 192.0.2.1]", "--set", "capture.fanout_group=7",
           "--set", "privacy.key_file=null", "--format", "cdns", "--set", "export.flush_seconds=0.5"]


def effective(*args):
    """The Config the flags of `dnsprobe config ARGS` make, built in-process."""
    from probe.cli import build_parser
    from probe.cli.capture import CAPTURE_FLAGS
    from probe.cli.flags import overrides

    parsed = build_parser().parse_args(["config", *args])
    return load_config(parsed.config, overrides(parsed, CAPTURE_FLAGS))


@pytest.mark.parametrize("args", [[], CHANGED], ids=["defaults", "changed"])
def test_config_round_trip(tmp_path, args):
    """`dnsprobe config | dnsprobe config -c /dev/stdin` prints the same YAML, which reads back to the
    configuration the flags made."""
    import shlex
    import subprocess
    import sys

    first = run_dnsprobe("config", *args).stdout
    command = f"{sys.executable} -m probe config {shlex.join(args)} | {sys.executable} -m probe config -c /dev/stdin"
    again = subprocess.run(command, shell=True, capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert again == first
    saved = tmp_path / "saved.yml"
    saved.write_text(first)
    assert load_config(saved) == effective(*args)
    if args:
        cfg = load_config(saved)
        assert cfg.capture.prometheus_address == "::" and cfg.export.file_prefix == "yes"
        assert cfg.export.cdns_server_addresses == ("::1", "192.0.2.1") and cfg.decode.dns_ports == (53, 5353)
        assert cfg.capture.interfaces == ("eth0", "eth1") and cfg.privacy.key_file is None


@pytest.mark.parametrize("yaml_text, flag", [("0x3", "0x3"), ("3", "3"), ('"0x3"', '"0x3"'), ("'3'", "0X3")])
def test_values_are_read_by_the_type_of_their_key(tmp_path, yaml_text, flag):
    """A coremask is text: 0x3, 3 and "0x3" all name cores 0 and 1, in a file and with --set; an address :: is
    text too."""
    from probe.run.checks import parse_coremask

    conf = tmp_path / "c.yml"
    conf.write_text(f"capture:\n  coremask: {yaml_text}\n  prometheus_address: '::'\n")
    from_file = load_config(conf)
    from_set = effective("--set", f"capture.coremask={flag}", "--set", "capture.prometheus_address=::")
    for cfg in (from_file, from_set):
        assert parse_coremask(cfg.capture.coremask) == [0, 1]
        assert cfg.capture.prometheus_address == "::"
    assert load_config(None, {"capture.coremask": 3}).capture.coremask == "0x3"  # a program's integer


def test_unknown_keys_name_the_nearest_known_one(tmp_path):
    conf = tmp_path / "c.yml"
    conf.write_text("capture:\n  corremask: 0x3\n")
    proc = run_dnsprobe("config", "-c", conf, check=False)
    assert proc.returncode == 2 and "unknown config key 'capture.corremask' (did you mean 'capture.coremask'?)" \
        in proc.stderr
    proc = run_dnsprobe("config", "--set", "match.query_timeot=3", check=False)
    assert proc.returncode == 2 and "did you mean 'match.query_timeout'?" in proc.stderr
    conf.write_text("captrue:\n  coremask: 0x3\n")
    proc = run_dnsprobe("config", "-c", conf, check=False)
    assert proc.returncode == 2 and "unknown config section 'captrue' (did you mean 'capture'?)" in proc.stderr


def test_a_config_directory_in_the_working_directory_is_not_read(tmp_path):
    """The defaults are the installed package's: ./config/dnsprobe.yml where dnsprobe runs changes nothing."""
    import subprocess
    import sys

    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "dnsprobe.yml").write_text("match:\n  query_timeout: 99\nexport:\n  format: cdns\n")
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    there = subprocess.run([sys.executable, "-m", "probe", "config"], cwd=tmp_path, env=env, capture_output=True,
                           text=True, check=True).stdout
    assert there == run_dnsprobe("config").stdout
    assert "query_timeout: 5.0" in there and "format: parquet" in there
    assert run_dnsprobe("config", "--defaults").stdout == render_default_yaml()


def test_progress_bar_only_when_asked_or_on_a_terminal(out_dir):
    quiet = run_dnsprobe("read", PCAP, "-o", out_dir, "-q")
    assert quiet.stderr == ""  # not a terminal: no progress bar, no noise
    shown = run_dnsprobe("read", PCAP, "-o", out_dir, "-q", "--progress", "--overwrite")
    assert "udp_simple.pcap" in shown.stderr and "━" in shown.stderr


def test_reads_pipes_and_fifos(tmp_path):
    # zcat-style use: /dev/stdin and a FIFO are not seekable, and the second input is xz through a pipe.
    import lzma
    import os
    import subprocess
    import sys
    import threading

    ref = tmp_path / "ref"
    ref.mkdir()
    run_dnsprobe("read", PCAP, "-o", ref, "-q")
    expected = read_output(ref).to_pylist()

    piped = tmp_path / "piped"
    piped.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "probe", "read", "/dev/stdin", "-o", str(piped), "-q", "--progress"],
        input=lzma.compress(PCAP.read_bytes()), capture_output=True, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert b"/? " in proc.stderr  # a bar without an end, counting bytes read
    assert read_output(piped).to_pylist() == expected

    fifo = tmp_path / "capture.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(PCAP.read_bytes()))
    writer.start()
    via_fifo = tmp_path / "fifo"
    via_fifo.mkdir()
    run_dnsprobe("read", fifo, "-o", via_fifo, "-q")
    writer.join(10)
    assert read_output(via_fifo).to_pylist() == expected


def test_a_directory_is_not_an_input(tmp_path, out_dir):
    proc = run_dnsprobe("read", tmp_path, "-o", out_dir, check=False)
    assert proc.returncode == 2 and f"{tmp_path}: is a directory, not a file" in proc.stderr, proc.stderr
    # inspect reads every output file of a directory: an empty one is an error naming it.
    proc = run_dnsprobe("inspect", out_dir, check=False)
    assert proc.returncode == 2 and f"{out_dir}: no dnsprobe output files in it" in proc.stderr, proc.stderr

