"""The layout's rules, checked on the source: stages use each other's public names only (no `from <stage> import
_name`, no `obj._name` read of a name private to another stage, no private extension of another stage loaded by
name), and every C extension is declared once (probe/native.py) and built from where setup.py says. The one-way
flow of imports between the layers is import-linter's contract in pyproject.toml (`make lint`)."""

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


def _modules(root, packages):
    """(path relative to root without .py, dotted module name, parsed tree) of every module of the packages."""
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
            yield rel, ".".join(p for p in rel.parts if p != "__init__"), ast.parse(path.read_text(), str(path))


def _private(name):
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(root, packages=PACKAGES):
    """Every `from <another stage> import _name` (or of a _module) in the packages under root."""
    found = []
    for rel, name, tree in _modules(root, packages):
        for node in ast.walk(tree):
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


def _private_names(tree):
    """The private names a module defines: functions, classes, module and class variables, attributes it assigns
    (self._x = ..., obj._x = ...), __slots__ entries."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__slots__" for t in node.targets):
            try:
                names.update(ast.literal_eval(node.value))
            except ValueError:
                pass
    return {n for n in names if _private(n)}


def private_attribute_reads(root, packages=PACKAGES):
    """Every `obj._name` (obj not self or cls) in a module of one stage where _name is private to another: defined
    there (probe.model's FrameBatch._data, a module's _helper, ...) and not in the module itself. A name that
    only the standard library defines (os._exit) is not ours to check."""
    modules = list(_modules(root, packages))
    owners = {}  # private name -> the stages that define it
    defines = {}  # module -> the private names it defines
    for _, name, tree in modules:
        defines[name] = _private_names(tree)
        for attr in defines[name]:
            owners.setdefault(attr, set()).add(_stage(name))
    found = []
    for rel, name, tree in modules:
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _private(node.attr)):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            others = owners.get(node.attr, set()) - {_stage(name)}
            if others and node.attr not in defines[name]:
                found.append(f"{rel}:{node.lineno} reads {ast.unparse(node)} (private to {', '.join(sorted(others))})")
    return found


# A private module another stage may load by name, and why.
SHARED_PRIVATE_MODULES = {
    "probe._records": "the message and transaction record types (MsgBatch, TxBatch, Frames) every stage passes on, "
                      "as probe.model's tuples: a C extension, named like every extension",
}


def private_module_loads(root, packages=PACKAGES):
    """Every private module of another stage loaded by name (native.load("probe.match._matchrec"),
    importlib.import_module(...)), but those SHARED_PRIVATE_MODULES lists."""
    found = []
    for rel, name, tree in _modules(root, packages):
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
                continue
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            target = node.args[0].value
            if func not in ("load", "import_module") or not isinstance(target, str):
                continue
            if target.split(".")[0] not in PACKAGES or target in SHARED_PRIVATE_MODULES:
                continue
            if any(_private(part) for part in target.split(".")) and _stage(target) != _stage(name):
                found.append(f"{rel}:{node.lineno} loads {target}")
    return found


def test_no_stage_uses_another_stages_private_names():
    found = private_imports(ROOT) + private_attribute_reads(ROOT) + private_module_loads(ROOT)
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


def test_private_attribute_reads_and_loads_are_found(tmp_path):
    """Reads of another stage's private attributes and loads of its private modules are reported; the stage's own,
    self's, the standard library's and the shared record types are not."""
    for d in ("probe/model", "probe/run", "export"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "probe" / "model" / "__init__.py").write_text(
        "class Batch:\n    __slots__ = ('_data',)\n    def __init__(self):\n        self._data = []\n"
        "def _helper():\n    pass\n"
    )
    (tmp_path / "probe" / "run" / "__init__.py").write_text(
        "import os\nfrom probe import model\nfrom probe.native import load\n"
        "class Own:\n    def __init__(self):\n        self._mine = 1\n    def same(self, other):\n"
        "        return other._mine + self._data\n"
        "def run(batch):\n    model._helper()\n    os._exit(batch._data)\n"
        "_ok = load('probe.run._own'), load('probe._records')\n_bad = load('probe.match._matchrec')\n"
    )
    (tmp_path / "export" / "x.py").write_text("def columns(batch):\n    return batch._data\n")
    reads = private_attribute_reads(tmp_path, ("probe", "export"))
    assert [r.split(" ", 1)[1] for r in reads] == [
        "reads model._helper (private to probe.model)",
        "reads batch._data (private to probe.model)",
        "reads batch._data (private to probe.model)",
    ], reads
    loads = private_module_loads(tmp_path, ("probe", "export"))
    assert [r.split(" ", 1)[1] for r in loads] == ["loads probe.match._matchrec"], loads


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
