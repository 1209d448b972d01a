"""Export stage: writers that take Arrow tables of records (see probe.records.SCHEMA)."""


def make_exporter(export_cfg, directory, worker_id, stats):
    """The exporter for the configured format; a new format is one new module and one entry here."""
    if export_cfg.format == "parquet":
        from export.parquet import ParquetExporter

        return ParquetExporter(export_cfg, directory, worker_id, stats)
    raise ValueError(f"unknown export format {export_cfg.format!r}")
