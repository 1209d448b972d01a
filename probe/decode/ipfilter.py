"""IP allow/deny lists (filter.*, DNS Probe's semantics): which packets the decoder keeps.

A packet is kept when its source or destination is in the family's allowlist; with no allowlist, it is
dropped when its source or destination is in the denylist. Live capture may put the same lists in the
kernel filter (probe.capture.bpf), in which case the workers do not apply them again.
"""

import ipaddress


def check_network(family):
    """A config check: the text must be an IPv`family` address or CIDR prefix."""

    def check(text):
        try:
            net = ipaddress.ip_network(text, strict=False)
        except ValueError:
            raise ValueError(f"{text!r} is not an IPv{family} address or CIDR prefix") from None
        if net.version != family:
            raise ValueError(f"{text!r} is an IPv{net.version} prefix, not IPv{family}")
        return text

    return check


class _FamilyFilter:
    """One family's lists: a packet is kept when its source or destination is in the allowlist; with no
    allowlist, it is dropped when its source or destination is in the denylist."""

    def __init__(self, allow, deny, max_cache=100_000):
        self.allow = bool(allow)
        nets = [ipaddress.ip_network(t, strict=False) for t in (allow or deny)]
        self.prefixes = [(int(n.network_address), n.prefixlen) for n in nets]
        self._terms = [(int(n.netmask), int(n.network_address)) for n in nets]
        self._cache = {}
        self._max_cache = max_cache

    def listed(self, packed):
        hit = self._cache.get(packed)
        if hit is None:
            if len(self._cache) > self._max_cache:
                self._cache.clear()
            x = int.from_bytes(packed, "big")
            hit = self._cache[packed] = any(x & mask == net for mask, net in self._terms)
        return hit

    def keep(self, src, dst):
        listed = self.listed
        return (listed(src) or listed(dst)) == self.allow


class IpFilter:
    """keep4 / keep6: callables (src, dst) → bool, or None when that family is not filtered."""

    def __init__(self, filter_cfg):
        self.v4 = self.v6 = None
        if filter_cfg.ipv4_allow or filter_cfg.ipv4_deny:
            self.v4 = _FamilyFilter(filter_cfg.ipv4_allow, filter_cfg.ipv4_deny)
        if filter_cfg.ipv6_allow or filter_cfg.ipv6_deny:
            self.v6 = _FamilyFilter(filter_cfg.ipv6_allow, filter_cfg.ipv6_deny)
        self.keep4 = self.v4.keep if self.v4 else None
        self.keep6 = self.v6.keep if self.v6 else None

    def __bool__(self):
        return self.v4 is not None or self.v6 is not None
