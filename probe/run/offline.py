"""An offline run: capture files → pipelines, read in the order given as one continuous capture.

Files are pcap, pcapng or dnstap, recognised by content (probe.capture.files), and may be mixed: packets and
dnstap messages go through the same matching and into the same files, but never pair with each other (their
match scopes differ), and the dnstap_type column tells their rows apart (null for packets).

One worker (run.workers 1, the default): one pipeline in this process. Several (run.workers N, or run.coremask
with one worker per core, pinned): N forked processes, each reading every input and keeping the frames whose IP
address pair hashes to it (PacketDecoder.share, include/wire.h flow_hash, the same hash as live capture's
fanout program), so that both directions of a flow, every fragment of a datagram and whole TCP connections
meet in one worker; every worker still runs its capture clock (timeouts, rotation) on every frame, as one
worker would. The union of their transactions is the one-worker output (docs/usage.md says where bounds such
as match.max_pending can make a difference), their counters add up to its counters, and this process writes
the one statistics file. Each worker writes its own files (.w<k>). A dnstap file is read by one worker
(dnstap_worker, a hash of its name): its messages pair among themselves only.

A worker opens a regular, uncompressed input itself. Anything else, a compressed file or a pipe, this process
opens, decompresses once and copies into a pipe per worker (probe.run.tee), whose read end it hands to the
worker over a socket (SCM_RIGHTS) when it comes to that input: inputs are copied one at a time, in order, as the
workers read them.
"""

import os
import signal
import socket
import struct
import time
from pathlib import Path

from export import preload
from export.base import check_output_dir, stats_json_path
from probe.capture.files import input_kind, open_file_source
from probe.capture.pcapfile import PcapFileSource
from probe.capture.pcapfilter import FrameFilter
from probe.compressed import compression, open_stream
from probe.errors import CaptureFileError, ConfigError, DnsprobeError
from probe.run import tee
from probe.run.checks import read_workers
from probe.run.onclose import OnCloseCommands
from probe.run.pipeline import Pipeline
from probe.stats import COUNTER_NAMES, Stats
from probe.timeline import mark


def read_files(cfg, files, progress=None):
    """Run the pipeline(s) over the capture files; returns (stats, errors, interrupted).

    progress: a callable (path, size or None) → a callable(position) or None, for a progress display, closed (its
    close()) once every input is read; with several workers, worker 0's (each reads every input). A file's error
    (CaptureFileError) is among the errors returned; its batches before the problem are kept.
    SIGINT (a KeyboardInterrupt) or SIGTERM stops the reading; what was read is still written (a pipe's: everything
    that arrived before the signal, probe.capture.pcapfile)."""
    out_dir = Path(cfg.export.directory)
    check_output_dir(out_dir)
    workers, cores = read_workers(cfg.run)
    on_close = OnCloseCommands(cfg.export)  # before the workers are forked: they announce their files to it
    try:
        if workers > 1:
            return _read_parallel(cfg, files, out_dir, workers, cores, progress, on_close)
        if cores:
            os.sched_setaffinity(0, cores)
        on_close.start_thread()
        pipeline = Pipeline(cfg, out_dir, sources=read_sources(files))
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)  # SIGTERM as SIGINT: stop, write what was read
        try:
            errors, interrupted = _feed_files(pipeline, cfg, files, progress)
        finally:
            signal.signal(signal.SIGTERM, previous)
            if progress is not None:
                progress.close()
        stats = pipeline.finish()
        stats.files_written = pipeline.summary()["files_written"]
        interrupted = _finish_commands(on_close, stats) or interrupted
        if cfg.run.stats_json:
            _write_stats(cfg, out_dir, stats, pipeline.started, pipeline.summary(), files, errors)
        return stats, errors, interrupted
    finally:
        on_close.wait()  # (the files finished before an error get their command too)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def read_sources(files):
    """The source kinds the files of this reading record (export.filemeta): the kinds of its inputs, each once, in
    the order met (the pipeline adds the digest of the configuration when it makes its exporter)."""
    return tuple(dict.fromkeys(k for k in map(input_kind, files) if k is not None))


