"""C-DNS (RFC 8618) exporter: transactions → blocks of deduplicated tables and Q/R items → rotating files.

File layout, streamed: the definite array header of 3, "C-DNS", the file preamble, then an
indefinite-length block array (0x9f) to which each block is appended as cbor2 encodes it, and the break
byte (0xff) when the file is closed. Until then the file is NAME.cdns[.gz|.xz|.zst].part.

What is recorded (the storage hints say exactly this; see docs/cdns.md):
- Q/R items: time-offset (ticks of 1 µs after the block's earliest-time), client address and port,
  transaction id, signature, client hop limit, response delay, first QNAME (uncompressed wire form,
  original case), query and response DNS sizes; with export.cdns_full_sections the second and later
  questions of the query and the answer/authority/additional sections of query and response (names
  uncompressed, compression pointers inside the RDATA of the types of export.cdns.format.RDATA_NAME_LAYOUT
  expanded, other RDATA as received; the query's OPT is in the signature, not in its additional
  section, as compactor does).
- Signatures: server address and port, transport flags, qr-type when configured, qr-sig-flags, opcode,
  query and response header flags and the query's DO, query and response RCODEs with the extended bits,
  class/type of the first question, the query's counts (QDCOUNT from the response when there is no
  query), the query's EDNS version, UDP size and OPT RDATA.
- Query-only and response-only items have only their side's fields (has-query / has-response say
  which); malformed messages are malformed-messages items with their bytes in malformed-message-data,
  on the query side unless QR says response; zone transfers are one item (first response message's
  sections, sizes summed).
- Address events: ICMP/ICMPv6 errors and TCP resets counted by the decoder (probe.decode.packets),
  per block, by type, code, address and IP version.
- Block statistics per block: messages in its items, items, unmatched queries and responses, malformed
  items; discarded-opcode is 0 (every OPCODE is recorded).

Client addresses get the privacy treatment of the Parquet output (export.anonymise: cryptopANT, prefix);
with a prefix only its bytes are stored and the storage parameters say so.

What the file is (export.filemeta): generator-id "dnsprobe VERSION", host-id the server name (export.server_name,
else the host name live, else empty), the storage flags, anonymization-method and prefixes for the privacy
treatment, and dnsprobe's own collection parameter (format.DNSPROBE_ORIGIN) for the source kinds and the
configuration digest, which RFC 8618 has no field for.

Compression (export.cdns_compression) of the whole file runs in a thread of its own that takes the
raw bytes from a queue, compresses and writes them: the capture thread only encodes blocks and queues
them, and does not wait for the compressor, nor for the disk, even at rotation (a file being finished
is renamed by its thread; close() waits for them all).
"""


import lzma
import os
import queue
import threading
import zlib

import cbor2

from export.base import FileExporter, OutputFile, announce_finished, lock_live_file, off_capture_cores, tx_time_ns
from export.cdns import format as F
from export.cdns.block import QR_FIELDS, SECTION_FIELDS, Block, Clients
from export.cdns.encode import TICKS_PER_SECOND
from export.filemeta import FileOrigin, privacy_methods, recorded_server
from probe import __version__
from probe.model import SNAPLEN

# ---------------------------------------------------------------------------------------------
# The file preamble


def capture_filter(ports, live):
    """The selection of packets, in tcpdump style (the kernel filter of live capture does the same)."""
    port_expr = " or ".join(f"port {p}" for p in ports)
    text = f"((udp or tcp) and ({port_expr})) or (ip[6:2] & 0x3fff != 0) or (ip6[6] = 44)"
    if not live:
        text += " or icmp or icmp6"
    return text


def storage_hints(full_sections, qr_type):
    qr = F.bits(QR_FIELDS + (SECTION_FIELDS if full_sections else ()), F.QR_HINT_BITS)
    sig = F.bits([name for name in F.QR_SIG_HINT_BITS if name != "qr-type" or qr_type is not None], F.QR_SIG_HINT_BITS)
    return {
        F.QUERY_RESPONSE_HINTS: qr,
        F.QUERY_RESPONSE_SIGNATURE_HINTS: sig,
        F.RR_HINTS: F.bits(F.RR_HINT_BITS, F.RR_HINT_BITS) if full_sections else 0,
        F.OTHER_DATA_HINTS: F.bits(F.OTHER_DATA_HINT_BITS, F.OTHER_DATA_HINT_BITS),
    }


