"""`dnsprobe inspect --summary`: what a set of Parquet or C-DNS files holds, without SQL, as text for people or as
one JSON object. The figures are probe.cli.aggregate's (those of `dnsprobe report` too)."""


from probe.cli.aggregate import PERCENTILES_PERMILLE, summarise
from probe.errors import ConfigError


def run_summary(args):
    """inspect --summary: the summary of the files as text for people or, with --json, one JSON object."""
    import json

    from probe.cli.inspect import _expand
    from probe.cli.output import read_in_part

    if args.pcap or args.columns or args.all_columns:
        raise ConfigError("--summary takes --json and --limit (the length of its lists) only")
    top = SUMMARY_TOP if args.limit is None else args.limit
    if top < 0:
        raise ConfigError("--limit must be 0 or more")
    paths = _expand(args.files)
    summary, errors = summarise(paths, top)
    print(json.dumps(summary, indent=2) if args.json else "\n".join(summary_text(summary)))
    return read_in_part(errors)


def summary_text(s):
    """The lines of the summary for people: counts with thousands separators, shares in per cent, delays in µs,
    ms or s, QTYPE and RCODE by name, lists ranked, names cut to fit 120 columns."""
    records = s["records"]
    lines = [f"{records:,} record{'s' * (records != 1)} in {s['files']:,} file{'s' * (s['files'] != 1)}"]
    if not records:
        return lines
    if s["time"]:
        t = s["time"]
        lines.append(f"time span     {t['first']} to {t['last']} ({_seconds(t['seconds'])})")
    if s["rate"]:
        r = s["rate"]
        mean = "-" if r["mean_per_second"] is None else f"{r['mean_per_second']:,.0f}"
        lines.append(f"per second    {mean} on average; the busiest second {r['peak_per_second']:,} "
                     f"({r['peak_second']})")
    tx = s["transactions"]
    lines.append("transactions  " + ", ".join(f"{tx[k]:,} {label} ({_share(tx[k], records)})" for k, label in (
        ("matched", "matched"), ("query_only", "query only"), ("response_only", "response only"))))
    lines += _ranking("transport", [(TRANSPORT_NAMES.get(r["transport"], r["transport"] or "unknown"), r["count"])
                                    for r in s["transports"]], records)
    lines += _ranking("QTYPE", [(r["name"] or "- (none)", r["count"]) for r in s["qtypes"]], records)
    lines += _ranking("RCODE", [(r["name"] or "- (no response)", r["count"]) for r in s["rcodes"]], records)
    for key, what in (("qnames", "QNAMEs"), ("registered_domains", "registered domains"), ("clients", "clients")):
        ranked, column = s[key], {"qnames": "qname", "clients": "src"}.get(key, "registered_domain")
        title = f"top {len(ranked['top'])} {what} of {ranked['distinct']:,}" if ranked["top"] else \
            f"{ranked['distinct']:,} {what}"
        lines += _ranking(title, [(_name(r[column], key), r["count"]) for r in ranked["top"]], records)
    if s["response_delay_us"]:
        lines += _delay_lines(s["response_delay_us"])
    return lines


TRANSPORT_NAMES = {"udp": "UDP", "tcp": "TCP", "dot": "DoT", "doh": "DoH", "doq": "DoQ",
                   "dnscrypt-udp": "DNSCrypt over UDP", "dnscrypt-tcp": "DNSCrypt over TCP"}
SUMMARY_TOP = 10  # lines of each top list unless --limit says otherwise
TEXT_WIDTH = 120
BAR_WIDTH = 50
EIGHTHS = " ▏▎▍▌▋▊▉"


def _name(value, key):
    if value == "" and key == "registered_domains":
        return "- (none: the name is a public suffix)"
    return value if value else '""'


def _share(count, total):
    return f"{100 * count / total:.1f} %" if total else "-"


def _ranking(title, rows, total):
    """A blank line, the title, and a line per (label, count): count, share, label (cut to fit)."""
    lines = ["", title]
    for label, count in rows:
        line = f"  {count:>13,}  {_share(count, total):>7}  "
        room = TEXT_WIDTH - len(line)
        lines.append(line + (label if len(label) <= room else label[: room - 1] + "…"))
    return lines


def _seconds(seconds):
    return f"{seconds:,.3f} s" if seconds < 3600 else f"{seconds / 3600:,.2f} h"


def _delay(us):
    """A delay in its unit: µs under a millisecond, ms under a second, else s (three digits at most)."""
    for unit, scale in (("s", 1_000_000), ("ms", 1_000)):
        if abs(us) >= scale:
            return f"{us / scale:.3g} {unit}"
    return f"{us:.3g} µs" if isinstance(us, float) else f"{us} µs"


def _delay_lines(d):
    lines = ["", f"response delay of {d['count']:,} matched transactions"]
    figures = ["min", *(f"p{p / 10:g}" for p in PERCENTILES_PERMILLE), "max", "mean"]
    lines.append("  " + "   ".join(f"{name} {_delay(d[name])}" for name in figures))
    peak = max(b["count"] for b in d["histogram"])
    for b in d["histogram"]:
        low = "below" if b["from_us"] is None else _delay(b["from_us"])
        eighths = round(8 * BAR_WIDTH * b["count"] / peak)
        bar = "█" * (eighths // 8) + (EIGHTHS[eighths % 8] if eighths % 8 else "")
        lines.append(f"  {low:>7} to {_delay(b['to_us']):>6}  {bar:<{BAR_WIDTH}}  {b['count']:>13,}  "
                     f"{_share(b['count'], d['count']):>7}")
    return lines
