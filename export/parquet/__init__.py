"""Parquet output: DNS Probe's columns then dnsprobe's own (schema.py), built from transaction records in one C
pass (records.py, _parquetrec.c; from tuples by the Python reference, columns.py), written in row groups to
rotating files (writer.py)."""
