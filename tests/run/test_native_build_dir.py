"""Where the C extensions come from: the package's own build, or the one DNSPROBE_NATIVE_DIR names (make asan
builds them with sanitizers into build/asan and make test-asan runs the tests against it). Never a mix: with
the variable set, every extension must come from that directory, and one missing there is an import error."""

import importlib
import os
from pathlib import Path

from support import run_python

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
from export.parquet import columns
from probe import native
print(columns.BACKEND)
print(native.import_error("export.parquet._columns"))
"""
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    backend, error = proc.stdout.splitlines()
    assert backend == "python"
    assert error == (
        f"export.parquet._columns is not built in {tmp_path} (DNSPROBE_NATIVE_DIR; make asan builds it there)"
    )
