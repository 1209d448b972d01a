"""dnsprobe: passive DNS capture probe and exporter (capture sources → decode → match → export)."""

import os

# Arrow's buffers from the C library's allocator unless the user chose otherwise: pyarrow's default, mimalloc, keeps
# the pages freed, which held a fifth of a live worker's RSS for no gain in CPU. Set before pyarrow is imported
# (it reads the variable once).
os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")

from probe import native as _native  # noqa: E402,F401 (first: a DNSPROBE_NATIVE_DIR build is found by every import)

__version__ = "0.1.0"
