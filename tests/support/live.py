"""Live capture: the veth testbed, hugepages for DPDK, the capture probe under test (`dnsprobe capture`)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from testbed import Testbed  # benchmarks/testbed.py (support puts benchmarks/ on the path)

from support.data import ROOT

CLIENT_MAC = bytes.fromhex("020000000001")
SERVER_MAC = bytes.fromhex("020000000035")
WAIT_S = 30.0
# Whether libdpdk is installed (the DPDK extension is built where it is); EAL flags for a process without hugepages.
LIBDPDK = shutil.which("pkg-config") is not None and subprocess.run(
    ["pkg-config", "--exists", "libdpdk"], capture_output=True).returncode == 0
NO_HUGE = "--no-huge --no-pci -m 512"
WORKER_RSS_BOUND_MIB = 256  # issue 33: no worker above this (its peak resident memory)
needs_dpdk = pytest.mark.skipif(not LIBDPDK, reason="libdpdk is not installed (apt-get install libdpdk-dev "
                                "pkg-config), so the DPDK extension is not built")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="DPDK's EAL needs root (/var/run/dpdk, device access)")
# The start of a script for run_python that calls the DPDK extension: the EAL up without hugepages, a net_pcap vdev
# on each file of argv[1] (";" between them), and attempt(call, *args), which prints "done" or the DpdkError.
EAL_SCRIPT = """
import sys, threading, time
from probe import _records
from probe.capture import _dpdk, dpdk
_dpdk.eal_init(["dnsprobe", "--no-huge", "--no-pci", "-m", "512", "--log-level=error",
                *(f"--vdev=net_pcap{k},rx_pcap={p}" for k, p in enumerate(sys.argv[1].split(";"))),
                f"--file-prefix={dpdk.own_prefix()}"])
def attempt(call, *args):
    try:
        call(*args)
        print("done")
    except _dpdk.DpdkError as exc:
        print(exc)
