"""`dnsprobe config`: print the effective configuration, or the defaults as YAML."""

import sys

from probe.cli.flags import FORMATTER
from probe.config import load_config, options, render_default_yaml


def add_parser(sub):
    conf = sub.add_parser(
        "config",
        help="print the effective or default configuration",
        description="Print the configuration that `read` would use, after the file and flags.",
        formatter_class=FORMATTER,
    )
    conf.add_argument("-c", "--config", metavar="FILE", help="configuration file to load")
    conf.add_argument("--defaults", action="store_true",
                      help="print the built-in defaults as YAML (every key, its default and meaning)")

def run(args):
    if args.defaults:
        sys.stdout.write(render_default_yaml())
        return 0
    cfg = load_config(args.config)
    for key, _, _ in options():
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        print(f"{key}: {list(value) if isinstance(value, tuple) else value}")
    return 0


