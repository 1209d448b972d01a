"""DPDK capture: a port's RX queues, read by one process per core (DPDK multi-process) or by threads of one.

The C side is probe.capture._dpdk (probe/capture/_dpdk.c), built only where libdpdk is found (docs/dpdk.md).
DPDK's EAL can be initialised once per process. Three shapes (probe.run.dpdk_worker runs them):

- DpdkPort in the primary process: it initialises the EAL, sets the port up and starts it. With several worker
  processes, either each reads an RX queue of its own (a device with RSS on the IP addresses: the symmetric key
  keeps both directions and every fragment of a flow on one queue), or the primary reads the device's queues and
  passes each frame of the other workers to their rings by the flow hash of its IP address pair, the one `read
  --workers` and the AF_PACKET fanout use (a device without that RSS, such as net_af_packet);
- DpdkSecondary in each other process: it attaches to the primary's EAL (--proc-type=secondary, same
  --file-prefix) and reads its ring, or its RX queue;
- one process with one thread per queue, when the EAL has no hugepage files to share (--no-huge, --in-memory):
  DpdkPort with a queue per thread.

Every source reads through a Poller (C): it polls with the GIL released and returns the frames as a
FrameBatch.packed that points into the mbufs, freed when the batch is released (DpdkSource.release), right after
the pipeline took it. EAL and device errors (bad arguments, no hugepages, a device that does not exist or cannot
start) are ConfigError (exit status 2), one line naming the problem with what EAL printed about it.
"""

import contextlib
import glob
import os
import shlex
import shutil
import sys
import tempfile

from probe import native
from probe.capture.dpdk_af_packet import DRIVERS as AF_PACKET_DRIVERS
from probe.capture.dpdk_af_packet import device_args, replace_sockets, ring_drops, ring_geometry
from probe.errors import ConfigError
from probe.model import LINKTYPE_ETHERNET, FrameBatch

_records = native.load("probe._records")

NOT_BUILT = (
    "DPDK support was not built into this dnsprobe: install DPDK's development files "
    "(apt-get install libdpdk-dev pkg-config), then reinstall dnsprobe (pip install -e .); see docs/dpdk.md"
)
# EAL options that choose the cores: capture.coremask does that, one worker per core.
CORE_OPTIONS = ("-c", "-l", "--lcores", "--main-lcore", "--master-lcore")
# EAL options without hugepage files, which DPDK's secondary processes attach to.
SINGLE_PROCESS_OPTIONS = ("--no-huge", "--in-memory")
# What EAL prints that explains a failure (the rest is progress chatter or its usage text).
_ERROR_WORDS = ("fatal", "fail", "cannot", "couldn't", "could not", "unable", "invalid", "no such", "error",
                "unrecognized", "not ", "denied")
WORKER_RING_SLOTS = 4096  # frames a worker's ring holds (distributing primary → secondary)
MEMPOOL_CACHE = 256  # mbufs each core keeps aside (_dpdk.c port_setup)
RX_CHUNK = 64  # frames asked of one rte_eth_rx_burst call (_dpdk.c RX_CHUNK; the DPDK tests compare them)
# Drivers that take an mbuf for each frame as they read it, rather than one per RX descriptor for as long as the
# queue is set up (a NIC's drivers).
MBUF_PER_READ_DRIVERS = (*AF_PACKET_DRIVERS, "net_pcap")


def load():
    """The C extension, or ConfigError saying it was not built and how to get it."""
    module = native.load("probe.capture._dpdk")
    if module is None:
        raise ConfigError(f"{NOT_BUILT} ({native.import_error('probe.capture._dpdk')})")
    if _records is None:
        raise ConfigError(f"DPDK capture needs probe._records, which does not import "
                          f"({native.import_error('probe._records')})")
    return module


def available():
    try:
        load()
    except ConfigError:
        return False
    return True


def user_args(dpdk_cfg):
    """dpdk.args split as the shell would, with the core options refused (capture.coremask gives the cores)."""
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
    return user


def multi_process(dpdk_cfg):
    """True when the EAL arguments let secondary processes attach (hugepage files: no --no-huge, --in-memory)."""
    return not any(a.split("=", 1)[0] in SINGLE_PROCESS_OPTIONS for a in user_args(dpdk_cfg))


