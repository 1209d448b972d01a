"""The systemd unit (contrib/dnsprobe@.service) and running under it: systemd's own analyzer rates the unit's
exposure at most 3.0 ("OK") and finds nothing wrong in it; it runs the installed command, unprivileged with
CAP_NET_RAW alone, and restarts after failures but not after a configuration error; log lines carry their time,
except under the journal, which stamps them itself."""

import os
import re
import shutil
import subprocess
import sys

import pytest
from support.data import ROOT
from support.dnsprobe import run_python

UNIT = ROOT / "contrib" / "dnsprobe@.service"
needs_analyze = pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="needs systemd-analyze (systemd)")


def directives():
    out = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


@needs_analyze
def test_security_exposure_is_ok():
    proc = subprocess.run(["systemd-analyze", "security", "--offline=true", str(UNIT)], capture_output=True,
                          text=True)
    if "--offline" in proc.stderr and proc.returncode:
        pytest.skip(f"systemd-analyze cannot analyse a unit file offline here: {proc.stderr.strip()}")
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d+) (\w+)", proc.stdout)
    assert found, proc.stdout + proc.stderr
    assert float(found.group(1)) <= 3.0 and found.group(2) == "OK", proc.stdout


@needs_analyze
def test_unit_verifies(tmp_path):
    """systemd-analyze verify: every directive known and valid (with the command of this checkout standing in for
    the installed one, which it checks exists)."""
    command = shutil.which("dnsprobe") or str(ROOT / ".venv" / "bin" / "dnsprobe")
    if not os.path.exists(command):
        pytest.skip("no dnsprobe command installed")
    unit = tmp_path / "dnsprobe@test.service"
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/dnsprobe", command))
    proc = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    assert proc.returncode == 0 and not proc.stderr.strip() and not proc.stdout.strip(), proc.stderr


def test_unit_runs_the_installed_command_with_a_capability_not_root():
    from probe.cli import build_parser

    d = directives()
    (start,) = d["ExecStart"]
    command, *args = start.split()
    assert command == "/usr/local/bin/dnsprobe" and args[0] == "capture"
    build_parser().parse_args([a.replace("%i", "NAME") for a in args])  # the flags exist
    assert d["DynamicUser"] == ["yes"] and "User" not in d
    assert d["AmbientCapabilities"] == ["CAP_NET_RAW"] and d["CapabilityBoundingSet"] == ["CAP_NET_RAW"]
    assert d["Restart"] == ["on-failure"] and d["RestartPreventExitStatus"] == ["2"]
    assert "AF_PACKET" in d["RestrictAddressFamilies"][0]


LOG = "from probe.run.log import log; log('hello')"


def test_log_lines_carry_the_time_unless_the_journal_stamps_them():
    plain = run_python(LOG)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z dnsprobe: hello\n", plain.stderr), plain.stderr
    # systemd says which stream is the journal's: the device and inode of the stderr it gave (systemd.exec(5)).
    code = ("import os, sys; st = os.fstat(2); os.environ['JOURNAL_STREAM'] = f'{st.st_dev}:{st.st_ino}'; " + LOG)
    journal = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert journal.stderr == "dnsprobe: hello\n"
    other = subprocess.run([sys.executable, "-c", LOG], capture_output=True, text=True, cwd=ROOT,
                           env={**os.environ, "JOURNAL_STREAM": "1:2"})  # inherited, not our stderr
    assert other.stderr.endswith("Z dnsprobe: hello\n")
