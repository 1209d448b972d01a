"""DPDK capture: one port, one RX queue per worker thread, frames handed over as FrameBatch.

The C side is probe.capture._dpdk (probe/capture/_dpdk.c), built only where libdpdk is found (docs/dpdk.md).
DpdkPort initialises DPDK's EAL (once per process: DPDK cannot be initialised twice) and sets up the port with
one RX queue per worker and symmetric RSS, so both directions of a flow reach the same queue. DpdkQueueSource
reads one queue: each read is one call into C that polls with the GIL released and returns the frames as bytes
(copied once out of the mbufs, which are freed at once), their timestamps (TSC at the burst, as nanoseconds
since the epoch) and their lengths.

EAL and device errors (bad arguments, no hugepages, a device that does not exist or cannot start) are
ConfigError (exit status 2), one line naming the problem with what EAL printed about it.
"""

import contextlib
import os
import shlex
import shutil
import sys
import tempfile

from probe import native
from probe.errors import ConfigError
from probe.model import LINKTYPE_ETHERNET, FrameBatch

_records = native.load("probe._records")

NOT_BUILT = (
    "DPDK support was not built into this dnsprobe: install DPDK's development files "
    "(apt-get install libdpdk-dev pkg-config), then reinstall dnsprobe (pip install -e .); see docs/dpdk.md"
)
# EAL options that choose the cores: capture.coremask does that, one worker thread per core.
CORE_OPTIONS = ("-c", "-l", "--lcores", "--main-lcore", "--master-lcore")
# What EAL prints that explains a failure (the rest is progress chatter or its usage text).
_ERROR_WORDS = ("fatal", "fail", "cannot", "couldn't", "could not", "unable", "invalid", "no such", "error",
                "unrecognized", "not ", "denied")


def load():
    """The C extension, or ConfigError saying it was not built and how to get it."""
    module = native.load("probe.capture._dpdk")
    if module is None:
        raise ConfigError(f"{NOT_BUILT} ({native.import_error('probe.capture._dpdk')})")
    return module


def available():
    try:
        load()
    except ConfigError:
        return False
    return True


def eal_args(dpdk_cfg, coremask):
    """The EAL argv: the cores from capture.coremask, then dpdk.args. Unless dpdk.args says otherwise, EAL
    logs notices and worse only, and its runtime files are private to this process (--file-prefix), so several
    dnsprobe instances (and other DPDK programs) can run side by side."""
    try:
        user = shlex.split(dpdk_cfg.args)
    except ValueError as exc:
        raise ConfigError(f"config key 'dpdk.args': {exc}: {dpdk_cfg.args!r}") from None
    for arg in user:
        name = arg.split("=", 1)[0]
        if name in CORE_OPTIONS or (name.startswith("-l") and not name.startswith("--")):
            raise ConfigError(
                f"config key 'dpdk.args': {arg!r}: give the cores with capture.coremask (--coremask), one worker "
                "per core"
            )
    args = ["dnsprobe", "-c", str(coremask), *user]
    if not any(a.startswith("--log-level") for a in user):
        args.append("--log-level=notice")
    if not any(a.startswith(("--file-prefix", "--in-memory")) for a in user):
        args.append(f"--file-prefix={own_prefix()}")
    return args


def own_prefix():
    return f"dnsprobe{os.getpid()}"


def remove_runtime_dir():
    """EAL's runtime directory of own_prefix() (left behind by EAL, also after a failed start)."""
    base = "/var/run" if os.geteuid() == 0 else os.environ.get("XDG_RUNTIME_DIR", "/tmp")
    shutil.rmtree(os.path.join(base, "dpdk", own_prefix()), ignore_errors=True)


@contextlib.contextmanager
def captured_output():
    """What C code writes to file descriptors 1 and 2 meanwhile, kept in a list of lines (EAL's messages)."""
    lines = []
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        try:
            os.dup2(tmp.fileno(), 1)
            os.dup2(tmp.fileno(), 2)
            yield lines
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            tmp.seek(0)
            lines += tmp.read().decode(errors="replace").splitlines()


def explain(lines):
    """The lines of EAL's output that say what went wrong, joined into one (usage text left out)."""
    seen = []
    for line in lines:
        text = line.strip()
        if not text or line[:1].isspace() or text.lower().startswith(("usage", "eal common options", "eal linux")):
            continue
        if any(w in text.lower() for w in _ERROR_WORDS) and text not in seen:
            seen.append(text)
    return "; ".join(seen[-4:])


def _dpdk_error(what, exc, lines):
    detail = explain(lines)
    message = f"DPDK: {what}: {exc}" + (f" ({detail})" if detail else "")
    if "hugepage" in message.lower():
        message += "; reserve hugepages (echo 1024 > /proc/sys/vm/nr_hugepages) or add --no-huge to dpdk.args"
    return ConfigError(message)


