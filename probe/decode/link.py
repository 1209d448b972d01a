"""Link layers: find the network header in a frame.

Each function takes the frame bytes and returns (ethertype, offset of the network header, vlan id)
or None when the frame carries no IP. One function per link type, chosen once per batch.
"""

import struct

from probe.model import (
    LINKTYPE_ETHERNET,
    LINKTYPE_IPV4,
    LINKTYPE_IPV6,
    LINKTYPE_LINUX_SLL,
    LINKTYPE_LINUX_SLL2,
    LINKTYPE_LOOP,
    LINKTYPE_NULL,
    LINKTYPE_RAW,
    LINKTYPE_RAW_ALIASES,
)

ETH_IPV4 = 0x0800
ETH_IPV6 = 0x86DD
# 802.1Q customer tag, 802.1ad service tag, and the pre-standard QinQ tag.
VLAN_TAGS = frozenset((0x8100, 0x88A8, 0x9100))
_H = struct.Struct("!H").unpack_from


def _tags(frame, etype, off):
    """Skip VLAN tags starting at off; returns (inner ethertype, offset after the tags, outer VLAN id)."""
    vlan = None
    while etype in VLAN_TAGS:
        if vlan is None:
            vlan = _H(frame, off)[0] & 0x0FFF
        etype = _H(frame, off + 2)[0]
        off += 4
    return etype, off, vlan


def ethernet(frame):
    return _tags(frame, (frame[12] << 8) | frame[13], 14)


def linux_sll(frame):
    # 16-byte header; protocol type in the last two bytes.
    return _tags(frame, (frame[14] << 8) | frame[15], 16)


def linux_sll2(frame):
    # 20-byte header; protocol type first.
    etype = (frame[0] << 8) | frame[1]
    return etype, 20, None


def raw_ip(frame):
    version = frame[0] >> 4
    if version == 4:
        return ETH_IPV4, 0, None
    if version == 6:
        return ETH_IPV6, 0, None
    return 0, 0, None


def ipv4_only(frame):
    return ETH_IPV4, 0, None


def ipv6_only(frame):
    return ETH_IPV6, 0, None


def bsd_null(frame):
    # 4-byte address family in the capturing host's byte order; either order is accepted.
    family = frame[0] | frame[3]
    if family == 2:
        return ETH_IPV4, 4, None
    if family in (10, 24, 28, 30):
        return ETH_IPV6, 4, None
    return 0, 4, None


LINK_DECODERS = {
    LINKTYPE_ETHERNET: ethernet,
    LINKTYPE_LINUX_SLL: linux_sll,
    LINKTYPE_LINUX_SLL2: linux_sll2,
    LINKTYPE_RAW: raw_ip,
    LINKTYPE_IPV4: ipv4_only,
    LINKTYPE_IPV6: ipv6_only,
    LINKTYPE_NULL: bsd_null,
    LINKTYPE_LOOP: bsd_null,
}
for _alias in LINKTYPE_RAW_ALIASES:
    LINK_DECODERS[_alias] = raw_ip

LINK_NAMES = {
    LINKTYPE_ETHERNET: "Ethernet",
    LINKTYPE_LINUX_SLL: "Linux cooked (SLL)",
    LINKTYPE_LINUX_SLL2: "Linux cooked v2 (SLL2)",
    LINKTYPE_RAW: "raw IP",
    LINKTYPE_IPV4: "raw IPv4",
    LINKTYPE_IPV6: "raw IPv6",
    LINKTYPE_NULL: "BSD loopback",
    LINKTYPE_LOOP: "OpenBSD loopback",
}
