"""How the commands report: one-line errors on stderr, input checks, whether to show progress, and what a run ends
with (the statistics table, the rate, the files written; then its errors, last)."""

import sys
from pathlib import Path

from probe.errors import ConfigError

LINE_WIDTH = 80  # the statistics table fits a terminal this wide
NAMED_FILES = 3  # the files line names this many files at most, else counts them in their directory


def error(message):
    print(f"dnsprobe: error: {message}", file=sys.stderr)


def usage_error(message, prog="dnsprobe"):
    """A usage or configuration error (exit status 2): one line, and where to read about the command."""
    error(f"{message}; see {prog} --help")


def need_file(f, label=""):
    """A usage error (exit 2) unless f names an existing file."""
    path = Path(f)
    if path.is_dir():
        raise ConfigError(f"{label}{f}: is a directory, not a file")
    if not path.exists():
        raise ConfigError(f"{label}{f}: no such file")


def show_progress(cfg, args):
    """run.progress: always, never, or auto (when stderr is a terminal); -q (prints only errors) is never, unless
    --progress asks for it on the same command line."""
    if args.quiet and not getattr(args, "run.progress", None):
        return False
    return cfg.run.progress == "always" or (cfg.run.progress == "auto" and sys.stderr.isatty())


def nothing_read(stats):
    return not (stats.packets or stats.dnstap_frames or stats.dnstap_bytes or stats.expression_filtered)


def rate_line(stats, seconds, verb="read"):
    """What was read, how long it took and how fast: `read 20,000 packets (2.3 MB) in 1.21 s: 16,529 packets/s,
    9,473 records`."""
    what = []
    if stats.packets or not stats.dnstap_frames:
        what.append((stats.packets, "packets", f" ({stats.bytes / 1e6:,.1f} MB)"))
    if stats.dnstap_frames:
        what.append((stats.dnstap_frames, "dnstap messages", f" ({stats.dnstap_bytes / 1e6:,.1f} MB)"))
    seconds = max(seconds, 1e-3)
    read = " and ".join(f"{n:,} {unit}{size}" for n, unit, size in what)
    rates = ", ".join(f"{n / seconds:,.0f} {unit}/s" for n, unit, _ in what)
    return f"{verb} {read} in {seconds:,.2f} s: {rates}, {stats.records:,} records"


def files_line(directory, names, count=None, by_name=True):
    """`files written: DIR/A, DIR/B`, or `files written: N in DIR/` when they are more than NAMED_FILES (or are not
    known by their place: by_name False, a hive layout's partitions)."""
    count = len(names) if count is None else count
    if not count:
        return "files written: none"
    if by_name and len(names) == count <= NAMED_FILES:
        return "files written: " + ", ".join(str(Path(directory) / name) for name in names)
    return f"files written: {count:,} in {str(directory).rstrip('/')}/"


def read_in_part(errors, before="are counted"):
    """The exit status after what could be read was printed: 1, with a line on stderr for each file read only in
    part (errors: their CaptureFileErrors; the records before the problem `before`), else 0."""
    sys.stdout.flush()
    for exc in errors:
        error(f"{exc} (the records before it {before})")
    return 1 if errors else 0


def end_of_run(stats, source, files, errors=(), seconds=None, quiet=False, verb="read"):
    """What a run prints at its end: unless quiet, the statistics table (when something was read), the rate line
    (seconds given) and the files line (files: files_line's arguments), on stdout; then the errors, on stderr, last."""
    if not quiet:
        if not nothing_read(stats):
            from rich.console import Console

            stats.render_table(Console(file=sys.stdout, width=LINE_WIDTH), source)
            if seconds is not None:
                print(rate_line(stats, seconds, verb))
        print(files_line(*files))
    sys.stdout.flush()
    for message in errors:
        error(message)
