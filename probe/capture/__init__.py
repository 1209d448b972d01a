"""Capture sources. Each yields FrameBatch objects (see probe.model)."""
