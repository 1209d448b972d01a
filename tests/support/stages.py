"""The messages and transactions of a capture through the stages in-process (decode, match)."""

from support.data import skip_without_shared


def transactions(path, keep_raw=True):
    """The transactions of a capture file, decoded and matched with the default configuration (keep_raw: with the
    DNS messages' bytes, as C-DNS and the answers column read them)."""
    skip_without_shared(path)
    from probe.capture.pcapfile import read_capture
    from probe.config import load_config
    from probe.decode.ipfilter import IpFilter
    from probe.decode.packets import PacketDecoder
    from probe.match import TransactionTable
    from probe.stats import Stats

    cfg = load_config()
    stats = Stats()
    decoder = PacketDecoder(cfg.decode, cfg.decode.dns_ports, stats, IpFilter(cfg.filter), keep_raw=keep_raw)
    table = TransactionTable(cfg.match, stats)
    txs = []
    for batch in read_capture(path, 4096):
        txs += table.add(decoder.decode(batch, str(path)))
    decoder.flush()
    return txs + table.flush()


def dns_messages(path):
    """Every DNS message payload of a capture, as `dnsprobe read` finds them."""
    skip_without_shared(path)
    bufs = []

    def grab(buf):
        bufs.append(bytes(buf))
        return parse_message(buf)

    from probe.capture.pcapfile import read_capture
    from probe.config import DecodeConfig
    from probe.decode.dnswire import parse_message
    from probe.decode.packets import PacketDecoder
    from probe.stats import Stats

    decoder = PacketDecoder(DecodeConfig(parser="wire"), (53,), Stats())  # every message through self.parse
    decoder.parse = grab
    for batch in read_capture(path):
        decoder.decode(batch, str(path))
    decoder.flush()
    return bufs
