"""What a run prints on stderr: one-line log messages, and the status line of a capture on a terminal.

Log lines start with the time (UTC, to the millisecond), except under systemd's journal, which stamps every
line itself: it says so in JOURNAL_STREAM (the device and inode of the stream it gave us as stderr)."""

import datetime
import os
import sys


class StatusLine:
    """A line rewritten in place (\\r); log() clears it first so that messages are never mixed into it."""

    active = False

    @classmethod
    def show(cls, text):
        sys.stderr.write("\r\x1b[K" + text)
        sys.stderr.flush()
        cls.active = True

    @classmethod
    def clear(cls):
        if cls.active:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
            cls.active = False


def under_journald():
    """stderr is the stream systemd's journal gave us (systemd.exec(5), $JOURNAL_STREAM)."""
    stream = os.environ.get("JOURNAL_STREAM", "")
    dev, _, ino = stream.partition(":")
    try:
        st = os.fstat(sys.stderr.fileno())
        return bool(ino) and (st.st_dev, st.st_ino) == (int(dev), int(ino))
    except (OSError, ValueError, AttributeError):
        return False


def log_prefix():
    if under_journald():
        return "dnsprobe: "
    now = datetime.datetime.now(datetime.timezone.utc)
    return f"{now:%Y-%m-%dT%H:%M:%S}.{now.microsecond // 1000:03d}Z dnsprobe: "


def log(message):
    StatusLine.clear()
    print(f"{log_prefix()}{message}", file=sys.stderr, flush=True)
