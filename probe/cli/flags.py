"""What the commands that run a pipeline (read, capture) share: config flags, output and config options, and
how flags become config overrides. Also the argument parser class every command uses."""

import argparse

from probe.cli.output import usage_error
from probe.config import Text
from probe.decode.ipfilter import check_network
from probe.errors import ConfigError


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and examples as written, at the terminal's width, which is asked for when help or usage is
    formatted: argparse makes a formatter for every argument a parser is given (to check its metavar), and the
    width (shutil, which imports zlib, bz2 and lzma) would be every command line's start-up time."""

    def __init__(self, prog, indent_increment=2, max_help_position=24, width=None):
        super().__init__(prog, indent_increment, max_help_position, width=80 if width is None else width)
        self._help_position_asked = max_help_position if width is None else None

    def format_help(self):
        if self._help_position_asked is not None:
            import shutil

            self._width = shutil.get_terminal_size().columns - 2  # (argparse's own width and help position)
            self._max_help_position = min(self._help_position_asked, max(self._width - 20, self._indent_increment * 2))
            self._help_position_asked = None
        return super().format_help()


class Parser(argparse.ArgumentParser):
    """Usage errors exit with status 2 and one line naming the command's --help (not argparse's usage block, which
    is 25 lines for `read`); descriptions and examples are printed as written."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):
        usage_error(message, self.prog)
        self.exit(2)

    def option_names(self):
        return [name for action in self._actions for name in action.option_strings]


def did_you_mean(word, choices):
    """` (did you mean 'read'?)` when a choice is close to word, else ''."""
    import difflib  # (here: only a mistyped command line pays for it)

    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def unknown_command(argv, commands):
    """The message for a COMMAND that is not one (the first word that is not an option), or None."""
    word = next((a for a in argv if not a.startswith("-")), None)
    if word is None or word in commands:
        return None
    return f"no command {word!r}{did_you_mean(word, commands)}; the commands are {', '.join(commands)}"


def unrecognized(command, extras, parsers):
    """The message for what a command's parser did not take (extras): an option of another command names that
    command, another option the closest of this command's, anything else is named as extra."""
    flag = next((a.partition("=")[0] for a in extras if a.startswith("-") and a != "-"), None)
    if flag is None:
        return f"unexpected argument(s): {' '.join(extras)}"
    others = [name for name, parser in parsers.items() if name != command and flag in parser.option_names()]
    if others:
        where = " and ".join(f"`dnsprobe {name}`" for name in others)
        return f"{flag} is an option of {where}, not of `dnsprobe {command}`"
    return f"no option {flag}{did_you_mean(flag, parsers[command].option_names())}"


def _network_arg(family):
    """argparse type of --ipv4-allow and the like: an address or CIDR prefix of the family, or a usage error
    naming the flag (exit 2)."""
    check = check_network(family)

    def network(text):
        try:
            return check(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return network


# Command-line flags that set config keys: (flag, key, argparse type, help, action).
CONFIG_FLAGS = (
    ("--format", "export.format", str, "output format: parquet or cdns (C-DNS, RFC 8618)", None),
    ("--query-timeout", "match.query_timeout", float, "seconds a query waits for its response", None),
    ("--dns-port", "decode.dns_ports", int, "DNS port (repeatable; replaces the configured list)", "append"),
    ("--parser", "decode.parser", str, "DNS parser: auto, fast, wire or dpkt", None),
    ("--rotate-records", "export.rotate_records", int, "close a file after N records (0: never)", None),
    ("--rotate-seconds", "export.rotate_seconds", float, "close a file after S seconds (0: never)", None),
    ("--row-group-size", "export.row_group_size", int, "Parquet rows per row group", None),
    ("--compression", "export.compression", str, "Parquet codec: zstd, snappy, gzip, brotli, lz4, none", None),
    ("--cdns-compression", "export.cdns_compression", str, "C-DNS whole-file compression: none, gzip, xz, zstd", None),
    ("--prefix", "export.file_prefix", str, "output file name prefix", None),
    ("--ipv4-allow", "filter.ipv4_allow", _network_arg(4), "keep only packets from/to this IPv4 address or CIDR"
     " prefix (repeatable)", "append"),
    ("--ipv4-deny", "filter.ipv4_deny", _network_arg(4), "drop packets from/to this IPv4 address or CIDR prefix"
     " (repeatable; unused with --ipv4-allow)", "append"),
    ("--ipv6-allow", "filter.ipv6_allow", _network_arg(6), "keep only packets from/to this IPv6 address or CIDR"
     " prefix (repeatable)", "append"),
    ("--ipv6-deny", "filter.ipv6_deny", _network_arg(6), "drop packets from/to this IPv6 address or CIDR prefix"
     " (repeatable; unused with --ipv6-allow)", "append"),
    ("--filter", "filter.expression", str, "BPF filter expression as tcpdump takes it, e.g. 'net 192.0.2.0/24'"
     " (compiled by libpcap; DNS on the DNS ports is still the only traffic kept)", None),
    ("--client-ipv4-prefix", "privacy.client_ipv4_prefix", int, "keep only the first N bits of client IPv4"
     " addresses", None),
    ("--client-ipv6-prefix", "privacy.client_ipv6_prefix", int, "keep only the first N bits of client IPv6"
     " addresses", None),
)


def add_pipeline_options(parser, config_flags, set_example, progress_what=None, quiet_what=None):
    """Options shared by the commands that run a pipeline (read, capture) and `config`: output, config, overrides;
    --progress and -q where the command says what they show."""
    parser.add_argument("-o", "--output", metavar="DIR", help="output directory (config export.directory)")
    parser.add_argument("-c", "--config", metavar="FILE", help="configuration file (default: the built-in defaults)")
    for flag, key, typ, help_, action in config_flags:
        parser.add_argument(flag, dest=key, type=typ, action=action, metavar=key.split(".")[1].upper(), help=help_)
    parser.add_argument(
        "--anonymize-key", metavar="FILE",
        help="anonymise client addresses with this cryptopANT key file (privacy.anonymize, privacy.key_file)",
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help=f"set any config key, e.g. --set {set_example} (VALUE as in a YAML file, read by the key's type)",
    )
    if progress_what is None:
        return
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--progress", dest="run.progress", action="store_const", const="always",
                       help=f"always show {progress_what}")
    group.add_argument("--no-progress", dest="run.progress", action="store_const", const="never",
                       help=f"never show {progress_what}")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help=f"print only errors: not {quiet_what}, nor {progress_what} unless --progress")


def overrides(args, extra_flags=()):
    """{config key: value} from the flags given: CONFIG_FLAGS, extra_flags (the same (flags, key, ...) shape), -o,
    --anonymize-key, --set KEY=VALUE (VALUE read by the key's type: probe.config.Text)."""
    out = {}
    for spec in (*CONFIG_FLAGS, *extra_flags):
        value = getattr(args, spec[1], None)
        if value is not None:
            out[spec[1]] = value
    if getattr(args, "run.progress", None):
        out["run.progress"] = getattr(args, "run.progress")
    if getattr(args, "output", None):
        out["export.directory"] = args.output
    if getattr(args, "anonymize_key", None):
        out["privacy.anonymize"] = True
        out["privacy.key_file"] = args.anonymize_key
    for item in getattr(args, "set", []):
        key, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
        out[key.strip()] = Text(raw)
    return out