def file_preamble(cfg, client, live, origin=None):
    """The FilePreamble map of RFC 8618 7.4 for this configuration. origin: the run's export.filemeta.FileOrigin
    (its source kinds and configuration digest, in dnsprobe's own collection parameter; None: unspecified)."""
    ecfg = cfg.export
    storage = {
        F.TICKS_PER_SECOND: TICKS_PER_SECOND,
        F.MAX_BLOCK_ITEMS: ecfg.cdns_block_items,
        F.STORAGE_HINTS: storage_hints(ecfg.cdns_full_sections, ecfg.cdns_qr_type),
        F.OPCODES: list(range(16)),
        F.RR_TYPES: list(F.RECORDED_RR_TYPES),
    }
    if client is not None and client.prefix4 < 32:
        storage[F.CLIENT_ADDRESS_PREFIX_IPV4] = client.prefix4
    if client is not None and client.prefix6 < 128:
        storage[F.CLIENT_ADDRESS_PREFIX_IPV6] = client.prefix6
    storage[F.STORAGE_FLAGS] = F.STORAGE_FLAG_ANONYMIZED_DATA if client is not None else 0
    methods = privacy_methods(client)
    if methods:
        storage[F.ANONYMIZATION_METHOD] = "; ".join(methods)
    collection = {
        F.QUERY_TIMEOUT: round(cfg.match.query_timeout * 1000),
        F.SKEW_TIMEOUT: 0,  # a response with no pending query is response-only at once
    }
    if live:
        collection[F.SNAPLEN] = SNAPLEN
        collection[F.PROMISC] = cfg.capture.promiscuous
        collection[F.INTERFACES] = list(cfg.capture.interfaces or ())
    if ecfg.cdns_server_addresses:
        collection[F.SERVER_ADDRESSES] = [_packed(a) for a in ecfg.cdns_server_addresses]
    collection[F.FILTER] = capture_filter(cfg.decode.dns_ports, live)
    collection[F.GENERATOR_ID] = f"dnsprobe {__version__}"
    collection[F.HOST_ID] = recorded_server(ecfg, live)
    origin = origin or FileOrigin()
    collection[F.DNSPROBE_ORIGIN] = {"source": origin.source_text(), "config_sha256": origin.config_sha256}
    return {
        F.MAJOR_FORMAT_VERSION: F.FORMAT_MAJOR,
        F.MINOR_FORMAT_VERSION: F.FORMAT_MINOR,
        F.BLOCK_PARAMETERS: [{F.STORAGE_PARAMETERS: storage, F.COLLECTION_PARAMETERS: collection}],
    }


def _packed(text):
    import ipaddress

    return ipaddress.ip_address(text).packed


def file_header(preamble):
    """The bytes before the first block: array(3), "C-DNS", the preamble, an indefinite array start."""
    return b"\x83" + cbor2.dumps(F.FILE_TYPE_ID) + cbor2.dumps(preamble) + b"\x9f"


FILE_TRAILER = b"\xff"  # the break that closes the block array


# ---------------------------------------------------------------------------------------------
# Writing files: a thread per file compresses and writes what the capture thread queues


class _Identity:
    def compress(self, data):
        return data

    def flush(self):
        return b""


def compressor(codec, level):
    """An object with compress(bytes) and flush() for the whole-file codec; level None: gzip 6, xz 6, zstd 3
    (gzip 6 rather than 9: a third less CPU for 0.3 % more bytes, benchmarks/encodings.py)."""
    if codec == "none":
        return _Identity()
    if codec == "gzip":
        return zlib.compressobj(6 if level is None else level, zlib.DEFLATED, 31)  # gzip framing, mtime 0
    if codec == "xz":
        return lzma.LZMACompressor(lzma.FORMAT_XZ, preset=level)
    import zstandard

    return zstandard.ZstdCompressor(level=3 if level is None else level).compressobj()