def _finish_commands(on_close, stats):
    """The end of the reading: wait for the export.on_close commands, and count them; True when the waiting was
    interrupted."""
    interrupted = on_close.wait()
    on_close.count(stats)
    return interrupted


def _feed_files(pipeline, cfg, files, progress=None, share=None, piped=None, stop=()):
    """Every batch of every file into the pipeline; returns (errors, interrupted). share: (k, n), this is read
    worker k of n: a dnstap file is read by its worker only (dnstap_worker). piped: a callable giving, for the index
    of an input, the file to read it from (a pipe from the parent), None (open it) or False (skip it: the parent
    reports why). stop: a read worker's interrupt flag (not empty once interrupted), looked at between batches: it
    stops a file the worker reads itself there, while a pipe from the parent is read to its end (the parent, also
    interrupted, closes it once it has passed on what it read)."""
    errors = []
    frame_filter = FrameFilter(cfg.filter.expression) if cfg.filter.expression else None
    try:
        for i, f in enumerate(files):
            if stop:
                return errors, True
            raw = None
            if piped is not None:
                raw = piped(i)
                if raw is False:
                    continue
            size = Path(f).stat().st_size if raw is None and Path(f).is_file() else None  # a pipe: a bar, no end
            on_progress = progress(f, size) if progress else None
            source = None
            try:
                source = open_file_source(f, cfg.run.batch_size, on_progress, raw, share)
                if share is not None and type(source) is not PcapFileSource:  # dnstap
                    if dnstap_worker(source.name, share[1]) != share[0]:
                        source.close()
                        source = None
                        continue
                while (batch := source.read()) is not None:
                    pipeline.feed(_filtered(frame_filter, batch, f) if frame_filter else batch, source.name)
                    if stop and raw is None:
                        return errors, True
            except CaptureFileError as exc:
                if stop:  # an input the parent stopped copying when it was interrupted
                    return errors, True
                errors.append(exc)
            finally:
                if source is not None:
                    _add_counters(pipeline.stats, source.counters())
                    source.close()
                if frame_filter is not None:
                    pipeline.stats.expression_filtered += frame_filter.rejected
                    frame_filter.rejected = 0
    except KeyboardInterrupt:
        return errors, True
    return errors, bool(stop)


def _filtered(frame_filter, batch, path):
    """The frames of the batch the filter expression keeps; an expression that does not fit the file's link type
    is that file's error (the run goes on with the next), not the run's (a refused output name stays exit 2)."""
    try:
        return frame_filter.keep(batch)
    except ConfigError as exc:
        raise CaptureFileError(path, str(exc)) from None


def dnstap_worker(name, n):
    """The read worker, of n, that reads the dnstap file `name` (its producer: its messages match among
    themselves only, probe.model NET_FIELDS scope)."""
    import zlib

    return zlib.crc32(name.encode("utf-8", "surrogateescape")) % n


def _write_stats(cfg, out_dir, stats, started, summary, files, errors, extra=None):
    stats.write_json(
        stats_json_path(cfg.export, out_dir, started),
        {**summary, "inputs": [str(f) for f in files], "errors": [str(e) for e in errors], **(extra or {})},
    )


def _opens_itself(path):
    """Whether a read worker opens the input itself: a regular file that is not compressed. The others (compressed
    files, pipes) are read once by the parent and copied to the workers."""
    p = Path(path)
    if not p.is_file():
        return False
    try:
        with open(p, "rb") as fh:
            return compression(fh.read(6)) is None
    except OSError:
        return True  # every worker meets the same problem and says so


def _start_workers(cfg, files, out_dir, workers, cores, copied, progress):
    """The read worker processes: (their Forked, the sockets of their inputs' pipes). A worker does not keep what
    the parent holds of the workers forked before it."""
    from probe.run.forked import Forked  # (and pickle: a parallel read's, imported before its forks)

    procs, commands = [], []
    for k in range(workers):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        core = cores[k] if cores else None
        args = (cfg, files, out_dir, k, workers, core, theirs, copied, progress if k == 0 else None)
        procs.append(Forked(_worker, args, close=[ours, *commands, *(p.results for p in procs)]))
        theirs.close()
        commands.append(ours)
    return procs, commands


