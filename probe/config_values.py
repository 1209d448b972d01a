"""Reading option values for probe/config.py, whose declarations say each option's type and bounds: the checks of a
value against them (check_value), the YAML of a configuration file composed and read by each key's type (a text
option takes the scalar as written), and the text of --set KEY=VALUE (Text). Every problem raises ConfigError
naming the key."""

import dataclasses
import math
import typing
from pathlib import Path

from probe.errors import ConfigError


class Options:
    """The base of probe/config.py's option sections (dataclass(frozen=True, init=False, eq=False, repr=False)):
    their __init__ (by keyword), equality, hash and repr as dataclasses would write them (fields in order, equal
    only to the same class), but one function each for all of them. dataclasses compiles each method of each class
    from source text at import: most of probe.config's share of every command's start (docs/performance.md,
    start-up). Frozen still: dataclasses' own __setattr__ refuses a change."""

    __slots__ = ()

    def __init__(self, **values):
        for f in dataclasses.fields(self):
            if f.name in values:
                value = values.pop(f.name)
            elif f.default_factory is not dataclasses.MISSING:
                value = f.default_factory()
            else:
                value = f.default
            object.__setattr__(self, f.name, value)
        for name in values:
            raise TypeError(f"{self.__class__.__qualname__}.__init__() got an unexpected keyword argument {name!r}")

    def _values(self):
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self))

    def __eq__(self, other):
        if other.__class__ is self.__class__:
            return self._values() == other._values()
        return NotImplemented

    def __hash__(self):
        return hash(self._values())

    def __repr__(self):
        values = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self))
        return f"{self.__class__.__qualname__}({values})"


def _check_scalar(key, value, typ, meta):
    if typ is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"config key '{key}': expected true or false, got {value!r}")
    elif typ is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"config key '{key}': expected an integer, got {value!r}")
        if not -(1 << 63) <= value < 1 << 63:  # values reach C code as 64-bit integers
            raise ConfigError(f"config key '{key}': {value} does not fit in 64 bits")
    elif typ is float:
        if isinstance(value, str):
            # YAML 1.1 (PyYAML) reads 1e-3 or 1e6, without a dot or a sign, as text: take it as the number it is.
            try:
                value = float(value)
            except ValueError:
                raise ConfigError(f"config key '{key}': expected a number, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"config key '{key}': expected a number, got {value!r}")
        value = float(value)
        if not math.isfinite(value):
            raise ConfigError(f"config key '{key}': expected a finite number, got {value}")
    elif typ is str:
        if meta.get("convert"):
            value = meta["convert"](value)
        if not isinstance(value, str):
            raise ConfigError(f"config key '{key}': expected a string, got {value!r}")
    if meta.get("choices") and value not in meta["choices"]:
        raise ConfigError(f"config key '{key}': {value!r} is not one of {', '.join(meta['choices'])}")
    if meta.get("min") is not None and value < meta["min"]:
        raise ConfigError(f"config key '{key}': {value!r} is below the minimum {meta['min']}")
    if meta.get("max") is not None and value > meta["max"]:
        raise ConfigError(f"config key '{key}': {value!r} is above the maximum {meta['max']}")
    if meta.get("check"):
        try:
            value = meta["check"](value)
        except ValueError as exc:
            raise ConfigError(f"config key '{key}': {exc}") from None
    return value


def check_value(key, value, typ, meta):
    """Validate one option value against its declared type and bounds; returns the stored value."""
    origin = typing.get_origin(typ)
    if origin is typing.Union:  # Optional[X]
        if value is None:
            return None
        typ = next(a for a in typing.get_args(typ) if a is not type(None))
        origin = typing.get_origin(typ)
    if origin is tuple:
        item = typing.get_args(typ)[0]
        if isinstance(value, str) and meta.get("split"):
            try:
                value = meta["split"](value)
            except ValueError as exc:
                raise ConfigError(f"config key '{key}': {value!r}: {exc}") from None
        elif isinstance(value, (int, str)) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, (list, tuple)) or not (value or meta.get("allow_empty")):
            what = "a list" if meta.get("allow_empty") else "a non-empty list"
            raise ConfigError(f"config key '{key}': expected {what}, got {value!r}")
        return tuple(_check_scalar(key, v, item, meta) for v in value)
    return _check_scalar(key, value, typ, meta)


class Text(str):
    """A value given as text (--set KEY=VALUE): read by the key's type, as a scalar of a YAML file is."""


def yaml_module():
    """PyYAML, imported when a configuration is read or written as YAML: a run without -c or --set starts
    without it."""
    import yaml
    import yaml.constructor

    return yaml


def _unwrap(typ):
    """(the type of one value, whether the option takes a list, whether it may be null)."""
    optional = typing.get_origin(typ) is typing.Union
    if optional:
        typ = next(a for a in typing.get_args(typ) if a is not type(None))
    if typing.get_origin(typ) is tuple:
        return typing.get_args(typ)[0], True, optional
    return typ, False, optional


def _from_node(key, node, typ):
    """The value of a YAML node for an option of type typ: text options take scalars as written."""
    yaml = yaml_module()
    item, many, optional = _unwrap(typ)
    if optional and isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null":
        return None
    nodes = node.value if many and isinstance(node, yaml.SequenceNode) else None
    if item is str:
        if nodes is not None and all(isinstance(n, yaml.ScalarNode) for n in nodes):
            return [n.value for n in nodes]
        if isinstance(node, yaml.ScalarNode):
            return node.value
    try:
        return yaml.constructor.SafeConstructor().construct_object(node, deep=True)
    except yaml.constructor.ConstructorError as exc:
        raise ConfigError(f"config key '{key}': {exc.problem}") from None