def sync_flush(codec, comp, level):
    """(bytes that make everything compressed so far decodable from the file, the compressor to go on with).
    xz has no such flush: its stream is ended and a new one follows (xz readers read concatenated streams)."""
    if codec == "gzip":
        return comp.flush(zlib.Z_SYNC_FLUSH), comp
    if codec == "zstd":
        import zstandard

        return comp.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK), comp
    if codec == "xz":
        return comp.flush(), compressor(codec, level)
    return b"", comp


def check_level(codec, level):
    """A ConfigError naming export.compression_level when the level does not suit the codec."""
    from probe.errors import ConfigError

    bounds = {"gzip": (0, 9), "xz": (0, 9), "zstd": (-7, 22)}.get(codec)
    if level is None or bounds is None:
        return
    if not bounds[0] <= level <= bounds[1]:
        raise ConfigError(
            f"config key 'export.compression_level': {level} is not a {codec} level ({bounds[0]}..{bounds[1]})"
        )


_FLUSH = object()  # queued by flush(): what was queued before it goes into the file, decodable


class FileSink(OutputFile):
    """One output file: bytes queued by write() are compressed and written by a thread of the sink's own,
    which also closes the file and renames NAME.part to NAME after finish(). The file is locked
    (export.base.lock_live_file) until it has its final name. `durable` counts the rows (items) of the blocks in the
    file (decodable there whatever happens to the process: after a flush() or the file's end), `handed` those
    queued; `rows` (rotation) those of its blocks and of the block being built."""

    def __init__(self, part_path, final_path, start_ns, codec, level):
        super().__init__(final_path, part_path, start_ns)
        self.fh = open(part_path, "wb")  # closed by the thread
        try:
            self.lock = lock_live_file(part_path)
        except OSError:
            self.fh.close()
            raise
        self.comp = compressor(codec, level)
        self.codec = codec
        self.level = level
        self.queue = queue.SimpleQueue()
        self.error = None
        self.handed = self.durable = self.counted = 0  # rows: queued, in the file, counted by the exporter
        self.blocks = 0
        self.queued_bytes = 0  # before compression
        self.thread = threading.Thread(target=self._run, name=f"cdns-writer {final_path.name}", daemon=True)
        self.thread.start()

    def size(self):
        # export.rotate_bytes counts the C-DNS bytes before compression: where files split does not depend on how
        # fast the compressor's thread runs.
        return self.queued_bytes

    def write(self, data, rows=0):
        self.handed += rows
        self.queued_bytes += len(data)
        self.queue.put((data, rows))

    def flush(self):
        """What was queued so far goes into the file, decodable (the compressor flushed, the file written)."""
        self.queue.put(_FLUSH)

    def finish(self):
        """No more data: the thread flushes, closes and renames (see done())."""
        self.queue.put(None)

    def done(self):
        return not self.thread.is_alive()

    def join(self):
        self.thread.join()

    def _run(self):
        if self.codec != "none":
            off_capture_cores()
        fh, comp, get = self.fh, self.comp, self.queue.get
        pending = 0  # rows written since the last flush
        try:
            while True:
                item = get()
                if item is None:
                    break
                if item is _FLUSH:
                    out, comp = sync_flush(self.codec, comp, self.level)
                    fh.write(out)
                    fh.flush()
                    self.durable += pending
                    pending = 0
                    continue
                data, rows = item
                out = comp.compress(data)
                if out:
                    fh.write(out)
                pending += rows
            fh.write(comp.flush())
            fh.close()
            self.durable += pending
            os.replace(self.part_path, self.final_path)
            announce_finished(self.final_path)
        except OSError as exc:
            self.error = exc
            try:
                fh.close()
            except OSError:
                pass
            while get() is not None:  # let the capture thread go on; what follows is not written
                pass
        finally:
            os.close(self.lock)


# ---------------------------------------------------------------------------------------------
# The exporter


