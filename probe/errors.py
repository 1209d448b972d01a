"""Error types that the CLI turns into a one-line message and an exit status (never a traceback)."""


class DnsprobeError(Exception):
    """Base class; `exit_status` is what the command returns."""

    exit_status = 1


class ConfigError(DnsprobeError):
    """A usage or configuration error: unknown key, wrong type, impossible value (exit 2)."""

    exit_status = 2


class CaptureFileError(DnsprobeError):
    """An input capture file that cannot be read (corrupt, truncated, unknown link type)."""

    def __init__(self, path, problem):
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


class OutputError(DnsprobeError):
    """The output cannot be written (directory missing or read-only, disk full)."""
