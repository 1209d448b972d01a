"""dnsprobe: passive DNS capture probe and exporter (capture sources → decode → match → export)."""

__version__ = "0.1.0"

from probe import native as _native  # noqa: E402,F401 (first: a DNSPROBE_NATIVE_DIR build is found by every import)