def given_prefix(dpdk_cfg):
    """The --file-prefix of dpdk.args, or None."""
    user = user_args(dpdk_cfg)
    for i, arg in enumerate(user):
        if arg.startswith("--file-prefix="):
            return arg.split("=", 1)[1]
        if arg == "--file-prefix" and i + 1 < len(user):
            return user[i + 1]
    return None


def eal_args(dpdk_cfg, coremask, core=None, proc_type=None, prefix=None):
    """The EAL argv: the cores (`-c coremask`, or `-l core` for one process of several), the process type, then
    dpdk.args. Unless dpdk.args says otherwise, EAL logs notices and worse only, and its runtime files are private
    to this capture (--file-prefix: `prefix`, or this process's own), so several dnsprobe instances (and other
    DPDK programs) can run side by side."""
    user = user_args(dpdk_cfg)
    args = ["dnsprobe", *(["-c", str(coremask)] if core is None else ["-l", str(core)])]
    if proc_type:
        args.append(f"--proc-type={proc_type}")
    args += user
    if not any(a.startswith("--log-level") for a in user):
        args.append("--log-level=notice")
    if not any(a.startswith(("--file-prefix", "--in-memory")) for a in user):
        args.append(f"--file-prefix={prefix or own_prefix()}")
    return args


def own_prefix():
    return f"dnsprobe{os.getpid()}"


def _prefix_of(args):
    for arg in args:
        if arg.startswith("--file-prefix="):
            return arg.split("=", 1)[1]
    return None


def remove_runtime_dir(prefix=None):
    """EAL's runtime directory of a file prefix (own_prefix() by default; left behind by EAL, also after a failed
    start)."""
    base = "/var/run" if os.geteuid() == 0 else os.environ.get("XDG_RUNTIME_DIR", "/tmp")
    shutil.rmtree(os.path.join(base, "dpdk", prefix or own_prefix()), ignore_errors=True)


def hugepage_dirs():
    """The hugetlbfs mounts (where EAL keeps the hugepage files of its memory)."""
    try:
        with open("/proc/mounts") as fh:
            return [line.split()[1] for line in fh if line.split()[2:3] == ["hugetlbfs"]]
    except OSError:
        return []


def remove_runtime_files(prefix):
    """What an EAL of that file prefix leaves once its processes are gone: its runtime directory and its hugepage
    files (a primary that was killed cannot remove them, and they hold the pages)."""
    remove_runtime_dir(prefix)
    for d in hugepage_dirs():
        for path in glob.glob(os.path.join(glob.escape(d), glob.escape(prefix) + "map_*")):
            with contextlib.suppress(OSError):
                os.unlink(path)


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
        message += ("; reserve hugepages (echo 1024 > /proc/sys/vm/nr_hugepages) and mount a hugetlbfs, or add "
                    "--no-huge to dpdk.args (one process then reads every queue)")
    return ConfigError(message)


class _Eal:
    """This process's EAL (initialised in __init__; close() cleans it up, once)."""

    def __init__(self, args, what="cannot initialise the EAL"):
        self.lib = load()
        self.args = args
        self.prefix = _prefix_of(args)
        self.eal = False
        with captured_output() as lines:
            try:
                self.lib.eal_init(args)
            except self.lib.DpdkError as exc:
                failure = exc
            else:
                failure = None
        self.lines = lines
        if failure is not None:
            if "--proc-type=secondary" not in args:
                remove_runtime_dir(self.prefix)
            raise _dpdk_error(what, failure, lines)
        self.eal = True

    def _port(self, port_id):
        count = self.lib.port_count()
        if port_id >= count:
            found = f"{count} port(s)" if count else "no port"
            detail = explain(self.lines)
            raise ConfigError(
                f"config key 'dpdk.port': DPDK port {port_id} does not exist: EAL found {found} "
                "(PCI devices bound to a DPDK driver, see dpdk-devbind.py; --vdev devices in dpdk.args)"
                + (f"; EAL said: {detail}" if detail else "")
            )
        return self.lib.port_info(port_id)

    def _cleanup(self, steps):
        if self.eal:
            steps.append(("clean up the EAL", self.lib.eal_cleanup, ()))
        self.eal = False
        for what, fn, args in steps:
            try:
                fn(*args)
            except self.lib.DpdkError as exc:
                print(f"dnsprobe: DPDK: cannot {what}: {exc}", file=sys.stderr, flush=True)


