"""What the exporters share: the Exporter interface, file names, .part files, rotation, output errors.

Files are written as NAME.part (live Parquet: the journal NAME.journal, export.parquet.journal; in the hive
layout .NAME.part and .NAME.journal, names engines skip) and renamed to NAME when complete; NAME is
<prefix><UTC start YYYYmmdd.HHMMSS.ffffff>.w<worker>[.N]<suffix>, the start being the capture time of the file's
first row, and .N counting the files of one run that start in the same microsecond. A name is a function of
the input, so that the same input read twice meets its own names: reading files, a name that exists (finished,
or being written) is refused (ConfigError, exit 2), unless export.overwrite, which replaces the file; live
capture never reads the same packets twice, and a name an earlier run left (a restart in the same microsecond)
is kept beside with the next free .N. Every name is taken by creating its live file exclusively, so two runs
writing into one directory never write one file, even when they start at the same moment.

Rotation is decided here, in FileExporter, for every format: a file is closed export.rotate_seconds of capture
time after its first record (due()), once it holds export.rotate_records records, and once it holds
export.rotate_bytes bytes. A format's writer only opens and closes its files and says what each holds
(OutputFile.rows, OutputFile.size()).

A file is finished once it has its final name: it is announced to the run there, by the code that renamed it (the
exporter's _close, the thread that converts or compresses a file, export.recovery for a dead writer's files), and
the run's export.on_close command ships it (probe.run.onclose).
"""

import datetime
import errno
import fcntl
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from probe.errors import ConfigError, OutputError

if TYPE_CHECKING:
    from export.metrics import DnsMetrics


class Exporter(Protocol):
    """The export stage's interface, as the pipeline (probe.run.pipeline) uses it. Every exporter is made as
    cls(cfg, directory, worker_id, stats, client=None, live=False, metrics=None, tx_records=False, origin=None)
    (export.make_exporter)."""

    completed: list  # final paths of the files closed so far
    metrics: "DnsMetrics | None"  # export.metrics.DnsMetrics counting what is written (Prometheus), or None

    def write(self, txs, address_events=None, now_ns=None):
        """Append completed transactions (and, for C-DNS, the decoder's address events)."""

    def is_open(self) -> bool:
        """A file is open."""

    def due(self, now_ns) -> bool:
        """An open file has reached its time limit (capture time now_ns)."""

    def rotate(self):
        """Close the open files now; the next rows open new ones."""

    def reload(self):
        """Read again what the rows are enriched from (databases, lists) when it changed on disk: at rotation."""

    def close(self):
        """End of output: close, and wait for anything still finishing the files."""

    def flush(self):
        """Put every row handed over so far into the file being written, readable (live capture)."""

    def unwritten(self) -> int:
        """Rows handed over and not yet in the file (flush() writes them)."""

    def live_files(self) -> list:
        """Files still being written or finished (NAME.part, NAME.journal)."""


# What a file being written is called until it is complete: NAME + one of these.
LIVE_SUFFIXES = (".part", ".journal")


