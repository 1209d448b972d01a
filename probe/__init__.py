"""dnsprobe: passive DNS capture probe and exporter (capture sources → decode → match → export)."""

__version__ = "0.1.0"
