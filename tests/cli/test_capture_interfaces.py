"""`dnsprobe capture -i IFACE` and interfaces that are not there: one that does not exist at start is exit status 2
at once, naming the interfaces there are (a typo is not a capture that records nothing), unless
--wait-for-interface; one that is down at start is waited for; a wait says so every minute. On real veth
interfaces in a network namespace of the test's own (root)."""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from support.data import ROOT

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"), reason="needs root and iproute2")


@pytest.fixture
def netns():
    """A network namespace of its own (only lo there, down), removed at the end."""
    name = f"dnsprobe-ifaces-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def ip(netns, *args):
    subprocess.run(["ip", "-n", netns, *args], check=True)


def add_veth(netns, name, up):
    """A veth pair NAME, NAME-p in the namespace, both up or both down."""
    ip(netns, "link", "add", name, "type", "veth", "peer", "name", f"{name}-p")
    if up:
        set_up(netns, name)


def set_up(netns, name):
    ip(netns, "link", "set", f"{name}-p", "up")
    ip(netns, "link", "set", name, "up")


def wait_line(probe, text, timeout_s):
    """Wait until the capture's log holds text; the log so far."""
    deadline = time.monotonic() + timeout_s
    while text not in probe.stderr:
        assert probe.proc.poll() is None, f"capture exited ({probe.proc.returncode}):\n{probe.stderr}"
        assert time.monotonic() < deadline, f"no {text!r} within {timeout_s} s:\n{probe.stderr}"
        time.sleep(0.1)
    return probe.stderr


def test_an_interface_that_does_not_exist_is_exit_2_naming_those_there_are(netns, out_dir):
    add_veth(netns, "dn0", up=True)
    started = time.monotonic()
    proc = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-m", "probe", "capture", "-i", "nosuch0",
                           "-o", str(out_dir), "--no-progress"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert time.monotonic() - started < 30  # at once, not after a wait
    (line,) = proc.stderr.splitlines()
    assert "interface 'nosuch0' does not exist (this machine has: dn0, dn0-p, lo)" in line, line
    assert "--wait-for-interface" in line and "capturing on" not in proc.stderr
    assert not list(out_dir.iterdir())
    # `dnsprobe config --check` refuses it too, and takes it with the wait asked for.
    check = ["ip", "netns", "exec", netns, sys.executable, "-m", "probe", "config", "--check", "-i", "nosuch0", "-o",
             str(out_dir)]
    proc = subprocess.run(check, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "interface 'nosuch0' does not exist" in proc.stderr, proc.stderr
    proc = subprocess.run([*check, "--wait-for-interface"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "would wait" in proc.stdout, proc.stderr


def test_waiting_for_an_absent_interface_says_so_every_interval(netns, probes, out_dir):
    """--wait-for-interface: a warning and a wait; a line every capture.wait_log_interval (a minute by default,
    4 s here); capture once the interface is there and up; a clean stop."""
    probe = probes(None, out_dir, "-i", "late0", "--wait-for-interface", "--set", "capture.wait_log_interval=4",
                   netns=netns)
    probe.wait_ready()
    log = wait_line(probe, "waiting for it", 30)
    assert "interface 'late0' does not exist" in log
    wait_line(probe, "still waiting for interface 'late0' after 4 s: it does not exist", 30)
    add_veth(netns, "late0", up=True)
    wait_line(probe, "interface 'late0' is there and up", 60)
    assert probe.stop() == 0, probe.stderr
    assert probe.stderr.count("still waiting") in (1, 2)  # worker 0 alone, once an interval


def test_an_interface_down_at_start_is_waited_for_without_asking(netns, probes, out_dir):
    """A link fault, not a typo: the capture starts and waits for it without --wait-for-interface."""
    add_veth(netns, "dn0", up=False)
    probe = probes(None, out_dir, "-i", "dn0", netns=netns)
    probe.wait_ready()
    assert "interface 'dn0' is down" in wait_line(probe, "waiting for it", 30)
    set_up(netns, "dn0")
    wait_line(probe, "interface 'dn0' is there and up", 60)
    probe.signal(signal.SIGINT)
    assert probe.proc.wait(60) == 0, probe.stderr
