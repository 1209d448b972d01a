"""Export stage: transactions (query, response, response_messages) → rotating files, one module per format.

- export.base: the Exporter interface (a typing.Protocol) and what the file writers share (names, .part
  files, rotation by time, rows and bytes, output errors).
- export.parquet: DNS Probe's schema as Parquet; export.cdns: C-DNS (RFC 8618), writer and reader.
- export.anonymise: client-address privacy (Crypto-PAn, prefix truncation), applied by both formats.
"""

import probe.native  # noqa: F401 (first: a DNSPROBE_NATIVE_DIR build of the extensions is found by every import)


def make_exporter(cfg, directory, worker_id, stats, client=None, live=False, metrics=None, tx_records=False,
                  origin=None):
    """The exporter for cfg.export.format; a new format is one new module and one entry here. Every exporter
    takes these arguments (export.base.Exporter).

    client: the export.anonymise.ClientPrivacy applied to client addresses (None: written as they are);
    live: the transactions come from live capture (C-DNS collection parameters say so; Parquet is written as a
    journal first, export.parquet.journal, when export.flush_seconds asks for it); metrics: an
    export.metrics.DnsMetrics counting what is written (None: not counted); tx_records: the transactions come as
    probe._records.TxBatch (the production pipeline), else as tuples (the Python reference); origin: the run's
    export.filemeta.FileOrigin (its source kinds, its configuration digest), which every file records (None:
    unspecified)."""
    fmt = cfg.export.format
    if fmt == "parquet":
        cls = _parquet_exporter()
        if live and cfg.export.flush_seconds:
            from export.parquet.journal import JournalingParquetExporter as cls
    elif fmt == "cdns":
        cls = _cdns_exporter()
    else:
        raise ValueError(f"unknown export format {fmt!r}")
    return cls(cfg, directory, worker_id, stats, client=client, live=live, metrics=metrics, tx_records=tx_records,
               origin=origin)


def checks_when_made(cfg):
    """Whether the exporter of cfg checks, when it is made, more than the run checks before it (the output directory,
    the key file): the files enrichment reads (its databases and lists: a ConfigError naming their key), C-DNS's
    compression level. Such an exporter is made before the reading begins, so that its refusal comes first; any
    other may be made at the first export, after the first frame is decoded (probe.run.pipeline)."""
    e = cfg.enrich
    return cfg.export.format != "parquet" or bool(e.geoip_country or e.geoip_asn or e.public_resolvers
                                                  or e.public_suffix)


def _parquet_exporter():
    # Imported when first asked for: a C-DNS run does without pyarrow's Parquet writer. (The exporter imports
    # its row builder and enrichment when made; imported here too for preload.)
    import export.enrich  # noqa: F401
    import export.parquet.rows  # noqa: F401
    from export.parquet.writer import ParquetExporter

    return ParquetExporter


def _cdns_exporter():
    from export.cdns.writer import CdnsExporter

    return CdnsExporter


def preload(cfg):
    """Import what make_exporter imports for cfg.export.format, so that the processes forked afterwards (read
    --workers) share the loaded modules instead of each importing them again. The steps of options a run may not
    use (client privacy, the hive layout: pyarrow.compute) are imported by the workers that use them, in
    parallel."""
    {"parquet": _parquet_exporter, "cdns": _cdns_exporter}.get(cfg.export.format, lambda: None)()


def reads_raw(cfg):
    """Whether the exporter for cfg.export.format reads the raw DNS message of the message tuples
    (probe.model.DNS_FIELDS raw): C-DNS does (question names, full sections, malformed-message
    data), Parquet only for its answers column (export.answers), so the decoder otherwise leaves it None and
    saves a copy of every message."""
    return cfg.export.format != "parquet" or cfg.export.answers
