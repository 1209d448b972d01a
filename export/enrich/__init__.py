"""Enrichment: columns of the record table filled from other columns of it, before client privacy.

Each step is a callable table → table with its own per-worker caches (export.lookup), and a reload() that picks
up new files (live capture: SIGHUP):

- export.enrich.geo: country and AS number of the client (src) and of the EDNS client subnet, from
  MaxMind-format databases (enrich.geoip_country, enrich.geoip_asn);
- export.enrich.resolvers: is_google, is_opendns and public_resolver from prefix lists (enrich.public_resolvers);
- export.enrich.psl: registered_domain and public_suffix from the Public Suffix List (enrich.public_suffix);
- server_location: the probe's server name (export.server_name; with the hive layout, the host name).

The steps read only the record table, so they work on whatever builds it. They run before client privacy
(export.parquet.privacy), so a lookup is of the real address, and only the written address is anonymised.
"""


def lookup_address(text):
    """The address to look up for a client address or a client subnet 'address/prefix' (None: nothing); an
    IPv4-mapped IPv6 address is looked up as the IPv4 address it carries."""
    text = text.partition("/")[0]
    if not text:
        return None
    if text.startswith("::ffff:") and "." in text:
        return text[7:]
    return text


class ServerLocation:
    """server_location ← the probe's server name."""

    def __init__(self, name):
        self.name = name

    def __call__(self, table):
        import pyarrow as pa  # (here: this package is imported by the C-DNS workers' `top` counting, without Arrow)

        i = table.schema.get_field_index("server_location")
        return table.set_column(i, "server_location", pa.repeat(pa.scalar(self.name, pa.string()), table.num_rows))


class Enricher:
    """The configured steps, applied in order."""

    def __init__(self, steps):
        self.steps = steps

    def __call__(self, table):
        for step in self.steps:
            table = step(table)
        return table

    def reload(self):
        for step in self.steps:
            getattr(step, "reload", lambda: None)()


def make_enricher(cfg):
    """The Enricher of a configuration, or None when nothing is to be filled. A database or list that cannot be
    read is a ConfigError naming its key."""
    e = cfg.enrich
    steps = []
    if e.geoip_country or e.geoip_asn:
        from export.enrich.geo import GeoLookup

        steps.append(GeoLookup(e.geoip_country, e.geoip_asn, e.cache_size))
    if e.public_resolvers:
        from export.enrich.resolvers import PublicResolvers

        steps.append(PublicResolvers(e.resolver_lists, e.cache_size))
    if e.public_suffix:
        from export.enrich.psl import PublicSuffixes

        steps.append(PublicSuffixes(e.public_suffix_file, e.public_suffix_private, e.cache_size))
    if cfg.export.server_name is not None or cfg.export.layout == "hive":
        from export.parquet.writer import server_name

        steps.append(ServerLocation(server_name(cfg.export)))
    return Enricher(steps) if steps else None