class DpdkPort:
    """The EAL and one started port with `queues` RX queues. close() stops and closes the port and cleans up
    the EAL; DPDK cannot be initialised again in the same process after that."""

    def __init__(self, dpdk_cfg, coremask, queues):
        self.lib = load()
        self.port_id = dpdk_cfg.port
        self.started = self.opened = False
        with captured_output() as lines:
            try:
                self.lib.eal_init(eal_args(dpdk_cfg, coremask))
            except self.lib.DpdkError as exc:
                failure = exc
            else:
                failure = None
        if failure is not None:
            remove_runtime_dir()
            raise _dpdk_error("cannot initialise the EAL", failure, lines)
        self.eal = True
        try:
            self._setup(dpdk_cfg, queues, lines)
        except BaseException:
            self.close()
            raise

    def _setup(self, dpdk_cfg, queues, eal_lines):
        count = self.lib.port_count()
        if self.port_id >= count:
            found = f"{count} port(s)" if count else "no port"
            detail = explain(eal_lines)
            raise ConfigError(
                f"config key 'dpdk.port': DPDK port {self.port_id} does not exist: EAL found {found} "
                "(PCI devices bound to a DPDK driver, see dpdk-devbind.py; --vdev devices in dpdk.args)"
                + (f"; EAL said: {detail}" if detail else "")
            )
        self.info = self.lib.port_info(self.port_id)
        self.name = self.info["name"]
        with captured_output() as lines:
            try:
                self.rss = self.lib.port_setup(
                    self.port_id, queues, dpdk_cfg.ring_size, dpdk_cfg.mempool_size, dpdk_cfg.mbuf_size,
                    dpdk_cfg.promiscuous,
                )
            except self.lib.DpdkError as exc:
                failure = exc
            else:
                failure = None
        self.opened = True
        if failure is not None:
            raise _dpdk_error(f"port {self.port_id} ({self.name})", failure, lines)
        self.started = True
        self.queues = queues
        if queues > 1 and not self.rss:
            print(f"dnsprobe: DPDK port {self.port_id} ({self.info['driver']}) has no RSS on IP/UDP/TCP: its driver "
                  "spreads frames over the queues its own way (net_af_packet: the kernel's symmetric fanout hash)",
                  file=sys.stderr, flush=True)

    def stats(self):
        """rte_eth_stats of the port: ipackets, imissed, ierrors, rx_nombuf."""
        return self.lib.port_stats(self.port_id)

    def close(self):
        """Stop and close the port, clean up the EAL (each once; errors while stopping are reported, not raised)."""
        steps = []
        if self.started:
            steps.append(("stop the port", self.lib.port_stop, (self.port_id,)))
        if self.opened:
            steps.append(("close the port", self.lib.port_close, (self.port_id,)))
        if getattr(self, "eal", False):
            steps.append(("clean up the EAL", self.lib.eal_cleanup, ()))
        self.started = self.opened = self.eal = False
        for what, fn, args in steps:
            try:
                fn(*args)
            except self.lib.DpdkError as exc:
                print(f"dnsprobe: DPDK: cannot {what}: {exc}", file=sys.stderr, flush=True)
        if steps:
            remove_runtime_dir()


class DpdkQueueSource:
    """One RX queue of a DpdkPort: a Source (probe.capture). read() returns a FrameBatch (possibly empty after
    timeout_us); the C call waits with the GIL released."""

    def __init__(self, port, queue):
        self.port_id = port.port_id
        self.queue = queue
        self.name = f"{port.name}/q{queue}"
        self._rx = port.lib.rx_burst
        # Packed batches (FrameBatch.packed: one copy of a burst's frames, no object per frame) where
        # probe._records is built.
        self._rx_packed = getattr(port.lib, "rx_burst_packed", None) if _records is not None else None
        self.frames = 0

    def read(self, max_frames, timeout_us=0):
        if self._rx_packed is not None:
            frames = _records.Frames()
            self.frames += self._rx_packed(self.port_id, self.queue, max_frames, timeout_us, frames)
            return FrameBatch(LINKTYPE_ETHERNET, packed=frames)
        data, ts_ns, wirelen = self._rx(self.port_id, self.queue, max_frames, timeout_us)
        self.frames += len(data)
        return FrameBatch(LINKTYPE_ETHERNET, ts_ns, wirelen, data)

    def fileno(self):
        return -1  # polled in C by read(timeout_us)

    def counters(self):
        return {"frames": self.frames}  # the port's counters are the port's (DpdkPort.stats)

    def close(self):
        pass  # the queues close with their port