def value_from_text(key, text, typ, split=False):
    """The value of --set KEY=TEXT for an option of type typ (split: a list option that splits a text itself)."""
    yaml = yaml_module()
    item, many, _ = _unwrap(typ)
    stripped = text.strip()
    if item is str and not many and not stripped.startswith(("'", '"')) and stripped not in ("null", "~"):
        return stripped  # as written: 0x3, ::1, yes
    if split and not stripped.startswith("[") and stripped not in ("null", "~"):
        return stripped  # words as written (a shell's quotes, a colon), split by the option
    try:
        node = yaml.compose(text)
    except yaml.YAMLError as exc:
        if item is str and many:  # a list of texts YAML cannot read as written ([::1, 2001:db8::1]): split it
            return [part.strip() for part in stripped.strip("[]").split(",") if part.strip()]
        raise ConfigError(f"--set {key}: value is not valid YAML: {exc}") from None
    if node is None:
        return None
    return _from_node(key, node, typ)


def _suggest(name, known):
    import difflib  # here: only a configuration error needs it

    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def unknown_key(key, known, origin=None):
    """The ConfigError of a key that is not one of known, naming the nearest known one."""
    where = f"{origin}: " if origin else ""
    return ConfigError(f"{where}unknown config key '{key}'{_suggest(key, known)}")


def read_yaml(path):
    """The YAML document of a configuration file, composed (not constructed: values are read by type)."""
    yaml = yaml_module()
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path}: not UTF-8 text (byte {exc.start})") from None
    except FileNotFoundError:
        raise ConfigError(f"config file {path}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror}") from None
    try:
        doc = yaml.compose(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path}: not valid YAML: {exc}") from None
    if doc is None or (isinstance(doc, yaml.ScalarNode) and doc.tag == "tag:yaml.org,2002:null"):
        return None
    if not isinstance(doc, yaml.MappingNode):
        what = {yaml.SequenceNode: "list", yaml.ScalarNode: "str"}.get(type(doc), "other")
        raise ConfigError(f"config file {path}: expected a mapping of sections, got {what}")
    return doc


def flatten(doc, origin, types):
    """A composed YAML mapping {section: {name: value}} → {'section.name': value read by its type}, rejecting
    sections and keys not in types ({'section.name': type}, naming the nearest known one)."""
    yaml = yaml_module()
    sections = list(dict.fromkeys(key.split(".")[0] for key in types))
    flat = {}
    for section_node, body in (doc.value if doc is not None else ()):
        section = section_node.value
        if section not in sections:
            raise ConfigError(
                f"{origin}: unknown config section '{section}'{_suggest(section, sections)} "
                f"(known: {', '.join(sections)})"
            )
        if isinstance(body, yaml.ScalarNode) and body.tag == "tag:yaml.org,2002:null":
            continue
        if not isinstance(body, yaml.MappingNode):
            raise ConfigError(f"{origin}: config section '{section}' must be a mapping")
        for name_node, value in body.value:
            key = f"{section}.{name_node.value}"
            if key not in types:
                raise unknown_key(key, types, origin)
            flat[key] = _from_node(key, value, types[key])
    return flat


# Checks of single option values (probe.config's `check=`).

def file_name_part(value):
    """A prefix of output file names: no directory separators or NUL bytes (the directory is -o)."""
    if "/" in value or "\0" in value:
        raise ValueError(f"{value!r} is not a file name prefix (no '/' or NUL; the directory is export.directory)")
    return value


SERVER_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_")


def server_name(value):
    """A server name: one path component of the hive layout (server=NAME) that no engine has to unescape."""
    if not set(value) <= SERVER_NAME_CHARS or value in (".", ".."):
        raise ValueError(f"{value!r} is not a server name (letters, digits, '.', '-' and '_' only)")
    return value


def hex_mask(value):
    """A coremask as text: an integer given where the text was expected (a program's override) is written in hex."""
    return hex(value) if isinstance(value, int) and not isinstance(value, bool) else value


TOP_MODES = ("on-demand", "true", "false")


def top_mode(value):
    """capture.top as one of TOP_MODES: a boolean, or a text YAML reads as one (`--set capture.top=yes`), says what
    it said when the option was one."""
    if isinstance(value, str) and value not in TOP_MODES:
        import yaml  # (here only: a plain read's start-up does without it)

        try:
            read = yaml.safe_load(value)
        except yaml.YAMLError:
            read = None
        value = read if isinstance(read, bool) else value
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


def octal_mode(value):
    """A file mode written in octal, as chmod takes it ('0660')."""
    try:
        mode = int(value, 8)
    except ValueError:
        raise ValueError(f"{value!r} is not an octal mode such as '0660'") from None
    if not 0 <= mode <= 0o7777:
        raise ValueError(f"{value!r} is not a file mode (0000 to 7777)")
    return value


def host_port(value):
    """HOST:PORT ([v6]:PORT) of a TCP listener."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{value!r} is not HOST:PORT (an IPv6 address in brackets: [::1]:6000)")
    return value
