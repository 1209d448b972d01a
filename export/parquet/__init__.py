"""Parquet output: DNS Probe's columns then dnsprobe's own (schema.py), built from transactions in one C pass
(records.py, columns.py, _columns.c), written in row groups to rotating files (writer.py)."""
