"""One worker's pipeline: source batches → decode → match → exporter.

The same object serves offline reading (`dnsprobe read`) and each live-capture worker. The decoder follows
the batch's type: packets (FrameBatch) go to the packet decoder, dnstap frames (DnstapBatch) to the dnstap
decoder, made on the first such batch; both feed the one transaction table and exporter.

It runs one of two pipelines, picked once at construction: in production, C message records (probe._records:
PacketDecoder.decode_into, RecordTable, an exporter given TxBatch); where those extensions are not built, the
Python reference end to end (message tuples: PacketDecoder.decode, TransactionTable, an exporter given tuples).
The output is the same either way (tests/run/test_columnar.py).
"""

import gc
import time

from export import checks_when_made, make_exporter, reads_raw
from export.anonymise import client_privacy
from export.filemeta import FileOrigin
from probe.config import render_yaml
from probe.decode.ipfilter import IpFilter
from probe.decode.packets import PacketDecoder
from probe.match import RecordTable, TransactionTable
from probe.model import DnstapBatch
from probe.native import load, records_built
from probe.stats import Stats
from probe.timeline import mark

_records = load("probe._records")

EXPORT_BATCH = 16384  # transactions handed to the exporter at once
GC_EVERY_PACKETS = 1 << 20  # packets between two explicit collections of the young generations
GC_FULL_EVERY = 16  # every 16th explicit collection is a full one


def tune_gc():
    """The hot path allocates millions of short-lived tuples and holds many long-lived ones (pending
    queries, a batch of transactions). CPython's automatic collector then runs every few hundred
    allocations and rescans them, a large share of the run even with raised thresholds (docs/performance.md).
    Our objects form no cycles, so the automatic collector is turned off and Pipeline collects the young
    generations itself every GC_EVERY_PACKETS packets (and fully every GC_FULL_EVERY times): anything cyclic
    a library creates is still freed. Start-up objects are frozen out of every scan."""
    gc.freeze()
    gc.disable()


def config_digest(cfg):
    """SHA-256 (hex) of the configuration as `dnsprobe config` prints it (render_yaml: every key, flags applied):
    `dnsprobe config -c FILE FLAGS | sha256sum` gives it. No secret is in that text: of the anonymisation key, only
    the key file's path (privacy.key_file), never its contents."""
    import hashlib  # (OpenSSL: with the exporter, after the first frame; pyarrow's file systems import it anyway)

    return hashlib.sha256(render_yaml(cfg).encode()).hexdigest()


def file_origin(cfg, sources):
    """The FileOrigin of a run with the configuration cfg (as the user gave it, before a run's own adjustments)
    reading the source kinds `sources` (export.filemeta.SOURCE_KINDS)."""
    return FileOrigin(tuple(sources), config_digest(cfg))


