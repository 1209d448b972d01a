"""Country and AS number of the client (src) and of the EDNS client subnet's address, from MaxMind-format
databases (GeoLite2-Country or -City, GeoLite2-ASN) read by maxminddb's C reader.

- country: the ISO 3166 code of the record's `country`, else of its `registered_country` (an address whose
  location is unknown, e.g. anycast, still has the country it is registered in), else "";
- asn: `autonomous_system_number` as decimal digits, as DNS Probe writes it, else "";
- an IPv4-mapped IPv6 address (::ffff:a.b.c.d) is looked up as the IPv4 address it carries;
- the client subnet 'address/prefix' is looked up by its address (the bits the client sent, zeros after).

A file that is missing, unreadable, not a MaxMind database, or of the other kind (ASN for country), is a
ConfigError naming the key. reload() opens the file again when it has changed on disk, keeping the old database
(and saying so) when the new one cannot be read.
"""

import os
import sys

import maxminddb

from export.enrich import lookup_address
from export.lookup import LookupCache
from probe.errors import ConfigError

COUNTRY_KEY = "enrich.geoip_country"
ASN_KEY = "enrich.geoip_asn"


def _country(record):
    if not isinstance(record, dict):
        return ""
    for key in ("country", "registered_country"):
        code = (record.get(key) or {}).get("iso_code")
        if code:
            return code
    return ""


def _asn(record):
    number = record.get("autonomous_system_number") if isinstance(record, dict) else None
    return "" if number is None else str(number)


class Database:
    """One MaxMind-format file, opened with the C reader, and the time it was opened at (to see changes)."""

    def __init__(self, path, key, kind):
        self.path, self.key, self.kind = path, key, kind
        self.reader, self.stamp = self._open()

    def _stamp(self):
        st = os.stat(self.path)
        return st.st_ino, st.st_size, st.st_mtime_ns

    def _open(self):
        def bad(problem):
            return ConfigError(f"config key '{self.key}': {self.path}: {problem}")

        if os.path.isdir(self.path):
            raise bad("is a directory")
        try:
            stamp = self._stamp()
            reader = maxminddb.open_database(self.path, maxminddb.MODE_AUTO)
        except FileNotFoundError:
            raise bad("no such file") from None
        except maxminddb.InvalidDatabaseError as exc:
            raise bad(f"not a MaxMind DB file ({exc})") from None
        except (OSError, ValueError) as exc:
            raise bad(getattr(exc, "strerror", None) or str(exc)) from None
        kind = reader.metadata().database_type
        other = "Country" if self.kind == "ASN" else "ASN"
        if other.lower() in kind.lower() and self.kind.lower() not in kind.lower():
            reader.close()
            raise bad(f"a {kind} database, where a {self.kind} database is expected")
        return reader, stamp

    def get(self, address):
        try:
            return self.reader.get(address)
        except ValueError:  # not an address (cannot happen for the probe's own text; kept safe)
            return None

    def reload(self):
        """Open the file again if it changed; True when a new database is in use."""
        try:
            if self._stamp() == self.stamp:
                return False
            reader, stamp = self._open()
        except (OSError, ConfigError) as exc:
            print(f"dnsprobe: {exc}; keeping the database loaded before", file=sys.stderr)
            return False
        self.reader.close()
        self.reader, self.stamp = reader, stamp
        return True


class GeoLookup:
    """table → table with country/asn and edns_client_subnet_country/_asn filled."""

    def __init__(self, country_path=None, asn_path=None, cache_size=200_000):
        self.country = Database(country_path, COUNTRY_KEY, "Country") if country_path else None
        self.asn = Database(asn_path, ASN_KEY, "ASN") if asn_path else None
        # One cache for the configured databases, each text looked up once for both; it serves the client and
        # the client subnet columns alike (a subnet's address is an address like a client's).
        self.fields = [(name, db, field) for name, db, field in (("country", self.country, _country),
                                                                 ("asn", self.asn, _asn)) if db is not None]
        self.cache = LookupCache(self.lookup, cache_size, width=len(self.fields))

    def lookup(self, text):
        """The configured databases' results (country and/or asn) for a client address or subnet."""
        address = lookup_address(text)
        results = tuple(field(db.get(address)) if address else "" for _, db, field in self.fields)
        return results if len(results) > 1 else results[0]

    def __call__(self, table):
        names = table.schema.names
        for source, prefix in (("src", ""), ("edns_client_subnet", "edns_client_subnet_")):
            for (name, _, _), column in zip(self.fields, self.cache.columns(table.column(source), null="")):
                table = table.set_column(names.index(prefix + name), prefix + name, column)
        return table

    def reload(self):
        if any([db.reload() for _, db, _ in self.fields]):  # (every one reloaded: no short cut)
            self.cache.clear()
