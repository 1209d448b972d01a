"""How the commands report: one-line errors on stderr, input checks, whether to show progress."""

import sys
from pathlib import Path

from probe.errors import ConfigError


def error(message):
    print(f"dnsprobe: error: {message}", file=sys.stderr)


def need_file(f, label=""):
    """A usage error (exit 2) unless f names an existing file."""
    path = Path(f)
    if path.is_dir():
        raise ConfigError(f"{label}{f}: is a directory, not a file")
    if not path.exists():
        raise ConfigError(f"{label}{f}: no such file")


def show_progress(cfg):
    """run.progress: always, never, or auto (when stderr is a terminal)."""
    return cfg.run.progress == "always" or (cfg.run.progress == "auto" and sys.stderr.isatty())
