"""Configuration: parsed once into frozen dataclasses and passed down.

Sources, later ones winning: the defaults below (part of the installed package; no configuration file is
read unless given), `-c FILE`, then command-line flags. Every option is declared once here with its type,
bounds and one-line help; the YAML loader and the value checks (probe/config_values.py), the flag overrides,
`dnsprobe config` (whose output `-c` reads back to the same configuration) and `dnsprobe config --defaults`
(of which config/dnsprobe.yml in the source tree is a copy, checked by a test) and the documentation all
follow this table. Values are read by their
key's type: a text option takes the YAML scalar as written (a coremask 0x3, an address ::1), a number option
the number. An unknown key (with the nearest known one), a wrong type or an impossible value raises
ConfigError naming the key (exit status 2).
"""

import dataclasses
import ipaddress
import shlex
import typing
from dataclasses import dataclass, field

from probe.capture.pcapfilter import check_expression
from probe.config_values import (
    TOP_MODES,
    Options,
    Text,
    check_value,
    file_name_part,
    flatten,
    hex_mask,
    host_port,
    octal_mode,
    read_yaml,
    server_name,
    top_mode,
    unknown_key,
    value_from_text,
    yaml_module,
)
from probe.decode.dnstap_types import DEFAULT_TYPES as DNSTAP_DEFAULT_TYPES
from probe.decode.dnstap_types import TYPE_NAMES as DNSTAP_TYPE_NAMES
from probe.decode.ipfilter import check_network
from probe.decode.parsers import CHOICES as PARSER_CHOICES
from probe.decode.parsers import check_choice as check_parser


