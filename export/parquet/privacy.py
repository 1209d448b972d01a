"""Client privacy on a table of records: the client address (src) and the EDNS client subnet's address
anonymised and/or cut to a prefix (export.anonymise.ClientPrivacy), after enrichment, so that what is looked up
(country, AS number, public resolver) belongs to the real address and only the written address is transformed.

Each address is transformed once and kept in a per-worker cache (export.lookup).
"""

import socket

from export.lookup import LookupCache


def _family(text):
    return socket.AF_INET6 if ":" in text else socket.AF_INET


class TablePrivacy:
    """table → table with src and edns_client_subnet transformed by a ClientPrivacy."""

    def __init__(self, client, cache_size=200_000):
        self.client = client
        self._clients = LookupCache(self._address, cache_size)
        self._subnets = LookupCache(client.subnet, cache_size)

    def _address(self, text):
        family = _family(text)
        return socket.inet_ntop(family, self.client.address(socket.inet_pton(family, text)))

    def __call__(self, table):
        names = table.schema.names
        src = names.index("src")
        ecs = names.index("edns_client_subnet")
        (clients,) = self._clients.columns(table.column(src))
        (subnets,) = self._subnets.columns(table.column(ecs))
        return table.set_column(src, "src", clients).set_column(ecs, "edns_client_subnet", subnets)
