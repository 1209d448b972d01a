"""What every output file says of itself: the dnsprobe version, the schema version, what was done to client
addresses (never the key), the server name, the kind of capture source and the digest of the configuration.

Parquet: key-value metadata of the file (keys META_KEYS, text values), also in a live journal's schema, so the
file converted from it at rotation (export.parquet.journal, export.recovery) has it. C-DNS: the file preamble's own
fields where RFC 8618 has them (generator-id, host-id, storage-flags, anonymization-method, client address
prefixes), the rest (source, config_sha256) in one implementation-specific collection parameter
(format.DNSPROBE_ORIGIN).
read_meta(path) reads either back as the same keys (`dnsprobe inspect --meta`).

The source kinds and the configuration digest are the run's (FileOrigin): probe.run knows them and hands them to
the exporter (export.make_exporter origin=).
"""

import dataclasses
import socket

from probe import __version__

# The source kinds a run declares (probe.run): packets from pcap/pcapng files, dnstap files, or input that is
# not a regular file (a pipe, stdin: its content is only known once read), an AF_PACKET capture, DPDK, dnstap
# sockets (Unix or TCP).
SOURCE_KINDS = ("pcap file", "dnstap file", "pipe", "af_packet", "dpdk", "dnstap socket")
UNSPECIFIED = "unspecified"

KEY_PREFIX = "dnsprobe."
META_KEYS = ("version", "schema_version", "client_privacy", "client_anonymised", "client_ipv4_prefix",
             "client_ipv6_prefix", "server", "source", "config_sha256")


@dataclasses.dataclass(frozen=True)
class FileOrigin:
    """What the run that writes a file knows of it: its source kinds (SOURCE_KINDS, in the order the run declares
    them; empty: unspecified) and the SHA-256 (hex) of its configuration (probe.run.pipeline.config_digest)."""

    sources: tuple = ()
    config_sha256: str = ""

    def source_text(self):
        return ", ".join(self.sources) or UNSPECIFIED


def recorded_server(export_cfg, live):
    """The server a file records: export.server_name, else the host name when capturing live; reading capture
    files, the host that converts them is not the server they were captured on: empty."""
    if export_cfg.server_name is not None:
        return export_cfg.server_name
    return socket.gethostname() if live else ""


def privacy_methods(client):
    """What is done to client addresses (and EDNS client subnets), one phrase each: nothing of the key."""
    if client is None:
        return []
    methods = []
    if client.cryptopan is not None:
        key = client.cryptopan.key
        methods.append(f"cryptopANT prefix-preserving anonymisation (IPv4 {key.algorithm4()}, IPv6 {key.algorithm6()})")
    if client.prefix4 < 32:
        methods.append(f"client IPv4 addresses cut to /{client.prefix4}")
    if client.prefix6 < 128:
        methods.append(f"client IPv6 addresses cut to /{client.prefix6}")
    return methods


def file_meta(cfg, client, origin, live, schema_version):
    """The metadata of a file (key without KEY_PREFIX → text) written with this configuration."""
    methods = privacy_methods(client)
    return {
        "version": __version__,
        "schema_version": str(schema_version),
        "client_privacy": "; ".join(methods) or "none: client addresses as captured",
        "client_anonymised": "true" if client is not None and client.cryptopan is not None else "false",
        "client_ipv4_prefix": str(client.prefix4 if client is not None else 32),
        "client_ipv6_prefix": str(client.prefix6 if client is not None else 128),
        "server": recorded_server(cfg.export, live),
        "source": origin.source_text(),
        "config_sha256": origin.config_sha256,
    }


def parquet_key_values(meta):
    """Parquet key-value metadata of a file_meta: dnsprobe.KEY → value, as bytes."""
    return {(KEY_PREFIX + k).encode(): v.encode() for k, v in meta.items()}


def from_key_values(key_values):
    """The dnsprobe metadata in Parquet/Arrow key-value metadata (bytes → bytes), prefix dropped."""
    prefix = KEY_PREFIX.encode()
    return {k[len(prefix):].decode(): v.decode() for k, v in (key_values or {}).items() if k.startswith(prefix)}


def read_meta(path):
    """The metadata of a Parquet file, a live journal or a C-DNS file (told apart by content), as file_meta's keys;
    a file of another writer gives what it has (C-DNS: the RFC 8618 fields only)."""
    from export.cdns.reader import CdnsFile, file_head, preamble_meta

    if str(path).endswith(".parquet.journal"):
        from export.parquet.journal import journal_schema

        return _in_order(from_key_values(journal_schema(path).metadata))
    if file_head(path, 4) == b"PAR1":
        import pyarrow.parquet as pq

        return _in_order(from_key_values(pq.read_metadata(path).metadata))
    with CdnsFile(path) as f:  # (CaptureFileError when it is not C-DNS either)
        return _in_order(preamble_meta(f.preamble))


def _in_order(meta):
    """META_KEYS first, in their order, then any other (a C-DNS file's generator)."""
    order = {k: i for i, k in enumerate(META_KEYS)}
    return dict(sorted(meta.items(), key=lambda kv: order.get(kv[0], len(order))))
