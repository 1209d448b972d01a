"""Which DNS parser a run uses (config decode.parser), and the C walker when it is built.

- fast: the decoders in C: the common frames straight to message records (probe/decode/_decoderec.c, the
  production pipeline), and the walker probe.decode._fastwire (probe/decode/_fastwire.c) for the DNS part of
  message tuples; the tests check both against the Python code message by message.
- wire: the Python walker, probe.decode.dnswire (the reference for the C code).
- dpkt: dpkt for every message, the walker where dpkt cannot parse (probe.decode.dpkt_parser).
- auto: fast when the extension is built, else wire, saying so once on stderr.
"""

import sys

from probe import native
from probe.decode.dnswire import MessageParser
from probe.errors import ConfigError

_fastwire = native.load("probe.decode._fastwire")  # None: not built (no compiler or Python headers at install)
IMPORT_ERROR = None if _fastwire is not None else native.import_error("probe.decode._fastwire")

CHOICES = ("auto", "fast", "wire", "dpkt")
NOT_BUILT = (
    "the C extension probe.decode._fastwire is not built (it needs a C compiler and Python's headers, on Debian"
    " gcc and python3-dev, at install time: pip install -e .)"
)
_warned = False


def check_choice(value):
    """The config check of decode.parser: 'fast' needs the extension."""
    if value == "fast" and _fastwire is None:
        raise ValueError(f"'fast' needs {NOT_BUILT}: {IMPORT_ERROR}")
    return value


def effective(value):
    """The parser that runs for decode.parser=value: fast, wire or dpkt."""
    if value == "auto":
        return "fast" if _fastwire is not None else "wire"
    return value


def resolve(value):
    """effective(value); says once per process when auto falls back to the Python walker, and raises
    ConfigError when fast is asked for but not built."""
    global _warned
    try:
        check_choice(value)
    except ValueError as exc:
        raise ConfigError(f"config key 'decode.parser': {exc}") from None
    name = effective(value)
    if value == "auto" and name == "wire" and not _warned:
        _warned = True
        print(
            f"dnsprobe: warning: decode.parser auto: {NOT_BUILT} ({IMPORT_ERROR}); decoding with the"
            " pure-Python walker, about ten times slower",
            file=sys.stderr,
            flush=True,
        )
    return name


class FastParser(MessageParser):
    """MessageParser with the C walker: the same names cache, the same bound."""

    def parse(self, buf):
        return _fastwire.parse_message(buf, self.names, self.max_names)


def make_parser(name, stats, keep_raw=True):
    """The DNS walker object of an effective parser name (resolve()): FastParser, MessageParser or DpktParser.
    Its parse(bytes) gives the DNS tuple; keep_raw=False makes it leave the raw field None (probe.model)."""
    if name == "dpkt":
        from probe.decode.dpkt_parser import DpktParser

        parser = DpktParser(stats)
    elif name == "fast":
        parser = FastParser()
    else:
        parser = MessageParser()
    if not keep_raw:
        parse = parser.parse
        parser.parse = lambda buf: parse(buf)[:-1] + (None,)
    return parser