def _results(k, proc):
    """Read worker k's results (_worker), or the error of a worker that ended without them."""
    results = proc.receive()
    if results is None:
        proc.ended(wait=True)
        raise DnsprobeError(f"read worker {k} ended without its results (exit status {proc.exitcode})")
    return results


def _merged_errors(files, results, copy_errors):
    """The input errors of a parallel read, once each, in the order of the inputs. Every worker reads every pcap
    file and meets the same errors in it; a dnstap file's are its worker's. An input the parent could not read to
    its end ended there for the workers too: its error is the parent's."""
    seen = {(str(e.path), e.problem): None for e in copy_errors}
    cut = {str(e.path) for e in copy_errors}
    for result in results:
        for e in result["errors"]:
            if str(e[0]) not in cut:
                seen.setdefault(tuple(e), None)
    order = {str(f): i for i, f in enumerate(files)}
    return [CaptureFileError(*e) for e in sorted(seen, key=lambda e: order.get(str(e[0]), len(order)))]


def _read_parallel(cfg, files, out_dir, workers, cores, progress, on_close):
    """read_files with `workers` processes (see the module docstring); on_close: the OnCloseCommands of the run."""
    copied = [i for i, f in enumerate(files) if not _opens_itself(f)]
    preload(cfg)
    mark("forking the read workers")
    procs, commands = _start_workers(cfg, files, out_dir, workers, cores, copied, progress)
    on_close.start_thread()
    interrupts = []

    def on_interrupt(signum, frame):
        # Passed on to the workers at once, before the pipes being copied into are closed: each stops reading where
        # it is (rather than at a cut input) and writes what it read.
        interrupts.append(signum)
        if len(interrupts) == 1:
            _signal(procs, signal.SIGINT)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_interrupt)
    previous_term = signal.signal(signal.SIGTERM, on_interrupt)
    copy_errors = []
    try:
        try:
            for i in copied:
                problem = _copy_input(files[i], i, commands)
                if problem is not None:
                    copy_errors.append(problem)
        except KeyboardInterrupt:
            pass
        for sock in commands:
            sock.close()
        results = [_results(k, proc) for k, proc in enumerate(procs)]
        for proc in procs:
            proc.ended(wait=True)
        mark("read workers joined")
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGTERM, previous_term)
        _signal(procs, signal.SIGTERM, wait=True)
    for result in results:
        if "fatal" in result:
            raise result["fatal"]
    stats = _merged_stats(results)
    errors = _merged_errors(files, results, copy_errors)
    interrupted = _finish_commands(on_close, stats) or bool(interrupts) or any(r["interrupted"] for r in results)
    if cfg.run.stats_json:
        summary = dict(results[0]["summary"])
        summary["files_written"] = stats.files_written
        summary["part_file"] = None
        started = min(r["started"] for r in results)
        # Each worker's part, as live capture's statistics give it (probe/run/supervisor.py).
        parts = {str(k): {"core": cores[k] if cores else None, "pid": procs[k].pid, "counters": r["counters"],
                          "files_written": r["summary"]["files_written"], "cpu_seconds": r["cpu_seconds"],
                          "seconds": r["seconds"]}
                 for k, r in enumerate(results)}
        _write_stats(cfg, out_dir, stats, started, summary, files, errors,
                     {"coremask": cfg.run.coremask or None, "workers": parts})
    return stats, errors, interrupted


def _signal(procs, signum, wait=False):
    """signum to the workers still running. SIGTERM when the parent gives up on them (a worker's failure, an error
    here: they write what they read; wait: and are waited for); SIGINT to pass an interrupt on (a terminal's ^C
    reached them too, a SIGINT to this process alone did not)."""
    for proc in procs:
        if not proc.ended():
            try:
                os.kill(proc.pid, signum)
            except ProcessLookupError:
                pass
            if wait:
                proc.ended(wait=True)


