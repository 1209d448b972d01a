"""The unit that flows from a capture source to the decoder: a batch of frames in columns."""

from dataclasses import dataclass, field

# Link-layer types (LINKTYPE_* numbers as in pcap files; see tcpdump's linktypes list).
LINKTYPE_NULL = 0
LINKTYPE_ETHERNET = 1
LINKTYPE_RAW = 101
LINKTYPE_LOOP = 108
LINKTYPE_LINUX_SLL = 113
LINKTYPE_IPV4 = 228
LINKTYPE_IPV6 = 229
LINKTYPE_LINUX_SLL2 = 276
# DLT_RAW as some systems write it in the pcap header (12 on most, 14 on OpenBSD).
LINKTYPE_RAW_ALIASES = (12, 14)


@dataclass(slots=True)
class FrameBatch:
    """Frames that share one link type. Three parallel lists, one entry per frame.

    ts_ns: capture timestamp, integer nanoseconds since the epoch (never the wall clock)
    wirelen: original frame length on the wire
    data: captured bytes (possibly shorter than wirelen when a snaplen cut it)
    """

    linktype: int
    ts_ns: list = field(default_factory=list)
    wirelen: list = field(default_factory=list)
    data: list = field(default_factory=list)

    def __len__(self):
        return len(self.data)
