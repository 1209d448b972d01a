"""One error style (issue 31, point 10): every usage error is one line ending with where to read about the command,
not argparse's usage block; a mistyped command, option or column gets the closest there is; an option of another
command names that command."""

import os
import subprocess
import sys

import pytest
from support.data import ROOT
from support.dnsprobe import run_dnsprobe

SAMPLE = ROOT / "samples" / "sample-mix.pcap.xz"


def usage_error(*args):
    """Run dnsprobe ARGS: exit status 2, one line on stderr, nothing on stdout; returns the line."""
    proc = subprocess.run([sys.executable, "-m", "probe", *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2, (args, proc.returncode, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("dnsprobe: error: "), (args, proc.stderr)
    assert proc.stdout == ""
    return lines[0]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """The sample as Parquet and as C-DNS."""
    out = tmp_path_factory.mktemp("errors")
    run_dnsprobe("read", SAMPLE, "-o", out, "-q")
    run_dnsprobe("read", SAMPLE, "-o", out, "-q", "--format", "cdns")
    (parquet,) = out.glob("*.parquet")
    (cdns,) = out.glob("*.cdns")
    return out, parquet, cdns


# Bad values argparse refuses (today a usage block) and ones the configuration refuses (today one line): the same.
BAD_VALUES = [
    (["read", SAMPLE, "--workers", "two"], "argument --workers: invalid int value: 'two'", "read"),
    (["read"], "the following arguments are required: FILE", "read"),
    (["read", SAMPLE, "-o", "{out}", "--format", "xml"], "config key 'export.format': 'xml' is not one of", "read"),
    (["inspect", "{parquet}", "--limit", "x"], "argument --limit: invalid int value: 'x'", "inspect"),
    (["inspect", "{parquet}", "--limit", "-1"], "--limit must be 0 or more", "inspect"),
    (["capture", "-i", "lo", "--block-count", "many"], "argument --block-count: invalid int value: 'many'",
     "capture"),
    (["keygen"], "the following arguments are required: FILE", "keygen"),
    (["config", "--coremask", "0xZ"], "'0xZ' is not a hexadecimal mask", "config"),
]


@pytest.mark.parametrize("args, needle, command", BAD_VALUES)
def test_a_bad_value_is_one_line_naming_the_help(outputs, args, needle, command):
    out, parquet, _ = outputs
    line = usage_error(*(str(a).format(out=out, parquet=parquet) for a in args))
    assert needle in line and line.endswith(f"; see dnsprobe {command} --help"), line


def test_a_mistyped_command_gets_the_closest(outputs):
    line = usage_error("raed", SAMPLE)
    assert line == ("dnsprobe: error: no command 'raed' (did you mean 'read'?); the commands are read, inspect,"
                    " report, capture, keygen, bench, config, top; see dnsprobe --help")
    assert "did you mean" not in usage_error("frobnicate")


def test_a_mistyped_option_gets_the_closest(outputs):
    out, parquet, _ = outputs
    assert usage_error("read", SAMPLE, "-o", out, "--formt", "cdns") == \
        "dnsprobe: error: no option --formt (did you mean '--format'?); see dnsprobe read --help"
    assert "(did you mean '--columns'?)" in usage_error("inspect", parquet, "--colums", "qname")
    assert "no option --zzzzzz; see" in usage_error("inspect", parquet, "--zzzzzz")


def test_an_option_of_another_command_names_it(outputs):
    assert usage_error("read", "x", "-i", "eth0") == ("dnsprobe: error: -i is an option of `dnsprobe capture` and"
                                                      " `dnsprobe config`, not of `dnsprobe read`; see dnsprobe read"
                                                      " --help")
    assert "--limit is an option of `dnsprobe inspect` and `dnsprobe report`, not of `dnsprobe read`" in \
        usage_error("read", SAMPLE, "--limit=3")


def test_a_mistyped_column_gets_the_closest_and_the_list(outputs):
    _, parquet, cdns = outputs
    line = usage_error("inspect", parquet, "--columns", "qnme,rcode")
    assert line.startswith("dnsprobe: error: no column 'qnme' (did you mean 'qname'?); the columns there are: id,"
                           " unixtime, time, qname, ")
    assert ", udp_sum, " in line and line.endswith("; see dnsprobe inspect --help")
    # A Parquet column that C-DNS does not record: said so, and not among the C-DNS file's columns.
    line = usage_error("inspect", cdns, "--columns", "qname,udp_sum")
    assert "no column 'udp_sum' (a Parquet column, not recorded in C-DNS); the columns there are: " in line
    assert "udp_sum," not in line.partition("the columns there are")[2]


@pytest.mark.parametrize("command", [["read"], ["capture"]])
def test_help_is_as_wide_as_the_terminal(command):
    # The width is asked for when help is printed (probe.cli.flags.HelpFormatter), not when the parser is made:
    # COLUMNS, which the terminal's size follows, still decides where the lines wrap.
    def helps(columns):
        env = os.environ | {"COLUMNS": str(columns)}
        proc = subprocess.run([sys.executable, "-m", "probe", *command, "--help"], cwd=ROOT, capture_output=True,
                              text=True, timeout=60, env=env, check=True)
        return proc.stdout.splitlines()

    def options(lines):  # the options' lines, wrapped by argparse (descriptions and examples are printed as written)
        start = lines.index("options:") + 1
        return lines[start : lines.index("", start) if "" in lines[start:] else len(lines)]

    narrow, wide = options(helps(60)), options(helps(200))
    assert max(len(line) for line in narrow) <= 60 < max(len(line) for line in wide)