class CdnsExporter(FileExporter):
    """Writes transactions as C-DNS files (see the module docstring); the exporter interface is in export/."""

    def __init__(self, cfg, directory, worker_id, stats, client=None, live=False, metrics=None, tx_records=False,
                 origin=None):
        """client: the export.anonymise.ClientPrivacy of client addresses (None: recorded as they are); live: the
        transactions come from live capture (the collection parameters say so); origin: the run's
        export.filemeta.FileOrigin (the file preamble records it; None: unspecified); metrics: an
        export.metrics.DnsMetrics counting what is written (None: not counted); tx_records: write() is given
        probe._records.TxBatch (the production pipeline), else transaction tuples (the Python reference)."""
        super().__init__(cfg, directory, worker_id, stats, metrics, live)
        self.tx_records = tx_records
        ecfg = cfg.export
        check_level(ecfg.cdns_compression, ecfg.compression_level)
        self.suffix = ".cdns" + F.COMPRESSION_SUFFIXES[ecfg.cdns_compression]
        self.max_items = ecfg.cdns_block_items
        self.full_sections = ecfg.cdns_full_sections
        self.qr_type = F.QR_TYPES[ecfg.cdns_qr_type] if ecfg.cdns_qr_type else None
        self.clients = Clients(client) if client is not None else None
        self.header = file_header(file_preamble(cfg, client, live, origin))
        self.block = Block(self)

    @property
    def sink(self):
        """The file being written (one at a time), or None."""
        return self.files.get(None)

    # -- the exporter interface --

    def write(self, txs, address_events=None, now_ns=None):
        self._reap()
        tx_records = self.tx_records
        if self.metrics is not None:
            (self.metrics.add_records if tx_records else self.metrics.add_transactions)(txs)
        i = 0
        n = len(txs)
        while i < n:
            if self.sink is None:
                self._open(txs.time_ns(i) if tx_records else tx_time_ns(txs[i]))
            room = self._room(self.sink, self.max_items - len(self.block))
            stop = min(n, i + room)
            before = len(self.block)
            self.block.add(txs, i, stop)
            i = stop
            added = len(self.block) - before
            self.sink.rows += added
            if len(self.block) >= self.max_items:
                self._flush_block()
            self._end_if_full()
        events = list(address_events.items()) if address_events else []
        while events:
            if self.sink is None:
                self._open(now_ns if now_ns is not None else self.file_start_ns or 0)
            events = self.block.add_events(events, now_ns)
            if events:
                self._flush_block()

    def _close(self, sink):
        if len(self.block) or self.block.events:
            self._write_block(sink)
        sink.write(FILE_TRAILER)
        sink.finish()
        self._finish_in_thread(sink)

    def flush(self):
        """Close the block on time (it may hold fewer than max-block-items) and have it written, decodable."""
        self._reap()
        if self.sink is None:
            return
        if len(self.block) or self.block.events:
            self._flush_block()
        if self.sink is not None:  # (the block may have completed the file)
            self.sink.flush()

    def unwritten(self):
        self._reap()
        return len(self.block) + sum(s.handed - s.durable for s in self._sinks())

    def _sinks(self):
        return self.finishing + ([self.sink] if self.sink is not None else [])

    # -- internals --

    def _new_file(self, key, ts_ns):
        final, part = self._take_name(self.dir, ts_ns)
        try:
            sink = FileSink(part, final, ts_ns, self.cfg.cdns_compression, self.cfg.compression_level)
        except OSError as exc:
            raise self._output_error(exc, part) from None
        sink.write(self.header)
        return sink

    def _full(self, sink):
        """Also after export.rotate_blocks blocks (a limit of this format's)."""
        return super()._full(sink) or 0 < self.cfg.rotate_blocks <= sink.blocks

    def _thread_finished(self, sink):
        self.stats.records += sink.durable - sink.counted  # (the last ones, written as the thread ended)
        sink.counted = sink.durable
        super()._thread_finished(sink)

    def _flush_block(self):
        """Write the block; the file ends here when full."""
        self._write_block(self.sink)
        self._end_if_full()

    def _write_block(self, sink):
        sink.write(self.block.encode(), len(self.block))  # in stats.records once in the file (_reap)
        self.block = Block(self, self.block)
        sink.blocks += 1

    def _reap(self):
        """Count the rows now in the files, account for the files whose thread has finished (in order); raise
        the first write error."""
        for sink in self._sinks():
            durable = sink.durable
            self.stats.records += durable - sink.counted
            sink.counted = durable
        super()._reap()
        for sink in self._sinks():
            if sink.error is not None:
                raise self._output_error(sink.error, sink.part_path)