def opt(default, help, *, min=None, max=None, choices=None, check=None, allow_empty=False, convert=None,
        only=None, split=None):
    """check: a function of each value returning it (or raising ValueError with the problem);
    allow_empty: a list option may be empty; convert: a text option takes a value of another type (an integer, a
    boolean) through this, before its checks;
    only: the export.format the option is for (another value than its default with the other format is refused:
    probe.run.checks.check_config); split: a list option given as one text is split into its items by this (else
    it is a list of one)."""
    meta = {"help": help, "min": min, "max": max, "choices": choices, "check": check, "allow_empty": allow_empty,
            "convert": convert, "only": only, "split": split}
    if isinstance(default, (list, tuple)):
        return field(default=tuple(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True, init=False, eq=False, repr=False)
class DecodeConfig(Options):
    dns_ports: tuple[int, ...] = opt((53,), "UDP/TCP ports that carry DNS", min=1, max=65535)
    parser: str = opt(
        "auto",
        "DNS parser: 'fast' (the wire walker in C), 'wire' (the same walker in Python, the reference), 'auto' (fast"
        " when built, else wire with a warning), 'dpkt' (dpkt for every message, the walker where dpkt cannot parse)",
        choices=PARSER_CHOICES,
        check=check_parser,
    )
    fragment_timeout: float = opt(
        5.0, "seconds (capture time) to wait for the rest of a fragmented datagram", min=0.001
    )
    fragment_max_datagrams: int = opt(10000, "fragmented datagrams held at once (oldest dropped first)", min=1)
    fragment_max_bytes: int = opt(
        64 << 20, "bytes held by the fragmented datagrams at once, each at most 65,535 (oldest dropped first)",
        min=65535,
    )
    tcp_idle_timeout: float = opt(60.0, "seconds (capture time) after which an idle TCP stream is dropped", min=0.001)
    tcp_max_streams: int = opt(100000, "TCP stream directions held at once (oldest dropped first)", min=1)
    tcp_max_bytes: int = opt(
        256 << 20, "bytes held by all TCP stream directions at once: messages in progress and segments ahead of a"
        " gap (oldest direction dropped first)", min=65537,
    )
    tcp_max_ooo_bytes: int = opt(262144, "bytes held per TCP stream direction ahead of a gap", min=0)
    tcp_max_ooo_segments: int = opt(
        256, "segments held per TCP stream direction ahead of a gap (bounds the work and overhead of tiny ones)",
        min=0,
    )


@dataclass(frozen=True, init=False, eq=False, repr=False)
class MatchConfig(Options):
    query_timeout: float = opt(5.0, "seconds (capture time) a query waits for its response", min=0.000001)
    max_pending: int = opt(
        1000000, "pending queries held at once, retries under one key included (oldest exported as query-only)",
        min=1,
    )
    max_pending_per_key: int = opt(
        8, "pending queries held under one key (transport, addresses, ports, DNS ID): one more exports the"
        " oldest of them as query-only", min=1,
    )
    max_transfers: int = opt(
        10000, "zone transfers (AXFR/IXFR over several messages) open at once: one more closes the one whose last"
        " message is the oldest, exported as it stands", min=1,
    )


@dataclass(frozen=True, init=False, eq=False, repr=False)
class ExportConfig(Options):
    format: str = opt("parquet", "output format: parquet, or cdns (C-DNS, RFC 8618)", choices=("parquet", "cdns"))
    directory: str = opt(".", "output directory (the -o flag)")
    file_prefix: str = opt("dnsprobe.", "output file name prefix", check=file_name_part)
    overwrite: bool = opt(
        False, "`dnsprobe read`: replace an output file whose name exists (the same input read again) instead of"
        " refusing it; live capture never replaces a file (docs/usage.md)",
    )
    rotate_records: int = opt(5000000, "close a file after this many records (0: no limit)", min=0)
    rotate_seconds: float = opt(300.0, "close a file this many seconds after it was opened (0: no limit)", min=0)
    rotate_bytes: int = opt(
        0, "close a file once it holds this many bytes, checked after each Parquet row group or C-DNS block (C-DNS:"
        " bytes before compression) (0: no limit)",
        min=0,
    )
    layout: str = opt(
        "flat", "Parquet: flat (every file in the output directory) or hive (year=/month=/day=[/hour=]/server="
        " directories by capture time and server name, as ENTRADA writes them)", choices=("flat", "hive"),
        only="parquet",
    )
    partition_hour: bool = opt(False, "hive layout: also an hour=H directory below day=D", only="parquet")
    server_name: typing.Optional[str] = opt(  # noqa: UP045
        None, "this probe's server name: the hive layout's server=NAME directory and the server_location column"
        " (null: the host name in the hive layout, and server_location left empty as DNS Probe; '' is __default__)",
        check=server_name,
    )
    sort: str = opt(
        "none", "Parquet: sort the rows of each row group by domainname, then qname (none: capture order)",
        choices=("none", "domainname"), only="parquet",
    )
    answers: bool = opt(
        False, "Parquet: the answers column, every resource record of the response in presentation format"
        " (the decoder then keeps each response's bytes)", only="parquet",
    )
    flush_seconds: float = opt(
        2.0, "live capture: every completed transaction is in a readable file within this many seconds, whatever"
        " happens to the worker afterwards (0: only once its file is closed)", min=0,
    )
    row_group_size: int = opt(100000, "Parquet rows per row group", min=1, only="parquet")
    time_order: bool = opt(
        True, "Parquet: the rows of unanswered queries, which come match.query_timeout late, in row groups of their"
        " own, so that each row group spans only its rows' time and a time range reads only the row groups holding"
        " its rows (false: one stream of rows as transactions complete; docs/parquet.md)", only="parquet",
    )
    journal_compression: str = opt(
        "lz4", "live Parquet: compression of the journal's buffers, the file's first form until its rotation (lz4:"
        " least CPU; zstd: about half the journal's size, for more CPU; none)", choices=("lz4", "zstd", "none"),
        only="parquet",
    )
    compression: str = opt(
        "zstd", "Parquet compression codec", choices=("zstd", "snappy", "gzip", "brotli", "lz4", "none"),
        only="parquet",
    )
    compression_level: typing.Optional[int] = opt(  # noqa: UP045
        None, "level of the Parquet codec or of cdns_compression (null: the codec's default; Parquet: zstd 1,"
        " gzip 9, brotli 8; C-DNS: gzip 6, xz 6, zstd 3)"
    )
    rotate_blocks: int = opt(0, "C-DNS: close a file after this many blocks (0: no limit)", min=0, only="cdns")
    cdns_block_items: int = opt(
        10000, "C-DNS max-block-items: Q/R items (and malformed messages, address events) per block", min=1,
        only="cdns",
    )
    cdns_compression: str = opt(
        "none", "C-DNS whole-file compression, done in a thread off the capture path: none, gzip, xz, zstd",
        choices=("none", "gzip", "xz", "zstd"), only="cdns",
    )
    cdns_full_sections: bool = opt(
        False, "C-DNS: also record the question (2nd and later), answer, authority and additional sections",
        only="cdns",
    )
    cdns_qr_type: typing.Optional[str] = opt(  # noqa: UP045
        None, "C-DNS qr-type of every item (null: not recorded)",
        choices=("stub", "client", "resolver", "auth", "forwarder", "tool"), only="cdns",
    )
    cdns_server_addresses: tuple[str, ...] = opt(
        (), "C-DNS collection parameter server-addresses: addresses of the servers watched (metadata only)",
        check=lambda text: str(ipaddress.ip_address(text)), allow_empty=True, only="cdns",
    )
    on_close: typing.Optional[tuple[str, ...]] = opt(  # noqa: UP045
        None, "command run for every finished file (complete and renamed), its path added as the last argument: a"
        " list (program, arguments) or a text split into words as a shell would, never run by a shell (null: none)",
        split=shlex.split,
    )
    on_close_jobs: int = opt(2, "export.on_close commands running at once; the others wait their turn", min=1, max=64)
    on_close_timeout: float = opt(
        600.0, "seconds an export.on_close command may run; then it is sent SIGTERM (SIGKILL 5 s later) and counted"
        " as failed (0: no limit)", min=0,
    )


@dataclass(frozen=True, init=False, eq=False, repr=False)
class RunConfig(Options):
    batch_size: int = opt(4096, "frames per batch handed from a source to the decoder", min=1, max=1 << 20)
    progress: str = opt(
        "auto", "progress bar: auto (on a terminal), always, never", choices=("auto", "always", "never")
    )
    stats_json: bool = opt(True, "write the run statistics as _PREFIX<start>.stats.json in the output directory")
    workers: int = opt(
        1, "`dnsprobe read`: worker processes; each reads every input and keeps the flows whose IP address pair"
        " hashes to it; at most one per core it may run on (docs/usage.md)", min=1, max=1024,
    )
    coremask: typing.Optional[str] = opt(  # noqa: UP045
        None, "`dnsprobe read`: cores to run the read workers on, one worker per core (a hex mask, quoted, e.g."
        " '0x3'); not with run.workers"
    )


@dataclass(frozen=True, init=False, eq=False, repr=False)
class CaptureConfig(Options):
    interfaces: typing.Optional[tuple[str, ...]] = opt(  # noqa: UP045 (check_value reads typing.Optional)
        None, "network interfaces to capture on (the -i flag, repeatable); needed by `dnsprobe capture`"
    )
    coremask: str = opt(
        "0x1", "CPU cores to run capture workers on, one worker process per core: a hex mask (0x3, or 3)",
        convert=hex_mask,
    )
    promiscuous: bool = opt(False, "put the interfaces in promiscuous mode (PACKET_ADD_MEMBERSHIP)")
    block_size: int = opt(
        1 << 20, "bytes per TPACKET_V3 ring block (a multiple of the page size)", min=4096, max=1 << 30
    )
    block_count: int = opt(
        32, "blocks per ring; each worker has one ring per interface of block_size x block_count bytes",
        min=1, max=65536,
    )
    block_timeout_ms: int = opt(
        100, "milliseconds after which the kernel hands over a partly filled block", min=1, max=60000
    )
    fanout_group: typing.Optional[int] = opt(  # noqa: UP045 (check_value reads typing.Optional)
        None, "PACKET_FANOUT group id of the first interface, next ones +1 (null: one no other capture uses there,"
        " derived from the process id); a group another capture uses on the interface is refused",
        min=0, max=65535,
    )
    fanout_shared: bool = opt(
        False, "join capture.fanout_group even when another capture uses it on the interface (the two then split"
        " the traffic between them)"
    )
    wait_for_interface: bool = opt(
        False, "an interface that does not exist at start is waited for (logged every minute) instead of exit status"
        " 2 naming the interfaces there are; one that is down at start, or goes down or away later, is always"
        " waited for"
    )
    wait_log_interval: float = opt(
        60.0, "seconds between worker 0's lines saying that it still waits for an interface", min=1
    )
    stats_interval: float = opt(
        10.0, "seconds between writes of the statistics JSON file, also written at start and exit (0: only then)", min=0
    )
    prometheus_port: int = opt(0, "local TCP port of the Prometheus metrics endpoint (0: off)", min=0, max=65535)
    prometheus_address: str = opt("127.0.0.1", "address the Prometheus endpoint listens on")
    top: str = opt(
        "on-demand", "count the figures of `dnsprobe top` (per second of capture time: rates, mixes, delays, top"
        " lists), served on capture.top_socket: on-demand (while a `top` asks for them, from its first request to"
        " capture.top_idle_seconds after its last), true (always; about 8 % more worker CPU per packet:"
        " docs/usage.md) or false (never)", choices=TOP_MODES, convert=top_mode,
    )
    top_idle_seconds: float = opt(
        60.0, "capture.top on-demand: the workers stop counting this many seconds (monotonic clock) after the last"
        " request of a `dnsprobe top`", min=1,
    )
    top_socket: typing.Optional[str] = opt(  # noqa: UP045
        None, "the Unix socket `dnsprobe top` reads (mode 0660, owned by capture.user; null: _dnsprobe.top.sock in"
        " the output directory)"
    )
    user: typing.Optional[str] = opt(  # noqa: UP045
        None, "user the workers switch to after opening their sockets (null: stay)"
    )
    count: int = opt(
        0, "stop the capture, as SIGTERM does, once the workers have read this many packets (tcpdump -c; 0: never)",
        min=0,
    )
    duration: float = opt(0.0, "stop the capture, as SIGTERM does, after this many seconds (0: never)", min=0)
    kernel_ip_filter: bool = opt(
        True, "put the filter.* IP lists into the kernel packet filter when they fit (false: apply them in the workers)"
    )


@dataclass(frozen=True, init=False, eq=False, repr=False)
class DpdkConfig(Options):
    enabled: bool = opt(
        False, "capture with DPDK instead of AF_PACKET (the --dpdk flag; needs the DPDK extension, see docs/dpdk.md)"
    )
    args: str = opt(
        "", "EAL arguments besides the cores (capture.coremask), shell-quoted: PCI devices (-a 0000:01:00.0),"
        " --vdev=net_pcap0,rx_pcap=FILE, --no-huge, --no-pci, -m MB, ..."
    )
    port: int = opt(0, "DPDK port to capture on, in the order EAL found the devices", min=0, max=1023)
    ring_size: int = opt(
        4096, "RX descriptors per queue (the device may round it): what arrives while a worker's pipeline works waits"
        " there; hold about 15 ms of traffic (docs/dpdk.md)", min=32, max=32768,
    )
    mempool_size: int = opt(
        0, "mbufs in the port's packet pool, shared by its queues (best 2^n - 1; more than the queues' ring_size"
        " each and the workers' batches; 0: the smallest 2^n - 1 that holds them)", min=0, max=1 << 24,
    )
    mbuf_size: int = opt(
        2048, "bytes of frame an mbuf holds; longer frames take several mbufs where the device can scatter (else"
        " it truncates or drops them: see truncated_frames and the device's counters)", min=256, max=65000,
    )
    promiscuous: bool = opt(True, "put the port in promiscuous mode (a SPAN port sees other hosts' traffic)")
    batch_timeout_ms: int = opt(
        100, "milliseconds that frames already received wait for more before they go to the pipeline as one batch"
        " (run.batch_size frames go at once), as capture.block_timeout_ms for AF_PACKET", min=1, max=60000,
    )

@dataclass(frozen=True, init=False, eq=False, repr=False)
class DnstapConfig(Options):
    message_types: tuple[str, ...] = opt(
        DNSTAP_DEFAULT_TYPES, "dnstap message types made into transactions (the others are only counted): "
        + ", ".join(DNSTAP_TYPE_NAMES), choices=DNSTAP_TYPE_NAMES,
    )
    socket: typing.Optional[str] = opt(  # noqa: UP045
        None, "Unix socket that `dnsprobe capture` listens on for dnstap producers (the --dnstap-socket flag)"
    )
    socket_owner: typing.Optional[str] = opt(  # noqa: UP045
        None, "owner of the Unix socket, a user name or id (null: the user dnsprobe runs as)"
    )
    socket_group: typing.Optional[str] = opt(  # noqa: UP045
        None, "group of the Unix socket, a group name or id (null: dnsprobe's group)"
    )
    socket_mode: str = opt(
        "0660", "permissions of the Unix socket, octal (0660): the server's user or group needs write access",
        check=octal_mode,
    )
    listen: typing.Optional[str] = opt(  # noqa: UP045
        None, "HOST:PORT that `dnsprobe capture` listens on for dnstap producers over TCP (the --dnstap-listen"
        " flag)", check=host_port,
    )
    max_connections: int = opt(
        256, "dnstap producer connections a capture worker holds at once; more are refused (counted)", min=1
    )


@dataclass(frozen=True, init=False, eq=False, repr=False)
class PrivacyConfig(Options):
    anonymize: bool = opt(
        False, "replace client addresses by their cryptopANT prefix-preserving anonymisation (key: privacy.key_file)"
    )
    key_file: typing.Optional[str] = opt(  # noqa: UP045
        None, "cryptopANT key file, the same as DNS Probe's (`dnsprobe keygen FILE` creates one)"
    )
    client_ipv4_prefix: int = opt(
        32, "keep only the first N bits of client IPv4 addresses, after anonymisation (32: all)", min=0, max=32
    )
    client_ipv6_prefix: int = opt(
        128, "keep only the first N bits of client IPv6 addresses, after anonymisation (128: all)", min=0, max=128
    )


def _networks(family, allow):
    if allow:
        meaning = f"keep only packets from or to these; when set, ipv{family}_deny is not used"
    else:
        meaning = f"drop packets from or to these (when ipv{family}_allow is empty)"
    return opt((), f"IPv{family} addresses or CIDR prefixes: {meaning}", check=check_network(family), allow_empty=True)


@dataclass(frozen=True, init=False, eq=False, repr=False)
class FilterConfig(Options):
    ipv4_allow: tuple[str, ...] = _networks(4, True)
    ipv4_deny: tuple[str, ...] = _networks(4, False)
    ipv6_allow: tuple[str, ...] = _networks(6, True)
    ipv6_deny: tuple[str, ...] = _networks(6, False)
    expression: typing.Optional[str] = opt(  # noqa: UP045
        None, "BPF filter expression in tcpdump's syntax, compiled by libpcap (the --filter flag): a frame is kept when"
        " it passes this and the built-in DNS filter (live: in the kernel; read: before decoding) (null: none)",
        check=check_expression,
    )


@dataclass(frozen=True, init=False, eq=False, repr=False)
class EnrichConfig(Options):
    geoip_country: typing.Optional[str] = opt(  # noqa: UP045
        None, "MaxMind-format country database (GeoLite2-Country or -City): fills country and"
        " edns_client_subnet_country (null: off)",
    )
    geoip_asn: typing.Optional[str] = opt(  # noqa: UP045
        None, "MaxMind-format ASN database (GeoLite2-ASN): fills asn and edns_client_subnet_asn (null: off)"
    )
    public_resolvers: bool = opt(
        False, "fill is_google, is_opendns and public_resolver from the public resolvers' prefix lists"
    )
    resolver_lists: typing.Optional[str] = opt(  # noqa: UP045
        None, "directory of prefix lists NAME.txt replacing the bundled ones (null: export/enrich/resolvers/)"
    )
    public_suffix: bool = opt(False, "fill registered_domain and public_suffix from the Public Suffix List")
    public_suffix_file: typing.Optional[str] = opt(  # noqa: UP045
        None, "Public Suffix List file (null: the snapshot bundled with the publicsuffixlist package)"
    )
    public_suffix_private: bool = opt(
        False, "also use the list's PRIVATE section (blogspot.com, github.io, ...); false: ICANN section only"
    )
    cache_size: int = opt(200000, "entries of each lookup cache of a worker (cleared when full)", min=1,
                          max=100_000_000)


@dataclass(frozen=True, init=False, eq=False, repr=False)
class Config(Options):
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    match: MatchConfig = field(default_factory=MatchConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    run: RunConfig = field(default_factory=RunConfig)
    capture: CaptureConfig = field(default_factory=CaptureConfig)
    dpdk: DpdkConfig = field(default_factory=DpdkConfig)
    dnstap: DnstapConfig = field(default_factory=DnstapConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    filter: FilterConfig = field(default_factory=FilterConfig)
    enrich: EnrichConfig = field(default_factory=EnrichConfig)


SECTIONS = {f.name: f.default_factory for f in dataclasses.fields(Config)}


def options():
    """Yield (dotted key, dataclasses.Field, resolved type) for every option, in order."""
    for section, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            yield f"{section}.{f.name}", f, hints[f.name]


def load_config(path=None, overrides=None):
    """Build the Config: defaults ← YAML file (None: none) ← overrides ({'section.key': value}; a Text value is
    read by the key's type)."""
    types = {key: typ for key, _, typ in options()}
    values = {} if path is None else flatten(read_yaml(path), f"config file {path}", types)
    splits = {key for key, f, _ in options() if f.metadata["split"]}
    for key, value in (overrides or {}).items():
        if key not in types:
            raise unknown_key(key, types)
        values[key] = value_from_text(key, value, types[key], key in splits) if isinstance(value, Text) else value
    sections = {}
    for key, f, typ in options():
        section, name = key.split(".")
        if key in values:
            sections.setdefault(section, {})[name] = check_value(key, values[key], typ, f.metadata)
    return Config(**{s: SECTIONS[s](**sections.get(s, {})) for s in SECTIONS})


def render_default_yaml():
    """The text of config/dnsprobe.yml: every option, its default and a one-line comment."""
    return render_yaml(None)


def render_yaml(cfg):
    """A configuration as YAML that `-c` reads back to the same configuration: every option with a one-line
    comment; cfg None: the built-in defaults (the text of config/dnsprobe.yml)."""
    if cfg is None:
        lines = [
            "# dnsprobe default configuration. Every option is listed with its default value.",
            "# Override with `-c FILE` (same layout, any subset of keys) and command-line flags.",
            "# Generated from probe/config.py by `dnsprobe config --defaults`; tests check they agree.",
        ]
    else:
        lines = [
            "# dnsprobe configuration: every option with its effective value (built-in defaults, -c FILE, flags).",
            "# `dnsprobe config ... > FILE` then `-c FILE` gives the same configuration.",
        ]
    current = None
    for key, f, _ in options():
        section, name = key.split(".")
        if section != current:
            lines += ["", f"{section}:"]
            current = section
        default = f.default if cfg is None else getattr(getattr(cfg, section), name)
        default = list(default) if isinstance(default, tuple) else default
        value = yaml_module().safe_dump(default, default_flow_style=True).strip()
        value = value.split("\n")[0] if value.endswith("...") else value  # (a scalar's document end)
        if isinstance(default, str) and f.metadata["convert"] and value != default:
            plain = yaml_module().safe_load(default)  # capture.top's true and false: as the boolean they were
            if isinstance(plain, bool) and f.metadata["convert"](plain) == default:
                value = default
        lines.append(f"  # {f.metadata['help']}")
        lines.append(f"  {name}: {value}")
    return "\n".join(lines) + "\n"
