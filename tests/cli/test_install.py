"""Installed from a built wheel (not editable) into a fresh virtualenv, dnsprobe works outside the checkout: the
default configuration comes with the package, every C extension is in the wheel, `read` writes what the
checkout's `read` writes."""

import subprocess
import sys

import pytest
import yaml
from support.data import ROOT
from support.dnsprobe import read_output, run_dnsprobe

from probe.config import render_default_yaml

SAMPLE = ROOT / "samples" / "sample-mix.pcap.xz"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A fresh venv with dnsprobe installed from its wheel; the dependencies come from the index as for a user."""
    tmp = tmp_path_factory.mktemp("install")
    wheels, venv = tmp / "wheels", tmp / "venv"
    # (the build's setuptools is the test environment's: make deps installs it)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                            wheels, ROOT], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    (wheel,) = wheels.glob("dnsprobe-*.whl")
    # The venv without a pip of its own, the test environment's pip installing into it (--python); no byte
    # compiling of the dependencies at install (Python compiles what is imported): a third of the time it took.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    pip = subprocess.run([sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "-q",
                          "--no-compile", wheel], capture_output=True, text=True)
    assert pip.returncode == 0, pip.stderr
    return venv, tmp


def run_installed(installed, *args):
    venv, cwd = installed
    proc = subprocess.run([venv / "bin" / "dnsprobe", *map(str, args)], capture_output=True, text=True, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return proc


def test_runs_from_the_installed_package_not_the_checkout(installed):
    venv, cwd = installed
    code = "import probe, export, probe.native as n; print(probe.__file__); print(export.__file__); " \
           "print(sorted(m for m in n.EXTENSIONS if n.load(m) is None))"
    out = subprocess.run([venv / "bin" / "python", "-c", code], capture_output=True, text=True, cwd=cwd, check=True)
    probe_file, export_file, missing = out.stdout.splitlines()
    assert probe_file.startswith(str(venv)) and export_file.startswith(str(venv))
    assert missing == "[]", f"extensions missing from the wheel: {missing}"


def test_default_configuration_ships_with_the_package(installed):
    assert run_installed(installed, "config", "--defaults").stdout == render_default_yaml()
    assert yaml.safe_load(run_installed(installed, "config").stdout)["match"]["query_timeout"] == 5.0


def test_read_writes_what_the_checkout_writes(installed, tmp_path):
    theirs, ours = tmp_path / "installed", tmp_path / "checkout"
    theirs.mkdir()
    ours.mkdir()
    proc = run_installed(installed, "read", SAMPLE, "-o", theirs, "-q", "--no-progress")
    assert "not built" not in proc.stderr
    run_dnsprobe("read", SAMPLE, "-o", ours, "-q", "--no-progress")
    assert read_output(theirs).equals(read_output(ours))
