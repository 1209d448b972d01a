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
"""

import multiprocessing
import os
import signal
import sys
import zlib
from pathlib import Path

from export.base import check_output_dir, stats_json_path
from probe.capture.dnstap_file import DnstapFileSource
from probe.capture.files import open_file_source
from probe.errors import CaptureFileError, ConfigError, DnsprobeError
from probe.run.checks import parse_coremask
from probe.run.pipeline import Pipeline
from probe.stats import COUNTER_NAMES, Stats


def read_files(cfg, files, progress=None, on_error=None):
    """Run the pipeline(s) over the capture files; returns (stats, errors, interrupted).

    progress: a callable (path, size or None) → a callable(position) or None, for a progress display (one
    worker only); on_error: called with each CaptureFileError (that file's batches before the problem are kept).
    A KeyboardInterrupt stops the reading; what was decoded is still written."""
    out_dir = Path(cfg.export.directory)
    check_output_dir(out_dir)
    cores = parse_coremask(cfg.run.coremask, "run.coremask") if cfg.run.coremask else None
    workers = len(cores) if cores else cfg.run.workers
    if workers > 1:
        return _read_parallel(cfg, files, out_dir, workers, cores, on_error)
    if cores:
        os.sched_setaffinity(0, cores)
    pipeline = Pipeline(cfg, out_dir)
    errors, interrupted = _feed_files(pipeline, cfg, files, progress, on_error)
    stats = pipeline.finish()
    if cfg.run.stats_json:
        _write_stats(cfg, out_dir, stats, pipeline.started, pipeline.summary(), files, errors)
    return stats, errors, interrupted


def _feed_files(pipeline, cfg, files, progress=None, on_error=None, share=None):
    """Every batch of every file into the pipeline; returns (errors, interrupted). share: (k, n), this is read
    worker k of n: a dnstap file is read by its worker only (dnstap_worker)."""
    errors = []
    try:
        for f in files:
            size = Path(f).stat().st_size if Path(f).is_file() else None  # a pipe: a bar without an end
            on_progress = progress(f, size) if progress else None
            source = None
            try:
                source = open_file_source(f, cfg.run.batch_size, on_progress)
                if share is not None and type(source) is DnstapFileSource:
                    if dnstap_worker(source.name, share[1]) != share[0]:
                        source.close()
                        source = None
                        continue
                while (batch := source.read()) is not None:
                    pipeline.feed(batch, source.name)
            except CaptureFileError as exc:
                errors.append(exc)
                if on_error:
                    on_error(exc)
            finally:
                if source is not None:
                    _add_counters(pipeline.stats, source.counters())
                    source.close()
    except KeyboardInterrupt:
        return errors, True
    return errors, False


def dnstap_worker(name, n):
    """The read worker, of n, that reads the dnstap file `name` (its producer: its messages match among
    themselves only, probe.model NET_FIELDS scope)."""
    return zlib.crc32(name.encode("utf-8", "surrogateescape")) % n


def _write_stats(cfg, out_dir, stats, started, summary, files, errors, extra=None):
    stats.write_json(
        stats_json_path(cfg.export, out_dir, started),
        {**summary, "inputs": [str(f) for f in files], "errors": [str(e) for e in errors], **(extra or {})},
    )


def _read_parallel(cfg, files, out_dir, workers, cores, on_error):
    """read_files with `workers` processes (see the module docstring)."""
    for f in files:
        if not Path(f).is_file():
            raise ConfigError(
                f"config key 'run.workers': {workers} workers read every input themselves, and {f} is not a"
                " regular file (a pipe can be read once: read it with one worker)"
            )
    ctx = multiprocessing.get_context("fork")
    procs, conns = [], []
    for k in range(workers):
        receive, send = ctx.Pipe(duplex=False)
        core = cores[k] if cores else None
        proc = ctx.Process(target=_worker, args=(cfg, files, out_dir, k, workers, core, send), daemon=True)
        proc.start()
        send.close()
        procs.append(proc)
        conns.append(receive)
    results = []
    interrupted = False
    for k, conn in enumerate(conns):
        while True:
            try:
                results.append(conn.recv())
                break
            except KeyboardInterrupt:  # (the workers got it too: they stop reading and write what they have)
                interrupted = True
            except EOFError:
                procs[k].join()
                raise DnsprobeError(
                    f"read worker {k} ended without its results (exit status {procs[k].exitcode})"
                ) from None
    for proc in procs:
        proc.join()
    for result in results:
        if "fatal" in result:
            raise result["fatal"]
    stats = Stats()
    for result in results:
        part = Stats()
        for name, value in result["counters"].items():
            setattr(part, name, value)
        stats.add(part)
    # Every worker reads every pcap file and meets the same errors in it; a dnstap file's are its worker's.
    seen = {}
    for result in results:
        for e in result["errors"]:
            seen.setdefault(tuple(e), None)
    order = {str(f): i for i, f in enumerate(files)}
    errors = [CaptureFileError(*e) for e in sorted(seen, key=lambda e: order.get(str(e[0]), len(order)))]
    for exc in errors:
        if on_error:
            on_error(exc)
    interrupted = interrupted or any(r["interrupted"] for r in results)
    if cfg.run.stats_json:
        summary = dict(results[0]["summary"])
        summary["files_written"] = sorted(name for r in results for name in r["summary"]["files_written"])
        summary["part_file"] = None
        started = min(r["started"] for r in results)
        _write_stats(cfg, out_dir, stats, started, summary, files, errors, {"workers": workers})
    return stats, errors, interrupted


def _add_counters(stats, counters):
    """A source's own counters that are statistics counters (dnstap bytes, stream errors), added to the run's."""
    for name, value in counters.items():
        if name in COUNTER_NAMES:
            setattr(stats, name, getattr(stats, name) + value)


def _worker(cfg, files, out_dir, k, n, core, conn):
    """One read worker (a forked process): its share of every file through its own pipeline; its results, as
    plain data, to the parent."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        if core is not None:
            os.sched_setaffinity(0, {core})
        pipeline = Pipeline(cfg, out_dir, worker_id=k)
        pipeline.decoder.share = (k, n)
        errors, interrupted = _feed_files(pipeline, cfg, files, share=(k, n))
        stats = pipeline.finish()
        conn.send({
            "counters": stats.as_dict(),
            "errors": [(e.path, e.problem) for e in errors],
            "summary": pipeline.summary(),
            "interrupted": interrupted,
            "started": pipeline.started,
        })
    except Exception as exc:  # noqa: BLE001 - everything goes back to the parent, which raises it
        conn.send({"fatal": exc})
        sys.exit(1)
    conn.close()
