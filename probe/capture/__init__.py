"""Capture stage: every source of input, each yielding batches (probe.model): FrameBatch of frames, DnstapBatch of
dnstap messages.

- files: an input file recognised by its content (pcap, pcapng or dnstap), plain or compressed;
- pcapfile: pcap and pcapng files, plain or compressed (PcapFileSource; _pcaprecords.c splits records in C);
- afpacket: a live AF_PACKET TPACKET_V3 ring in a fanout group (AfPacketSource), its kernel filter in bpf;
- dpdk: a DPDK port's RX queue or a worker's ring (DpdkSource; _dpdk.c, built where libdpdk is found);
- dnstap_file, dnstap_socket: dnstap files and producers' connections (DnstapFileSource, DnstapSocketSource),
  over Frame Streams (fstrm, fstrm_session), on the listening sockets of dnstap_listen.
A new source is one new module with a class that has the Source interface below.
"""

from typing import Protocol

from probe.model import DnstapBatch, FrameBatch


class Source(Protocol):
    """The capture stage's interface, as the pipeline's runners (probe.run) use it."""

    name: str  # the interface, port queue or file, for messages and statistics

    def read(self, max_frames: int) -> FrameBatch | DnstapBatch | None:
        """Up to about max_frames frames available now (possibly none, live); None once the input has ended."""

    def fileno(self) -> int:
        """A descriptor that polls readable when frames wait, or -1 when read() is always worth calling."""

    def counters(self) -> dict:
        """The source's own counters by name (frames read; the kernel's or the port's counters, live)."""

    def close(self):
        """Release the socket, ring, port queue or file."""
