"""An offline run: capture files → one pipeline, read in the order given as one continuous capture.

Files are pcap, pcapng or dnstap, recognised by content (probe.capture.files), and may be mixed: packets and
dnstap messages go through the same matching and into the same files, but never pair with each other (their
match scopes differ), and the dnstap_type column tells their rows apart (null for packets)."""

from pathlib import Path

from export.base import check_output_dir, stats_json_path
from probe.capture.files import open_file_source
from probe.errors import CaptureFileError
from probe.run.pipeline import Pipeline
from probe.stats import COUNTER_NAMES


def read_files(cfg, files, progress=None, on_error=None):
    """Run the pipeline over the capture files; returns (stats, errors, interrupted).

    progress: a callable (path, size or None) → a callable(position) or None, for a progress display;
    on_error: called with each CaptureFileError (that file's batches before the problem are kept).
    A KeyboardInterrupt stops the reading; what was decoded is still written."""
    out_dir = Path(cfg.export.directory)
    check_output_dir(out_dir)
    pipeline = Pipeline(cfg, out_dir)
    errors = []
    interrupted = False
    try:
        for f in files:
            size = Path(f).stat().st_size if Path(f).is_file() else None  # a pipe: a bar without an end
            on_progress = progress(f, size) if progress else None
            source = None
            try:
                source = open_file_source(f, cfg.run.batch_size, on_progress)
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
        interrupted = True
    stats = pipeline.finish()
    if cfg.run.stats_json:
        stats.write_json(
            stats_json_path(cfg.export, out_dir, pipeline.started),
            {
                **pipeline.summary(),
                "inputs": [str(f) for f in files],
                "errors": [str(e) for e in errors],
            },
        )
    return stats, errors, interrupted


def _add_counters(stats, counters):
    """A source's own counters that are statistics counters (dnstap bytes, stream errors), added to the run's."""
    for name, value in counters.items():
        if name in COUNTER_NAMES:
            setattr(stats, name, getattr(stats, name) + value)