"""


class VethBed(Testbed):
    """The tests' testbed: two veth pairs (dptc<pid> ↔ dptp<pid>, and dptc<pid>b ↔ dptp<pid>b for a second
    interface) in the namespace dnsprobe-t<pid>."""

    def __init__(self):
        super().__init__("t", pairs=2)


class Hugepages:
    """2 MiB hugepages for DPDK's multi-process tests, given back afterwards: `pages` more reserved
    (vm.nr_hugepages, raised and lowered by that many, as other users of this machine may hold some) and a
    hugetlbfs of our own mounted for EAL's --huge-dir. skip_reason is set when they cannot be had (not root, the
    kernel found fewer free pages)."""

    NR = Path("/proc/sys/vm/nr_hugepages")

    def __init__(self, pages=128):
        self.pages = pages
        self.dir = None
        self.raised = 0
        self.skip_reason = None

    def __enter__(self):
        import tempfile

        if os.geteuid() != 0 or not self.NR.exists():
            self.skip_reason = "needs root and hugepage support"
            return self
        try:
            before = int(self.NR.read_text())
            self.NR.write_text(str(before + self.pages))
        except OSError as exc:  # a read-only /proc/sys (a container), a kernel without hugepages
            self.skip_reason = f"cannot reserve hugepages: {self.NR}: {exc.strerror}"
            return self
        self.raised = max(0, int(self.NR.read_text()) - before)
        free = _meminfo("HugePages_Free")
        if self.raised < self.pages or free < self.pages:
            self.skip_reason = f"could reserve {self.raised} of {self.pages} hugepages ({free} free)"
            return self
        self.dir = Path(tempfile.mkdtemp(prefix="dnsprobe-huge-"))
        # size=: the EAL of this mount takes no more than the pages reserved here (others may hold some too).
        mount = subprocess.run(["mount", "-t", "hugetlbfs", "-o", f"pagesize=2M,size={2 * self.pages}M", "none",
                                str(self.dir)], capture_output=True, text=True)
        if mount.returncode:
            self.skip_reason = f"cannot mount a hugetlbfs: {mount.stderr.strip()}"
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
        return self

    def files(self):
        return sorted(p.name for p in self.dir.iterdir()) if self.dir else []

    def __exit__(self, *exc):
        if self.dir is not None:
            subprocess.run(["umount", str(self.dir)], check=False)
            shutil.rmtree(self.dir, ignore_errors=True)
        if self.raised:
            self.NR.write_text(str(max(0, int(self.NR.read_text()) - self.raised)))


def _meminfo(key):
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


class Probe:
    def __init__(self, testbed, out_dir, *args, coremask="0x1", config=None, netns=None, command=None):
        """config: a YAML file naming the interfaces and the coremask instead of the flags; testbed None: no
        interface (dnstap sockets only, in args); netns: run it in this network namespace; command: what runs
        `dnsprobe capture` (default: this Python's `-m probe capture`)."""
        self.out_dir = Path(out_dir)
        where = ["-c", str(config)] if config else ["--coremask", coremask]
        if testbed is not None and not config:
            where += ["-i", testbed.iface]
        cmd = [*(command or [sys.executable, "-m", "probe", "capture"]), *where,
               "-o", str(out_dir), "--stats-interval", "0.3", "--no-progress", "-q", *map(str, args)]
        if netns:
            cmd = ["ip", "netns", "exec", netns, *cmd]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines = []
        self.ready = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stderr:
            self.lines.append(line)
            if "capturing on" in line:
                self.ready.set()
        self.ready.set()

    @property
    def stderr(self):
        return "".join(self.lines)

    def wait_ready(self):
        assert self.ready.wait(60), "probe did not start"
        assert self.proc.poll() is None, f"probe exited ({self.proc.returncode}):\n{self.stderr}"

    def stats(self):
        """This capture's statistics JSON (the one naming its pid, when captures share the directory)."""
        for f in sorted(self.out_dir.glob("*.stats.json")):
            try:
                doc = json.loads(f.read_text())
            except ValueError:  # taken (created empty), not written yet
                continue
            if doc.get("pid", self.proc.pid) == self.proc.pid:
                return doc
        return None

    def wait_for(self, predicate, what):
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            doc = self.stats()
            if doc is not None and predicate(doc):
                return doc
            assert self.proc.poll() is None, f"probe exited ({self.proc.returncode}) waiting for {what}:\n{self.stderr}"
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}; last stats: {self.stats()}\n{self.stderr}")

    def wait_counter(self, name, at_least):
        return self.wait_for(lambda d: d["counters"][name] >= at_least, f"{name} >= {at_least}")

    def workers_peak_rss_mib(self):
        """Each worker process's peak resident memory so far, by pid: VmHWM of /proc/PID/status, in MiB. (Hugetlb
        pages, which DPDK's processes share, are not in it; smaps_rollup counts them apart.)"""
        peaks = {}
        for pid in {w["pid"] for w in self.stats()["workers"].values()}:
            status = Path(f"/proc/{pid}/status").read_text()
            kib = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:"))
            peaks[pid] = round(kib / 1024, 1)
        return peaks

    def signal(self, sig):
        self.proc.send_signal(sig)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(60)
        finally:
            self.reader.join(5)
        return rc

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class DpdkProbe(Probe):
    """`dnsprobe capture --dpdk` as a subprocess: Probe, given a configuration file (which
    names no interface) and DPDK's flags instead of an interface."""

    def __init__(self, out_dir, dpdk_args, coremask="0x1", mbuf_size=2048):
        conf = Path(out_dir).parent / "dpdk.yml"
        conf.write_text(f"capture:\n  coremask: '{coremask}'\ndpdk:\n  mbuf_size: {mbuf_size}\n")
        super().__init__(None, out_dir, "--dpdk", f"--dpdk-args={dpdk_args}", config=conf)
