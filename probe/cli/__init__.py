"""The `dnsprobe` command.

Exit status: 0 success; 1 an input file could not be (fully) read or the output could not be
written (everything decoded before the problem is still written); 2 usage or configuration error.
"""

import importlib
import sys

from probe import __version__
from probe.cli.flags import Parser, unknown_command, unrecognized
from probe.cli.output import error, usage_error
from probe.errors import DnsprobeError

DESCRIPTION = """\
dnsprobe captures DNS traffic passively, pairs each query with its response, and writes the
transactions as Parquet files whose first 55 columns are those of CZ.NIC DNS Probe, or as C-DNS
(RFC 8618) files.
"""

EPILOG = """\
exit status:
  0  success
  1  an input file was unreadable or corrupt, or the output could not be written
     (everything decoded before the problem is still written and counted)
  2  usage or configuration error (unknown key, wrong type, impossible value)

configuration:
  built-in defaults, every option with its meaning: dnsprobe config --defaults

Documentation: README.md and docs/ (usage, configuration, output columns, C-DNS, live capture).
"""

# The commands, each a module of probe.cli, in the order --help lists them.
COMMANDS = ("read", "inspect", "report", "capture", "keygen", "bench", "config", "top")


def command_module(name):
    return importlib.import_module(f"probe.cli.{name}")


def build_parser(names=COMMANDS):
    """The parser of `dnsprobe` with the commands named; its `commands`: their parsers, by name."""
    parser = Parser(prog="dnsprobe", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"dnsprobe {__version__}")
    # (prog given: argparse would format the usage of `dnsprobe` to find it, asking for the terminal's width)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser, prog=parser.prog)
    for name in names:
        command_module(name).add_parser(sub)
    parser.commands = sub.choices
    return parser


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:  # its options are the suite's own: not parsed here
        return command_module("bench").run(argv[1:])
    # A command line that starts with its command imports and builds that command's parser only: the other
    # commands' modules (live capture's, inspect's, ...) are start-up time a read would pay for nothing.
    parser = build_parser(argv[:1] if argv[:1] and argv[0] in COMMANDS else COMMANDS)
    commands = parser.commands
    if (message := unknown_command(argv, list(COMMANDS))) is not None:
        parser.error(message)
    args, extras = parser.parse_known_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    if extras:  # (the message may name another command's option: all of them parsed)
        commands[args.command].error(unrecognized(args.command, extras, build_parser().commands))
    try:
        return command_module(args.command).run(args)
    except DnsprobeError as exc:
        if exc.exit_status == 2:
            usage_error(str(exc), commands[args.command].prog)
        else:
            error(str(exc))
        return exc.exit_status
    except BrokenPipeError:
        return 0
