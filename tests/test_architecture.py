"""The layout's rules, checked on the source: stages use each other's public names only, and every C extension
is declared once (probe/native.py) and built from where setup.py says. The one-way flow of imports between the
layers is import-linter's contract in pyproject.toml (`make lint`)."""

import ast
import importlib
import subprocess
import sys

import pytest
from support.data import ROOT

from probe import native

PACKAGES = ("probe", "export")


def _stage(module):
    """probe.decode.dnswire → probe.decode; export.cdns.block → export; probe.model → probe.model."""
    parts = module.split(".")
    return parts[0] if parts[0] == "export" else ".".join(parts[:2])


def private_imports(root, packages=PACKAGES):
    """Every `from <another stage> import _name` (or of a _module) in the packages under root."""
    found = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
            name = ".".join(p for p in rel.parts if p != "__init__")
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not (isinstance(node, ast.ImportFrom) and node.module and node.level == 0):
                    continue
                if node.module.split(".")[0] not in PACKAGES or _stage(node.module) == _stage(name):
                    continue
                private = [a.name for a in node.names if a.name.startswith("_") and a.name != "__version__"]
                last = node.module.rsplit(".", 1)[-1]
                if last.startswith("_") and not last.startswith("__"):
                    private.append("(module)")
                found += [f"{rel}:{node.lineno} imports {node.module} {p}" for p in private]
    return found


def test_no_stage_uses_another_stages_private_names():
    found = private_imports(ROOT)
    assert not found, "\n".join(found)


def test_private_imports_are_found(tmp_path):
    """The check above can fail: another stage's private name or private module is reported, its own is not."""
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "x.py").write_text(
        "from probe.decode.dnswire import _private, parse_message\nfrom probe.match import _match\n"
        "from export.cdns.block import _Table\n"
    )
    found = private_imports(tmp_path, ("export",))
    assert len(found) == 2 and "_private" in found[0] and "_match" in found[1], found


def _setup_extensions():
    """Extension modules named in setup.py (CORE and DPDK)."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    names = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and node.targets[0].id in ("CORE", "DPDK"):
            value = ast.literal_eval(node.value)
            for spec in (value if node.targets[0].id == "CORE" else (value,)):
                names[spec[0]] = spec[1]
    return names


def test_every_extension_declared_once_beside_its_twin():
    built = _setup_extensions()
    assert set(built) == set(native.EXTENSIONS) | set(native.OPTIONAL)
    for module, source in built.items():
        assert (ROOT / source).exists(), source
        assert source.rsplit("/", 1)[0] == module.rsplit(".", 1)[0].replace(".", "/"), (module, source)


@pytest.mark.parametrize("module", sorted(native.EXTENSIONS))
def test_every_core_extension_is_built(module):
    """A machine without a compiler installs and runs the Python twins (slower, with a warning); CI must not."""
    assert native.load(module) is not None, f"{module} was not built: {native.import_error(module)}"
    importlib.import_module(module)


def test_import_linter_contract_is_kept():
    lint = ROOT / ".venv" / "bin" / "lint-imports"
    cmd = [str(lint)] if lint.exists() else [sys.executable, "-m", "importlinter.cli"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