class Pipeline:
    """columnar: the production pipeline on C message records (probe._records): packets and dnstap messages through
    the decoders' decode_into, RecordTable and a TxBatch; False: the Python reference on message tuples; None: the
    records whenever they can run (the record extensions are built, probe.native.RECORD_EXTENSIONS, and the query
    timeout fits in 64 bits), with any decode.parser. The output is the same either way (tests/run/test_columnar.py)."""

    def __init__(self, cfg, out_dir, worker_id=0, stats=None, live=False, columnar=None, share=None, origin=None,
                 sources=()):
        """share: (k, n), this pipeline is read worker k of n (`dnsprobe read --workers n`) and keeps only the
        frames whose IP address pair hashes to k (PacketDecoder.share); None: every frame. origin: what the files
        record of the run (file_origin: its source kinds and configuration digest); None: file_origin(cfg,
        sources), computed when the exporter is made.

        The exporter is made when first needed (the first export, usually of the first batch): reading a file to
        Parquet, pyarrow's import (40 ms of a quiet start, docs/performance.md) and the configuration digest then
        come after the first frame is decoded. What it could refuse is checked before: the output directory
        (probe.run.offline), the key file (client_privacy, here); an exporter that checks more when made
        (export.checks_when_made: enrichment's databases and lists, C-DNS), or writes live capture, is made here."""
        tune_gc()
        self.cfg = cfg
        self.stats = stats if stats is not None else Stats()
        self.decoder = PacketDecoder(
            cfg.decode, cfg.decode.dns_ports, self.stats, IpFilter(cfg.filter), keep_raw=reads_raw(cfg), share=share
        )
        self.dnstap = None  # the DnstapDecoder, made for the first DnstapBatch
        if columnar is None:
            columnar = records_built() and RecordTable.supports(cfg.match)
        self.columnar = columnar
        if columnar:
            self.table = RecordTable(cfg.match, self.stats)
            self._msgs = _records.MsgBatch()  # refilled by every batch
            self._txs = _records.TxBatch()  # emptied by every export
        else:
            self.table = TransactionTable(cfg.match, self.stats)
            self._txs = []
        client = client_privacy(cfg.privacy)

        def exporter():
            return make_exporter(cfg, out_dir, worker_id, self.stats, client=client, live=live, tx_records=columnar,
                                 origin=origin or file_origin(cfg, sources))

        self._make_exporter = exporter
        self._exporter = exporter() if live or checks_when_made(cfg) else None
        self._until_gc = GC_EVERY_PACKETS
        self._collections = 0
        self._decoded_any = False  # (for the timeline's first frame decoded)
        self.started = time.time()
        mark("pipeline made")

    @property
    def exporter(self):
        """The exporter, made at the first call (see __init__)."""
        if self._exporter is None:
            self._exporter = self._make_exporter()
            mark("exporter made")
        return self._exporter

    def _file_open(self):
        return self._exporter is not None and self._exporter.is_open()

    @property
    def now_ns(self):
        """Capture time of the newest frame or dnstap message decoded: the clock of timeouts and rotation."""
        return self.decoder.now_ns if self.dnstap is None else max(self.decoder.now_ns, self.dnstap.now_ns)

    def _dnstap_decoder(self):
        if self.dnstap is None:
            from probe.decode.dnstap import DnstapDecoder  # protobuf is loaded only for dnstap input

            self.dnstap = DnstapDecoder(self.cfg.dnstap, self.cfg.decode, self.stats, IpFilter(self.cfg.filter),
                                        keep_raw=reads_raw(self.cfg))
        return self.dnstap

    def feed(self, batch, source_name="input"):
        self._until_gc -= len(batch)
        if self._until_gc <= 0:
            self._until_gc = GC_EVERY_PACKETS
            self._collections += 1
            # Young generations usually; all of them now and then, for cycles among long-lived objects.
            gc.collect(1 if self._collections % GC_FULL_EVERY else 2)
        if not self._decoded_any and len(batch):
            mark("first batch read")
        decoder = self._dnstap_decoder() if type(batch) is DnstapBatch else self.decoder
        if self.columnar:
            msgs = self._msgs
            msgs.clear()
            decoder.decode_into(batch, msgs, source_name)
        else:
            msgs = decoder.decode(batch, source_name)
        if not self._decoded_any and len(batch):
            self._decoded_any = True
            mark("first frame decoded")
        if self._file_open() and self.exporter.due(self.now_ns):
            # Close on time first: what completed before this batch belongs to the closing file.
            self._export()
            self.exporter.rotate()
        # Matching runs on every batch, also one without messages, and expires on the pipeline's clock (the time of
        # its last frame): timeouts then fire at the same times however `read --workers` splits the frames.
        if self.columnar:
            self.table.add(msgs, self._txs, self.now_ns)
        else:
            self._txs += self.table.add(msgs, self.now_ns)
        if len(self._txs) >= EXPORT_BATCH or (not self._file_open() and (msgs or len(self._txs))):
            self._export()  # also opens a file as soon as there are records, starting its clock

    def rotate(self):
        """Close the current file now (live capture: SIGHUP, wall-clock rotation); pending queries stay pending.
        Enrichment databases and lists changed on disk are read again (Exporter.reload), for the next file."""
        self._export()
        self.exporter.rotate()
        self.exporter.reload()

    def _export(self):
        txs = self._txs
        events = self.decoder.address_events
        if not len(txs) and not events:
            return
        if events:
            self.decoder.address_events = {}
        if self.columnar:
            try:
                self.exporter.write(txs, events, self.now_ns)
            finally:
                txs.clear()  # as the list below: given to the exporter once, written or not
            return
        self._txs = []
        self.exporter.write(txs, events, self.now_ns)

    def count_dns(self, metrics):
        """Count what is written (by RCODE, QTYPE, transport; response delays) into an export.metrics.DnsMetrics."""
        self.exporter.metrics = metrics

    def flush(self):
        """Live capture: every transaction completed so far into the file being written, readable now."""
        self._export()
        self.exporter.flush()

    def unwritten(self):
        """(transactions completed and not yet in a file, queries waiting for their response)."""
        return len(self._txs) + (self._exporter.unwritten() if self._exporter else 0), len(self.table)

    def summary(self):
        """What a run reports beside the counters: the parser that ran, files written, the file being written."""
        exporter = self.exporter
        live = [str(p) for p in exporter.live_files()]  # being written, or being finished in a thread
        part = getattr(exporter, "part_path", None) if exporter.is_open() else None
        return {
            "decode_parser": self.decoder.parser,  # decode.parser auto resolved: fast, wire or dpkt
            "files_written": [p.name for p in exporter.completed],
            "part_file": str(part) if part else None,
            "live_files": live,
        }

    def finish(self):
        """End of input: pending TCP/fragments dropped (counted), pending queries exported, files closed."""
        self.decoder.flush()
        if self.dnstap is not None:
            self.dnstap.flush()
        if self.columnar:
            self.table.flush(self._txs)
        else:
            self._txs += self.table.flush()
        self._export()
        self.exporter.close()
        return self.stats