def _merged_stats(results):
    """The run's counters: the workers' added up; the files they wrote, by name."""
    stats = Stats()
    for result in results:
        part = Stats()
        for name, value in result["counters"].items():
            setattr(part, name, value)
        stats.add(part)
    stats.files_written = sorted(name for r in results for name in r["summary"]["files_written"])
    return stats


def _copy_input(path, index, commands):
    """Open the input (decompressing it), hand each worker the read end of a pipe of its own over its command socket,
    and copy the input into the pipes; returns the CaptureFileError that stopped it, or None. A worker that is gone
    is left out."""
    try:
        stream, raw = open_stream(path)
    except CaptureFileError as exc:
        for sock in commands:
            _send_pipe(sock, index, None)
        return exc
    try:
        fds = []
        for sock in commands:
            r, w = tee.pipe()
            if _send_pipe(sock, index, r):
                fds.append(w)
            else:
                os.close(w)
            os.close(r)
        return tee.copy(stream, path, fds, pipe=not raw.seekable())
    finally:
        stream.close()
        raw.close()


def _send_pipe(sock, index, fd):
    """Tell a worker where to read input `index` from: the pipe fd, or nowhere (fd None: the parent reports why).
    False when the worker is gone."""
    try:
        socket.send_fds(sock, [struct.pack("=i", index)], [] if fd is None else [fd])
    except OSError:
        return False
    return True


def _receive_pipe(sock, index):
    """The worker's side of _send_pipe: a file object reading input `index`, or False (skip it)."""
    data, fds, _, _ = socket.recv_fds(sock, 16, 1)
    if not data:
        raise DnsprobeError("the parent of this read worker went away")
    if struct.unpack("=i", data)[0] != index:
        raise DnsprobeError(f"read worker expected input {index}, got {struct.unpack('=i', data)[0]}")
    return os.fdopen(fds[0], "rb", buffering=tee.CHUNK) if fds else False


def _add_counters(stats, counters):
    """A source's own counters that are statistics counters (dnstap bytes, stream errors), added to the run's."""
    for name, value in counters.items():
        if name in COUNTER_NAMES:
            setattr(stats, name, getattr(stats, name) + value)


def _worker(cfg, files, out_dir, k, n, core, commands, copied, progress):
    """One read worker (a forked process, probe.run.forked): its share of every file through its own pipeline;
    returns (its results as plain data, for the parent; its exit status). The inputs whose indexes are in `copied`
    it reads from the pipes the parent gives it on the socket `commands`. progress: worker 0's display of its
    reading (read_files)."""
    # A terminal's ^C reaches every process, and the parent passes it on too. It stops the reading between two
    # batches, not wherever the worker is (a KeyboardInterrupt in the exporter could leave its file half done).
    stop = []
    signal.signal(signal.SIGINT, lambda signum, frame: stop.append(signum))
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))  # (a service manager's stop, the group)
    copied = set(copied)

    def piped(i):
        if i not in copied:
            return None
        try:
            return _receive_pipe(commands, i)
        except DnsprobeError:
            if stop:  # the parent, interrupted, sends no more inputs
                return False
            raise

    mark(f"read worker {k} started")
    began = time.monotonic()
    try:
        if core is not None:
            os.sched_setaffinity(0, {core})
        pipeline = Pipeline(cfg, out_dir, worker_id=k, share=(k, n), sources=read_sources(files))
        try:
            errors, interrupted = _feed_files(pipeline, cfg, files, progress, share=(k, n), piped=piped, stop=stop)
        finally:
            if progress is not None:
                progress.close()
        commands.close()
        stats = pipeline.finish()
        mark(f"read worker {k} finished")
        import resource

        usage = resource.getrusage(resource.RUSAGE_SELF)
        return {
            "counters": stats.as_dict(),
            "errors": [(e.path, e.problem) for e in errors],
            "summary": pipeline.summary(),
            "interrupted": interrupted,
            "started": pipeline.started,
            "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 3),  # (the fork's, not the parent's before it)
            "seconds": round(time.monotonic() - began, 3),
        }, 0
    except Exception as exc:  # noqa: BLE001 - everything goes back to the parent, which raises it
        return {"fatal": exc}, 1
