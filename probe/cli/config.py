"""`dnsprobe config`: print the effective configuration, or the defaults, as YAML that `-c` reads back."""

import sys

from probe.cli.capture import CAPTURE_FLAGS, add_capture_flags
from probe.cli.flags import CONFIG_FLAGS, add_pipeline_options, overrides
from probe.config import load_config, render_default_yaml, render_yaml
from probe.run.checks import capture_sources, check_config

CONFIG_EPILOG = """\
The output is YAML with every key, its value and its meaning: save it, edit it and give it back with -c.
It takes the flags of `read` and `capture` and --set, to show what they make of the configuration, and
refuses (exit status 2, one line) what they would refuse of it: an option that does not apply, a bad
coremask, a key file it cannot read, an output directory it cannot write, ... --check also refuses what
only a capture would refuse at its start (nothing to capture, an interface that does not exist unless
capture.wait_for_interface) and prints one line instead of the configuration.

examples:
  dnsprobe config --defaults > /etc/dnsprobe/resolver.yml     # every key with its default, then edit
  dnsprobe config -c /etc/dnsprobe/resolver.yml               # what a capture with it would use
  dnsprobe config -c resolver.yml -i eth1 --set capture.coremask=0x3
  dnsprobe config | dnsprobe config -c /dev/stdin             # the same configuration again
  dnsprobe config --check -c /etc/dnsprobe/resolver.yml       # would `dnsprobe capture -c` start with it?
"""


def add_parser(sub):
    conf = sub.add_parser(
        "config",
        help="print the effective or default configuration",
        description="Print the configuration that `read` or `capture` would use, after the file and flags.",
        epilog=CONFIG_EPILOG,
    )
    add_capture_flags(conf)
    add_pipeline_options(conf, CONFIG_FLAGS, "capture.coremask=0x3")
    conf.add_argument("--defaults", action="store_true",
                      help="print the built-in defaults as YAML (every key, its default and meaning)")
    conf.add_argument("--check", action="store_true",
                      help="also check what `capture` checks at its start; print one line, not the configuration")


def run(args):
    if args.defaults:
        sys.stdout.write(render_default_yaml())
        return 0
    cfg = load_config(args.config, overrides(args, CAPTURE_FLAGS))
    check_config(cfg, "config")
    if args.check:
        waits = capture_sources(cfg)
        print(f"{args.config or 'the configuration'}: `dnsprobe capture` would start with it"
              + "".join(f"; {why}: it would wait for it" for why in waits))
        return 0
    sys.stdout.write(render_yaml(cfg))
    return 0
