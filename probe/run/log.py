"""What a run prints on stderr: one-line log messages, and the status line of a capture on a terminal."""

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


def log(message):
    StatusLine.clear()
    print(f"dnsprobe: {message}", file=sys.stderr, flush=True)