def file_stamp(ts_ns):
    t = datetime.datetime.fromtimestamp(ts_ns // 1_000_000_000, datetime.timezone.utc)
    return t.strftime("%Y%m%d.%H%M%S") + f".{(ts_ns // 1000) % 1_000_000:06d}"


def live_path(final, suffix, hidden=False):
    """The name of the file being written that becomes final: NAME+suffix, or .NAME+suffix when hidden (the hive
    layout: Spark, Hive, Trino and pyarrow ignore names starting with '.' or '_')."""
    return final.with_name(f".{final.name}{suffix}") if hidden else Path(f"{final}{suffix}")


def hidden_part(path):
    """The name of a file being written in the hive layout: .NAME.part, which engines reading the dataset skip."""
    return live_path(path, ".part", hidden=True)


def name_in_use(path):
    """path, or the live name of it (NAME.part, NAME.journal, .NAME.part, .NAME.journal) that exists; None: neither
    does."""
    names = [path] + [live_path(path, s, h) for s in LIVE_SUFFIXES for h in (False, True)]
    return next((p for p in names if p.exists()), None)


def take(path):
    """Create path exclusively (empty): the name is this run's. False when another run took it first."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except FileExistsError:
        return False
    return True


def free_path(directory, base, suffix):
    """DIR/BASE+SUFFIX, or DIR/BASE.N+SUFFIX with the first N that is free (name_in_use), taken by creating it.

    For the statistics JSON, named after the run's start to the second: two runs in one second each keep theirs."""
    directory = Path(directory)
    seq = 0
    while True:
        path = directory / (f"{base}{suffix}" if not seq else f"{base}.{seq}{suffix}")
        seq += 1
        if name_in_use(path) is None and take(path):
            return path


def stats_json_path(export_cfg, directory, started):
    """Where a run's statistics JSON goes: _PREFIX<UTC start to the second>.stats.json in the output directory,
    made unique and taken (created empty) at once: call it when the file is about to be written. The leading '_'
    is Hadoop's mark of a file that is not data: Spark, Hive, Trino and pyarrow reading the directory skip it, in
    either layout."""
    stamp = time.strftime("%Y%m%d.%H%M%S", time.gmtime(started))
    return free_path(directory, f"_{export_cfg.file_prefix}{stamp}", ".stats.json")


# Where finished files are announced: the write end of the run's pipe (probe.run.onclose), set before the run starts
# the processes that write files, which inherit it (fork). None: nothing listens (no export.on_close).
_announce_fd = None


def announce_finished_to(fd):
    """Announce every file finished from now on, in this process and the ones it forks, on fd (None: stop)."""
    global _announce_fd
    _announce_fd = fd


def announce_finished(path):
    """The file is complete under its final name: tell the run (its absolute path, NUL-terminated; one write of
    up to PIPE_BUF bytes, so processes writing at once never interleave their names)."""
    if _announce_fd is None:
        return
    data = os.fsencode(os.path.abspath(path)) + b"\0"
    try:
        while data:
            data = data[os.write(_announce_fd, data):]
    except OSError as exc:  # (the file itself is fine: not an output error)
        print(f"dnsprobe: {path}: not announced to export.on_close: {exc}", file=sys.stderr, flush=True)


def lock_live_file(path):
    """An exclusive lock on a file being written, held by the returned descriptor until it is closed (or the
    process ends): a file whose lock can be taken is no one's, and can be recovered (export.recovery)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise
    return fd


def off_capture_cores():
    """Let the calling thread (one that compresses or converts a file) run on any core: a live-capture worker
    is pinned to its core, and such work should not take that core's time (Linux affinity is per thread)."""
    try:
        os.sched_setaffinity(0, range(os.cpu_count() or 1))
    except (OSError, AttributeError, ValueError):
        pass


def check_output_dir(directory):
    """Fail early, with the reason, when the output directory cannot be written."""
    path = Path(directory)
    if not path.exists():
        raise ConfigError(f"output directory {path} does not exist")
    if not path.is_dir():
        raise ConfigError(f"output path {path} is not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"output directory {path} is not writable")


def tx_time_ns(tx):
    """Capture time of a transaction: its query's, else its response's."""
    m = tx[0] if tx[0] is not None else tx[1]
    return m[0]


class OutputFile:
    """A file being written, as rotation sees it: its names, the capture time of its first row, the rows
    its writer has put in it and the bytes it holds (size(), each format's own measure)."""

    def __init__(self, final_path, part_path, start_ns):
        self.final_path = final_path
        self.part_path = part_path
        self.start_ns = start_ns
        self.rows = 0  # rows handed to the file (export.rotate_records counts them)

    def size(self):
        """Bytes the file holds (export.rotate_bytes)."""
        raise NotImplementedError


class FileExporter:
    """What the file exporters share: names, .part paths, rotation, output errors.

    A format's writer (a subclass) makes its OutputFile in _new_file(key, ts_ns) and finishes it in _close(file);
    it gets the open file with _open(ts_ns, key), adds to file.rows what it puts in it, puts no more rows
    in it than _room() allows, and calls _end_if_full() where the file may have reached its rows or bytes
    (after a row group, a block). One file is open per key: the partition of the hive layout, else None.
    A _close may leave the file to a thread of its own (compressing, converting, renaming): _finish_in_thread."""

    suffix = ""
    live_suffix = ".part"  # what the file is called while it is written: NAME + this

    def __init__(self, cfg, directory, worker_id, stats, metrics=None, live=False):
        """live: the transactions come from live capture, whose file names are never refused nor replaced
        (_take_name)."""
        self.cfg = cfg.export
        self.dir = Path(directory)
        self.worker_id = worker_id
        self.stats = stats
        self.files = {}  # key → OutputFile open, in order of opening
        self.file_start_ns = None  # capture time of the newest file's first row
        self.completed = []  # final paths of closed files
        self.metrics = metrics
        self.live = live
        self.named = {}  # (directory, NAME without .N and suffix) → files this run has named so
        self.finishing = []  # closed files that a thread of their own still finishes, in order of closing

    @property
    def part_path(self):
        """The name of the newest file being written (None: none is open)."""
        return next(reversed(self.files.values())).part_path if self.files else None

    def is_open(self):
        return bool(self.files)

    def due(self, now_ns):
        """True when an open file has reached its time limit."""
        if self.cfg.rotate_seconds <= 0:
            return False
        limit = int(self.cfg.rotate_seconds * 1e9)
        return any(now_ns - f.start_ns >= limit for f in self.files.values())

    def rotate(self):
        for key in list(self.files):
            self._end(key)

    def reload(self):
        pass  # (a format whose rows are enriched reads its databases again)

    def close(self):
        self.rotate()
        for f in self.finishing:
            f.join()
        self._reap()

    def flush(self):
        pass

    def unwritten(self):
        return 0

    def live_files(self):
        self._reap()  # (a file may have been finished since: it is then completed, not live)
        return [f.part_path for f in self.finishing] + [f.part_path for f in self.files.values()]

    # -- rotation --

    def _open(self, ts_ns, key=None):
        """The open file of key; a new one, starting at capture time ts_ns, when there is none."""
        f = self.files.get(key)
        if f is None:
            f = self.files[key] = self._new_file(key, ts_ns)
            self.file_start_ns = ts_ns
        return f

    def _room(self, f, rows):
        """How many of `rows` rows the file f takes before it holds export.rotate_records."""
        limit = self.cfg.rotate_records
        return min(rows, limit - f.rows) if limit else rows

    def _over_size(self, f):
        return 0 < self.cfg.rotate_bytes <= f.size()

    def _full(self, f):
        """The file f is complete: it holds export.rotate_records rows or export.rotate_bytes bytes."""
        return (0 < self.cfg.rotate_records <= f.rows) or self._over_size(f)

    def _end_if_full(self, key=None):
        """Close the file of key when it is full; True when it was."""
        f = self.files.get(key)
        if f is None or not self._full(f):
            return False
        self._end(key)
        return True

    def _end(self, key):
        self._close(self.files.pop(key))

    def _finish_in_thread(self, f):
        """The closed file f is finished by a thread of its own, which renames it and announces it: f.done() once
        it has ended, f.join() waits for it, f.error is the OSError it met (None: none). _reap accounts for it."""
        self.finishing.append(f)
        self._reap()

    def _reap(self):
        """Account for the files whose thread has finished (_thread_finished), in order; raise the first error."""
        while self.finishing and self.finishing[0].done():
            f = self.finishing.pop(0)
            if f.error is not None:
                raise self._output_error(f.error, f.part_path)
            self._thread_finished(f)

    def _thread_finished(self, f):
        self._finished(f.final_path, announced=True)

    def _finished(self, final_path, announced=False):
        """A file is complete and renamed: counted, and announced (export.on_close) unless the thread that
        renamed it has done so already (announced: at once, whatever happens to this process after)."""
        self.completed.append(final_path)
        self.stats.files += 1
        if not announced:
            announce_finished(final_path)

    # -- what a format's writer provides --

    def _new_file(self, key, ts_ns):
        """Open a file of key starting at capture time ts_ns (its name: _take_name) and return its OutputFile."""
        raise NotImplementedError

    def _close(self, f):
        """Finish the file f (no longer in self.files): write what it still waits for, close it, rename it."""
        raise NotImplementedError

    def _take_name(self, directory, ts_ns, hidden=False):
        """(final path, live path) of a new file in directory starting at ts_ns; the live one is created here,
        empty, so that no other run takes the name. A name this run gave already gets the next .N (files of one
        rotation starting in the same microsecond); one that exists otherwise is an earlier run's (see the module
        docstring)."""
        base = f"{self.cfg.file_prefix}{file_stamp(ts_ns)}.w{self.worker_id}"
        key = (str(directory), base)
        while True:
            seq = self.named.get(key, 0)
            self.named[key] = seq + 1
            final = Path(directory) / (f"{base}.{seq}{self.suffix}" if seq else f"{base}{self.suffix}")
            part = live_path(final, self.live_suffix, hidden)
            try:
                if self._may_take(final, part) and take(part):
                    return final, part
            except OSError as exc:
                raise self._output_error(exc, directory) from None
            if not self.live:  # another run took the name since we looked
                raise self._name_exists(part)

    def _may_take(self, final, part):
        """Whether the name final may be written: it is not in use, or export.overwrite replaces it (a live file of
        it left by an interrupted run is removed). Live capture passes on to the next .N; reading files, a name in
        use is refused."""
        found = name_in_use(final)
        if found is None:
            return True
        if self.live:
            return False
        if not self.cfg.overwrite:
            raise self._name_exists(found)
        if part.exists():
            part.unlink()
        return True  # (the finished file is replaced when ours is renamed to it)

    def _name_exists(self, path):
        return ConfigError(f"{path} exists (this input written there before?): not written twice; --overwrite"
                           " (export.overwrite) replaces it")

    def _output_error(self, exc, where=None):
        where = where or self.part_path or self.dir
        if getattr(exc, "errno", None) == errno.ENOSPC or "No space" in str(exc):
            return OutputError(f"{where}: disk full; the .part file holds the rows written so far")
        return OutputError(f"{where}: cannot write: {exc}")
