"""export.on_close: a real command (a shell script in the test's directory) run for every finished file, by `dnsprobe
read` and by `dnsprobe capture` (veth testbed, as tests/run/test_live_capture.py), never through a shell."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from support.captures import traffic_parts
from support.data import ROOT
from support.dnsprobe import rows_of, run_dnsprobe

from probe.config import Text, load_config
from probe.errors import ConfigError

SAMPLE = ROOT / "samples" / "sample-mix.pcap.xz"  # 20,000 packets, 9,473 transactions
FINISHED = {"parquet": "*.parquet", "cdns": "*.cdns"}


def script(directory, name, body):
    path = Path(directory) / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def recorder(directory):
    """A command that records each call: its arguments, one per line, and whether the file was complete then
    (there under its name, no live name beside it)."""
    return script(directory, "record.sh", 'log="$(dirname "$0")/calls"\nfor f; do :; done\n'
                  'state=complete; [ -f "$f" ] || state=missing\n'
                  'for live in "$f.part" "$(dirname "$f")/.$(basename "$f").part"; do\n'
                  '  [ -e "$live" ] && state=live\ndone\n'
                  'echo "$# $state $*" >> "$log"\n')


def calls(directory):
    path = Path(directory) / "calls"
    return path.read_text().splitlines() if path.exists() else []


def finished_files(out, fmt="parquet"):
    return sorted(str(p) for p in Path(out).rglob(FINISHED[fmt]))


def stats_of(out):
    found = [p for p in Path(out).rglob("*.stats.json")]
    assert len(found) == 1, found
    return json.loads(found[0].read_text())["counters"]


def read(out, command, *extra, check=True):
    return run_dnsprobe("read", SAMPLE, "-o", out, "--no-progress", "-q", "--set", f"export.on_close={command}",
                        *extra, check=check)


@pytest.mark.parametrize("fmt, layout, workers", [("parquet", "flat", 1), ("parquet", "hive", 1),
                                                  ("cdns", "flat", 1), ("parquet", "flat", 2)])
def test_read_calls_the_command_once_per_finished_file(tmp_path, out_dir, fmt, layout, workers):
    command = recorder(tmp_path)
    read(out_dir, f"{command} --to 'remote:dns probe'", "--format", fmt, "--rotate-records", 3000,
         "--set", f"export.layout={layout}", "--workers", workers)
    files = finished_files(out_dir, fmt)
    assert len(files) >= 4  # rotated
    seen = calls(tmp_path)
    # One call per file, after its rename, its absolute path last after the configured words (split as a shell
    # would, not run by one: the quoted words stay one argument).
    assert sorted(line.split(" ", 1)[1] for line in seen) == sorted(
        f"complete --to remote:dns probe {f}" for f in files)
    assert all(line.startswith("3 ") for line in seen)  # --to, remote:dns probe, the path
    assert all(Path(f).is_absolute() for f in files)
    counters = stats_of(out_dir)
    assert counters["on_close_commands"] == counters["files"] == len(files)
    assert counters["on_close_failed"] == 0


def test_failing_command_is_logged_and_counted_and_the_files_stay(tmp_path, out_dir):
    command = script(tmp_path, "refuse.sh", 'echo "upload of $1 refused:" >&2\necho "  no credentials" >&2\nexit 3\n')
    proc = read(out_dir, command, "--rotate-records", 3000)
    files = finished_files(out_dir)
    assert len(files) == 4
    counters = stats_of(out_dir)
    assert counters["on_close_commands"] == counters["on_close_failed"] == 4
    failures = [line for line in proc.stderr.splitlines() if "export.on_close" in line and "failed" in line]
    assert len(failures) == 4
    assert all("exit status 3" in line and "no credentials" in line and "the file is kept" in line
               for line in failures)
    assert len(rows_of(out_dir)) == counters["records"] == 9473  # every file whole


@pytest.mark.parametrize("jobs, workers", [(3, 1), (1, 2)])  # (the limit is the run's, not each worker's)
def test_at_most_on_close_jobs_run_at_once(tmp_path, out_dir, jobs, workers):
    # Each call marks itself running, looks at how many are after a while, and ends.
    command = script(tmp_path, "slow.sh", 'd="$(dirname "$0")"\nmkdir "$d/running.$$"\nsleep 0.3\n'
                     'ls -d "$d"/running.* | wc -l >> "$d/concurrent"\nsleep 0.3\nrmdir "$d/running.$$"\n'
                     'echo "$1" >> "$d/calls"\n')
    proc = read(out_dir, command, "--rotate-records", 1500, "--set", f"export.on_close_jobs={jobs}",
                "--workers", workers)
    files = finished_files(out_dir)
    assert len(files) >= 7
    assert "export.on_close command(s)" in proc.stderr  # what the end of the run waited for
    assert sorted(calls(tmp_path)) == files
    concurrent = [int(n) for n in (tmp_path / "concurrent").read_text().split()]
    assert max(concurrent) == jobs  # the limit is reached, never passed


def test_hung_command_is_stopped_after_the_timeout(tmp_path, out_dir):
    # It ignores SIGTERM: SIGKILL follows, for it and what it started.
    command = script(tmp_path, "hang.sh", "trap '' TERM\nsleep 60\n")
    began = time.monotonic()
    proc = read(out_dir, command, "--set", "export.on_close_timeout=1")
    assert time.monotonic() - began < 30
    assert len(finished_files(out_dir)) == 1
    counters = stats_of(out_dir)
    assert counters["on_close_commands"] == counters["on_close_failed"] == 1
    assert "export.on_close_timeout (1 s)" in proc.stderr and "SIGKILL" in proc.stderr
    assert not subprocess.run(["pgrep", "-f", str(command)], capture_output=True).stdout


def test_a_second_interrupt_stops_waiting_for_the_commands(tmp_path, out_dir):
    command = script(tmp_path, "slow.sh", f'echo $$ >> {tmp_path}/pids\nexec sleep 60\n')
    proc = subprocess.Popen([sys.executable, "-m", "probe", "read", SAMPLE, "-o", out_dir, "--no-progress", "-q",
                             "--rotate-records", "3000", "--set", f"export.on_close={command}"],
                            cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:
            if "waiting for 4 export.on_close command(s)" in line:
                break
        time.sleep(0.5)  # both jobs started
        proc.send_signal(signal.SIGINT)
        rest = proc.stderr.read()
        assert proc.wait(30) == 130
        assert "2 export.on_close command(s) left to end on their own, 2 not run" in rest
        assert stats_of(out_dir)["on_close_commands"] == 0 and len(finished_files(out_dir)) == 4
        pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
        assert len(pids) == 2 and all(Path(f"/proc/{p}").exists() for p in pids)  # not killed: their own session
    finally:
        proc.kill()
        for pid in [int(p) for p in (tmp_path / "pids").read_text().split()] if (tmp_path / "pids").exists() else []:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_command_that_is_not_there_is_refused_before_reading(out_dir):
    proc = read(out_dir, "/nonexistent/ship-it", check=False)
    assert proc.returncode == 2, proc.stderr
    assert "export.on_close" in proc.stderr and "/nonexistent/ship-it" in proc.stderr and "Traceback" not in proc.stderr
    assert not list(out_dir.iterdir())


def test_the_command_is_a_list_or_words_never_a_shell(tmp_path):
    def on_close(value):
        return load_config(overrides={"export.on_close": value}).export.on_close

    assert on_close(Text("rclone copyto --s3-acl 'private read' remote:")) == (
        "rclone", "copyto", "--s3-acl", "private read", "remote:")
    assert on_close(Text("[ship, a b; rm -rf x]")) == ("ship", "a b; rm -rf x")
    assert on_close(["ship", "$HOME"]) == ("ship", "$HOME")
    conf = tmp_path / "c.yml"
    conf.write_text("export:\n  on_close: [kafka-produce, --topic, dns]\n")
    assert load_config(conf).export.on_close == ("kafka-produce", "--topic", "dns")
    for bad in (Text("ship 'unclosed"), Text(""), []):
        with pytest.raises(ConfigError, match="export.on_close"):
            on_close(bad)


# ---------------------------------------------------------------------------------------------
# Live capture

live = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"), reason="needs root and iproute2")


@pytest.fixture(scope="module")
def traffic(tmp_path_factory):
    return traffic_parts(tmp_path_factory.mktemp("on-close-traffic"), 300, "AB")


@live
@pytest.mark.parametrize("fmt", ["parquet", "cdns"])
def test_capture_runs_the_command_for_every_rotated_file(testbed, traffic, probes, out_dir, tmp_path, fmt):
    (pcap_a, passed_a, _), (pcap_b, passed_b, _) = traffic["A"], traffic["B"]
    command = recorder(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    probe = probes(testbed, out_dir, "--rotate-seconds", 0, "--format", fmt, "--set", f"export.on_close={command}",
                   "--prometheus-port", port)
    probe.wait_ready()
    testbed.send(pcap_a, pps=3000)
    probe.wait_counter("packets", passed_a)
    probe.signal(signal.SIGHUP)  # rotation during the capture: the first file is shipped while it runs
    probe.wait_for(lambda d: d["counters"]["on_close_commands"] >= 1, "the command for the first file")
    first = finished_files(out_dir, fmt)
    assert len(first) == 1 and calls(tmp_path) == [f"1 complete {first[0]}"]
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert "dnsprobe_on_close_commands_total 1.0" in metrics and "dnsprobe_on_close_failed_total 0.0" in metrics
    testbed.send(pcap_b, pps=3000)
    probe.wait_counter("packets", passed_a + passed_b)
    assert probe.stop() == 0, probe.stderr
    files = finished_files(out_dir, fmt)
    assert len(files) == 2
    assert sorted(calls(tmp_path)) == sorted(f"1 complete {f}" for f in files)
    c = probe.stats()["counters"]
    assert c["on_close_commands"] == c["files"] == 2 and c["on_close_failed"] == 0


@live
def test_capture_ships_the_file_recovered_from_a_dead_worker_as_its_user(testbed, traffic, probes, nobody_dir):
    nobody, out = nobody_dir
    pcap, passed, expected = traffic["A"]
    log = out / "calls"
    command = script(out, "whoami.sh", f'echo "$(id -u) $HOME $1" >> {log}\n')
    probe = probes(testbed, out, "--rotate-seconds", 0, "--user", "nobody", "--set", f"export.on_close={command}")
    probe.wait_ready()
    testbed.send(pcap, pps=3000)
    probe.wait_counter("packets", passed)
    doc = probe.wait_counter("records", sum(expected.values()))  # all in the worker's live file (flush_seconds)
    os.kill(doc["workers"]["0"]["pid"], signal.SIGKILL)
    probe.wait_for(lambda d: d["recovered_files"] and d["counters"]["on_close_commands"] >= 1,
                   "the recovered file and its command")
    assert probe.stop() == 0, probe.stderr
    recovered = [str(out / r["file"]) for r in probe.stats()["recovered_files"]]
    assert len(recovered) == 1
    home = Path(__import__("pwd").getpwnam("nobody").pw_dir)
    assert log.read_text().splitlines() == [f"{nobody} {home} {recovered[0]}"]
