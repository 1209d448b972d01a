"""Export stage: transactions (query, response, response_messages) → rotating files, one module per format.

- export.base: the Exporter interface (a typing.Protocol) and what the file writers share (names, .part
  files, rotation on time, output errors).
- export.parquet: DNS Probe's schema as Parquet; export.cdns: C-DNS (RFC 8618), writer and reader.
- export.anonymise: client-address privacy (Crypto-PAn, prefix truncation), applied by both formats.
"""

import probe.native  # noqa: F401 (first: a DNSPROBE_NATIVE_DIR build of the extensions is found by every import)


def make_exporter(cfg, directory, worker_id, stats, client=None, live=False, metrics=None, records=False):
    """The exporter for cfg.export.format; a new format is one new module and one entry here.

    client: the export.anonymise.ClientPrivacy applied to client addresses (None: written as they are);
    live: the records come from live capture (C-DNS collection parameters say so; Parquet is written as a
    journal first, export.parquet.journal, when export.flush_seconds asks for it); metrics: an
    export.metrics.DnsMetrics counting what is written (None: not counted); records: the transactions come as
    probe._records.TxBatch (the production pipeline), else as tuples (the Python reference)."""
    fmt = cfg.export.format
    if fmt == "parquet":
        make_enricher, RecordBuilder, ParquetExporter = _parquet_parts()
        # Enrichment looks the real addresses up; privacy transforms them afterwards (docs/enrichment.md).
        steps = [make_enricher(cfg)]
        if client is not None:
            from export.parquet.privacy import TablePrivacy  # with pyarrow.compute: only when configured

            steps.append(TablePrivacy(client, cfg.enrich.cache_size))
        cls = ParquetExporter
        if live and cfg.export.flush_seconds:
            from export.parquet.journal import JournalingParquetExporter as cls
        exporter = cls(
            cfg.export, directory, worker_id, stats, RecordBuilder(answers=cfg.export.answers),
            steps=[s for s in steps if s is not None], late_ns=int(cfg.match.query_timeout * 1e9), records=records,
        )
    elif fmt == "cdns":
        exporter = _cdns_exporter()(cfg, directory, worker_id, stats, client=client, live=live, records=records)
    else:
        raise ValueError(f"unknown export format {fmt!r}")
    exporter.metrics = metrics
    return exporter


def _parquet_parts():
    # Imported when first asked for: a C-DNS run does without pyarrow's Parquet writer.
    from export.enrich import make_enricher
    from export.parquet.records import RecordBuilder
    from export.parquet.writer import ParquetExporter

    return make_enricher, RecordBuilder, ParquetExporter


def _cdns_exporter():
    from export.cdns.writer import CdnsExporter

    return CdnsExporter


def preload(cfg):
    """Import what make_exporter imports for cfg.export.format, so that the processes forked afterwards (read
    --workers) share the loaded modules instead of each importing them again. The steps of options a run may not
    use (client privacy, the hive layout: pyarrow.compute) are imported by the workers that use them, in
    parallel."""
    {"parquet": _parquet_parts, "cdns": _cdns_exporter}.get(cfg.export.format, lambda: None)()


def reads_raw(cfg):
    """Whether the exporter for cfg.export.format reads the raw DNS message of the message tuples
    (probe.model.DNS_FIELDS raw): C-DNS does (question names, full sections, malformed-message
    data), Parquet only for its answers column (export.answers), so the decoder otherwise leaves it None and
    saves a copy of every message."""
    return cfg.export.format != "parquet" or cfg.export.answers


def reload(exporter):
    """Pick up new enrichment databases (live capture: SIGHUP); the exporters without any ignore it."""
    for step in getattr(exporter, "steps", ()):
        getattr(step, "reload", lambda: None)()
