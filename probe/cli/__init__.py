"""The `dnsprobe` command.

Exit status: 0 success; 1 an input file could not be (fully) read or the output could not be
written (everything decoded before the problem is still written); 2 usage or configuration error.
"""

import sys

from probe import __version__
from probe.cli import bench, capture, config, inspect, keygen, read, report, top
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

COMMANDS = {"read": read, "inspect": inspect, "report": report, "capture": capture, "keygen": keygen, "bench": bench,
            "config": config, "top": top}


def build_parser():
    """The parser of `dnsprobe`; its `commands`: those of its commands, by name."""
    parser = Parser(prog="dnsprobe", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"dnsprobe {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for module in COMMANDS.values():
        module.add_parser(sub)
    parser.commands = sub.choices
    return parser


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:  # its options are the suite's own: not parsed here
        return bench.run(argv[1:])
    parser = build_parser()
    commands = parser.commands
    if (message := unknown_command(argv, list(commands))) is not None:
        parser.error(message)
    args, extras = parser.parse_known_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    if extras:
        commands[args.command].error(unrecognized(args.command, extras, commands))
    try:
        return COMMANDS[args.command].run(args)
    except DnsprobeError as exc:
        if exc.exit_status == 2:
            usage_error(str(exc), commands[args.command].prog)
        else:
            error(str(exc))
        return exc.exit_status
    except BrokenPipeError:
        return 0