def mbufs_needed(dpdk_cfg, queues, workers, mode, batch_size, driver=None):
    """The mbufs that can be in use at once: every RX descriptor of the queues (a read's chunk for the drivers that
    take an mbuf per frame read), each worker's batch (run.batch_size frames held until its pipeline took them), a
    distributing primary's rings, and the pool's per-core caches."""
    per_queue = RX_CHUNK if driver in MBUF_PER_READ_DRIVERS else dpdk_cfg.ring_size
    rings = (workers - 1) * WORKER_RING_SLOTS if mode == "distributor" else 0
    return queues * per_queue + workers * batch_size + rings + workers * MEMPOOL_CACHE


def pool_size(need):
    """dpdk.mempool_size 0: the smallest 2^n - 1 mbufs (the size DPDK's rings use best) that holds `need`. A pool
    larger than the mbufs in use at once only adds to the RSS as the pool cycles through them."""
    return (1 << need.bit_length()) - 1 if need & (need + 1) else need


class DpdkPort(_Eal):
    """The EAL of the primary (or only) process and one started port.

    queues: RX queues to set up (the one-process shape: one per thread); None: chosen for `workers` processes
    (mode "rss": one per worker, each read by its own process; "distributor": the device's queues, read by this
    process, which passes the others' frames to their rings; "single": one worker, every queue). fanout_id(ifname):
    the fanout group of a net_af_packet device's sockets when it has several queues. close() stops and closes the
    port and cleans up the EAL; DPDK cannot be initialised again in the same process after that."""

    def __init__(self, dpdk_cfg, args, queues=None, workers=1, fanout_id=None, batch_size=4096):
        super().__init__(args)
        self.port_id = dpdk_cfg.port
        self.started = self.opened = False
        self.ring_sockets, self.ring_dropped = [], 0  # net_af_packet: our sockets under the PMD, what they dropped
        try:
            self._setup(dpdk_cfg, queues, workers, fanout_id, batch_size)
        except BaseException:
            self.close()
            raise

    def _setup(self, dpdk_cfg, queues, workers, fanout_id, batch_size):
        lib = self.lib
        self.info = info = self._port(self.port_id)
        self.name = info["name"]
        af_packet = info["driver"] in AF_PACKET_DRIVERS
        rss = workers > 1 and info["rss_offloads"] & lib.RSS_IP and info["max_rx_queues"] >= workers
        if queues is not None:
            self.mode = "threads"
        elif workers == 1:
            self.mode, queues = "single", info["max_rx_queues"] if af_packet else 1
        elif rss:
            self.mode, queues = "rss", workers
        else:
            self.mode, queues = "distributor", info["max_rx_queues"] if af_packet else 1
        need = mbufs_needed(dpdk_cfg, queues, workers, self.mode, batch_size, info["driver"])
        self.mempool_size = dpdk_cfg.mempool_size or pool_size(need)
        with captured_output() as lines:
            try:
                self.rss = lib.port_setup(self.port_id, queues, dpdk_cfg.ring_size, self.mempool_size,
                                          dpdk_cfg.mbuf_size, dpdk_cfg.promiscuous)
            except lib.DpdkError as exc:
                failure = exc
            else:
                failure = None
        self.opened = True
        if failure is not None:
            raise _dpdk_error(f"port {self.port_id} ({self.name})", failure, lines)
        self.started = True
        self.queues = queues
        self.capacity = dpdk_cfg.ring_size
        self.frames_as_on_wire = None
        if af_packet:
            args = device_args(self.args, self.name) or {}
            self.capacity = ring_geometry(args)[3]
            group = fanout_id(args["iface"]) if fanout_id is not None and queues > 1 and "iface" in args else None
            why, self.ring_sockets = replace_sockets(lib, self.args, self.name, group)
            self.frames_as_on_wire = why is None
            if why:
                print(f"dnsprobe: DPDK port {self.port_id} ({self.name}): its packet sockets were left as the driver "
                      f"made them ({why}): IPv4 fragments arrive reassembled, and with several queues a fragment "
                      "can reach another queue than its flow", file=sys.stderr, flush=True)
        elif queues > 1 and not self.rss:
            print(f"dnsprobe: DPDK port {self.port_id} ({info['driver']}) has no RSS on the IP addresses: its driver "
                  "spreads frames over the queues its own way", file=sys.stderr, flush=True)
        if self.mode == "distributor":
            lib.make_rings(workers, WORKER_RING_SLOTS)
        if self.mempool_size < need:
            print(f"dnsprobe: dpdk.mempool_size {self.mempool_size} is below the {need} mbufs that the queues, "
                  "the workers' batches and rings can hold at once: under load, frames may be dropped for lack of "
                  "mbufs (dpdk_rx_nombuf)", file=sys.stderr, flush=True)

    def pollers(self):
        """The primary's poller (a list of one), or one per queue in the one-process shape."""
        lib, port = self.lib, self.port_id
        if self.mode == "threads":
            return [lib.port_poller(port, (q,), self.capacity, False) for q in range(self.queues)]
        if self.mode == "rss":
            return [lib.port_poller(port, (0,), self.capacity, False)]
        return [lib.port_poller(port, tuple(range(self.queues)), self.capacity, self.mode == "distributor")]

    def stats(self):
        """rte_eth_stats of the port: ipackets, imissed, ierrors, rx_nombuf; for net_af_packet, imissed is what the
        kernel dropped as the device's rings were full (the PMD reports none: dpdk_af_packet.ring_drops). Call it
        while the port is started (stopping it closes those sockets)."""
        st = self.lib.port_stats(self.port_id)
        if self.ring_sockets and self.started:
            self.ring_dropped += ring_drops(self.ring_sockets)
            st["imissed"] += self.ring_dropped
        return st

    def ring_stats(self):
        """Per worker 1..n-1 of a distributing primary: (frames passed to its ring, dropped as it was full,
        waiting in it)."""
        return self.lib.ring_stats() if self.mode == "distributor" else []

    def close(self):
        """Stop and close the port, clean up the EAL (each once; errors while stopping are reported, not raised)."""
        steps = []
        if self.started:
            steps.append(("stop the port", self.lib.port_stop, (self.port_id,)))
        if self.opened:
            steps.append(("close the port", self.lib.port_close, (self.port_id,)))
        had = bool(steps) or self.eal
        self.started = self.opened = False
        self._cleanup(steps)
        if had:
            remove_runtime_dir(self.prefix)


