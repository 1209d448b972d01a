"""How the C extensions are built and where they come from.

Where: the package's own build, or the one DNSPROBE_NATIVE_DIR names (make asan builds them with sanitizers into
build/asan and make test-asan runs the tests against it). Never a mix: with the variable set, every extension
must come from that directory, and one missing there is an import error.
How: without a compiler warning (gcc and clang, -Wall -Wextra), and gcc's static analyser finds nothing that is
not explained at its line."""

import importlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support.data import ROOT
from support.dnsprobe import run_python

from probe import native


def test_every_extension_comes_from_the_selected_build():
    directory = os.environ.get(native.BUILD_DIR_VARIABLE)
    for name in native.EXTENSIONS:
        module = importlib.import_module(name)
        file = Path(module.__file__).resolve()
        if directory:
            assert file.is_relative_to(Path(directory).resolve()), f"{name} from {file}, not {directory}"
        else:  # beside its package's Python modules (built in place, or installed)
            package = importlib.import_module(name.rpartition(".")[0])
            assert file.parent in [Path(p).resolve() for p in package.__path__], file


def test_an_extension_missing_from_the_build_dir_is_an_import_error(tmp_path):
    code = f"""
import os
os.environ[{native.BUILD_DIR_VARIABLE!r}] = {str(tmp_path)!r}
from export.cdns import block
from probe import native
print(block.BACKEND)
print(native.import_error("export.cdns._cdnsblock"))
"""
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    backend, error = proc.stdout.splitlines()
    assert backend == "python"
    assert error == (
        f"export.cdns._cdnsblock is not built in {tmp_path} (DNSPROBE_NATIVE_DIR; make asan builds it there)"
    )


# --- compiler warnings and the static analyser ------------------------------------------------------------------

WARNING = re.compile(r"^(\S+\.[ch]):(\d+):\d+: warning: (.*)$", re.M)
SOURCES = [ROOT / (name.replace(".", "/") + ".c") for name in {**native.EXTENSIONS, **native.OPTIONAL}]
DPDK_CFLAGS = subprocess.run(["pkg-config", "--cflags", "libdpdk"], capture_output=True, text=True).stdout.split() \
    if shutil.which("pkg-config") else []


@pytest.mark.parametrize("compiler", ["gcc", "clang"])
def test_extensions_build_without_a_warning(compiler, tmp_path):
    # setup.py's own build (its -Wall -Wextra, Python's flags), into a directory of its own.
    if not shutil.which(compiler):
        pytest.skip(f"{compiler} is not installed (clang: contrib/install-deps.sh sanitizers)")
    env = {**os.environ, "CC": compiler, "LDSHARED": f"{compiler} -shared"}
    build = ["build_ext", "-j", "2", "--force", "--build-lib", tmp_path / "lib", "--build-temp", tmp_path / "tmp"]
    proc = subprocess.run([sys.executable, "setup.py", *build], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    warnings = WARNING.findall(proc.stdout + proc.stderr)
    assert not warnings, "\n".join(":".join(w) for w in warnings)
    built = {p.name.split(".")[0] for p in (tmp_path / "lib").rglob("*.so")}
    assert {name.rsplit(".", 1)[1] for name in native.EXTENSIONS} <= built


def code_size(source):
    """Bytes of a source and of the headers of ours it names: how long gcc -fanalyzer takes on it, roughly."""
    headers = {d / name for name in re.findall(r'#include "([^"]+)"', source.read_text())
               for d in (source.parent, ROOT / "include") if (d / name).exists()}
    return source.stat().st_size + sum(h.stat().st_size for h in headers)


def test_static_analyser_findings_are_explained_at_their_line():
    # gcc -fanalyzer on every extension: each finding must be explained in a comment that names the analyser, on
    # its line or the two above (a new finding fails until it is fixed or explained).
    include = sysconfig.get_paths()["include"]
    sources = [s for s in SOURCES if s.exists() and (s.name != "_dpdk.c" or DPDK_CFLAGS)]
    sources.sort(key=code_size, reverse=True)  # the longest analyses first: the cores finish together

    def analyse(source):
        return subprocess.run(["gcc", "-fanalyzer", "-O2", "-fPIC", f"-I{include}", f"-I{ROOT / 'include'}",
                               *DPDK_CFLAGS, "-c", source, "-o", os.devnull], capture_output=True, text=True)

    unexplained = []
    with ThreadPoolExecutor(os.cpu_count()) as pool:  # one gcc per core
        procs = list(pool.map(analyse, sources))
    for source, proc in zip(sources, procs, strict=True):
        assert proc.returncode == 0, proc.stderr
        lines = source.read_text().splitlines()
        for file, line, what in WARNING.findall(proc.stderr):
            n = int(line)
            if Path(file).resolve() == source and "fanalyzer" not in " ".join(lines[max(0, n - 3) : n]):
                unexplained.append(f"{source.relative_to(ROOT)}:{line}: {what}")
    assert not unexplained, "\n".join(unexplained)
