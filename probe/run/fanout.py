"""The fanout group of each interface of a capture: one that no other capture on the interface uses, unless asked.

The sockets of one capture's workers on an interface join one PACKET_FANOUT group, which spreads the flows over
them. Another capture that joined the same group on the same interface would take a share of the traffic from
this one, silently; so a group in use there (probe.capture.packetdiag lists them) is refused when given by
capture.fanout_group, unless capture.fanout_shared says to join it, and skipped when the id is derived."""

import os
import socket

from probe.capture.packetdiag import packet_sockets, socket_owner
from probe.errors import ConfigError
from probe.run.log import log


def _groups_in_use():
    """{(interface index, fanout group id): a socket inode in it}, or None when the kernel cannot list them."""
    try:
        return {(index, group): ino for ino, index, group in packet_sockets() if group is not None}
    except OSError as exc:
        log(f"cannot list the packet sockets to check the fanout groups ({exc.strerror}); not checked")
        return None


def fanout_ids(capture_cfg, interfaces):
    """The fanout group id of each interface (the first's, then +1 for each next one)."""
    count = len(interfaces)
    used = _groups_in_use()
    indexes = []
    for ifname in interfaces:
        try:
            indexes.append(socket.if_nametoindex(ifname))
        except OSError:
            indexes.append(None)  # absent at start (capture.wait_for_interface): nothing to meet there yet

    def clash(base):
        for i, index in enumerate(indexes):
            group = (base + i) & 0xFFFF
            if used and index is not None and (index, group) in used:
                return interfaces[i], group, used[(index, group)]
        return None

    given = capture_cfg.fanout_group
    if given is not None:
        found = clash(given)
        if found and not capture_cfg.fanout_shared:
            ifname, group, ino = found
            pid = socket_owner(ino)
            who = f"process {pid}" if pid else "another process"
            raise ConfigError(
                f"config key 'capture.fanout_group': group {group} is already used on interface {ifname!r} by "
                f"{who}; two captures in one group split the traffic between them. Give another group, leave "
                "it null (a free one is chosen), or set capture.fanout_shared: true to share the traffic"
            )
        return tuple((given + i) & 0xFFFF for i in range(count))
    base = os.getpid() & 0xFFFF
    for _ in range(1 << 16):
        if not clash(base):
            break
        base = (base + count) & 0xFFFF
    return tuple((base + i) & 0xFFFF for i in range(count))