class DpdkSecondary(_Eal):
    """A secondary process of a capture: attached to the primary's EAL, it reads the ring the primary fills for
    worker `worker`, or (a device with RSS) the port's RX queue of that number."""

    def __init__(self, dpdk_cfg, args, worker):
        super().__init__(args, "cannot attach to the primary process")
        try:
            self.port_id = dpdk_cfg.port
            self.info = self._port(self.port_id)
            self.name = self.info["name"]
            try:
                self.poller = self.lib.ring_poller(worker)
                self.mode = "distributor"
            except self.lib.DpdkError:
                self.poller = self.lib.port_poller(self.port_id, (worker,), dpdk_cfg.ring_size, False)
                self.mode = "rss"
        except BaseException:
            self.close()
            raise

    def close(self):
        self._cleanup([])


class DpdkSource:
    """One Poller as a Source (probe.capture): read() returns a FrameBatch (possibly empty after timeout_us) whose
    frames point into their mbufs; release() frees them (call it once the pipeline has taken the batch)."""

    def __init__(self, poller, name, batch_timeout_ms):
        self.poller = poller
        self.name = name
        poller.hold_us = batch_timeout_ms * 1000

    def read(self, max_frames, timeout_us=0):
        frames = _records.Frames()
        self.poller.read(max_frames, timeout_us, frames)
        return FrameBatch(LINKTYPE_ETHERNET, packed=frames)

    @staticmethod
    def release(batch):
        batch.packed.clear()

    @property
    def frames(self):
        return self.poller.frames

    def fileno(self):
        return -1  # polled in C by read(timeout_us)

    def counters(self):
        return {"frames": self.poller.frames}

    def close(self):
        pass  # the queues close with their port
