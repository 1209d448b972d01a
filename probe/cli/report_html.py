"""The HTML page of `dnsprobe report`: the figures of probe.cli.aggregate as plots and tables in one file.

The page asks nothing of the network: no script, no external style sheet, font or image; each plot is an SVG
drawn by matplotlib (Agg backend, nothing shown) and written inline, its text left as text (svg.fonttype none:
the browser's own sans-serif font draws it). The figures plotted are in the page as JSON too (a hidden <pre>,
FIGURES_ID), so that a script or a test reads the numbers the page states. matplotlib is imported here only, so
that the other commands do not pay for it. Nothing on the page comes from the wall clock: the same records give
the same page.
"""

import html
import io
import json

from probe.cli.summary import TRANSPORT_NAMES, _delay, _seconds, _share

# The plots of the page, in order (their titles): the test counts them.
PLOT_TITLES = (
    "Transactions per second by RCODE",
    "Query-only (unanswered) share of the queries",
    "Response delay CDF by transport",
    "Response delay histogram by transport",
    "QTYPE mix",
    "Top QNAMEs",
    "Top registered domains",
    "Top clients",
    "Transports",
    "EDNS buffer sizes of the queries",
    "DO bit of the queries",
    "Truncated (TC) responses by transport",
)
FIGURES_ID = "dnsprobe-figures"  # the element holding aggregate.report_of's dict as JSON
WIDTH_INCHES, HEIGHT_INCHES = 9.0, 3.4
BAR_ROWS = 15  # bars of a mix (QTYPEs, EDNS buffer sizes) at most; the rest is one bar, "other"
LABEL_CHARACTERS = 48  # a longer name is cut with …
STYLE = """
body { font-family: sans-serif; margin: 1.5em auto; max-width: 60em; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; margin-top: 1.6em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: .5em 0; font-size: .9em; }
td, th { border: 1px solid #ddd; padding: .2em .6em; text-align: left; vertical-align: top; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 1em 0; } figure svg { max-width: 100%; height: auto; }
"""


def page(report, meta, paths_text):
    """The HTML text of the report (report: aggregate.report_of's dict, meta: aggregate.files_meta's)."""
    parts = [f"<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>dnsprobe report"
             f"</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<h1>dnsprobe report</h1>\n<p>{_e(paths_text)}</p>"]
    parts += ["<h2>Files</h2>", _meta_table(report, meta), "<h2>Overview</h2>", _overview_table(report)]
    figures = plots(report)
    parts.append("<h2>Plots</h2>")
    parts += [f"<figure>\n{svg}\n</figure>" for svg in figures]
    parts.append(f"<pre id=\"{FIGURES_ID}\" hidden>{_e(json.dumps(report))}</pre>")
    parts.append("</body>\n</html>\n")
    return "\n".join(parts)


def plots(report):
    """The SVG text of each plot of PLOT_TITLES."""
    import matplotlib

    matplotlib.use("Agg")
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "dnsprobe", "text.parse_math": False,
                                "font.family": "sans-serif", "font.size": 9, "axes.spines.top": False,
                                "axes.spines.right": False}):
        drawers = (_rate_by_rcode, _query_only, _delay_cdf, _delay_histogram, _qtypes, _qnames, _domains, _clients,
                   _transports, _buffer_sizes, _do_bit, _truncated)
        return [_svg(title, draw, report) for title, draw in zip(PLOT_TITLES, drawers)]


def _svg(title, draw, report):
    """A figure drawn by draw(axes, report) (False: it had nothing to draw) as inline SVG, titled."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(WIDTH_INCHES, HEIGHT_INCHES), layout="constrained")
    ax.set_title(title, loc="left", fontweight="bold")
    if draw(ax, report) is False:
        ax.set_axis_off()
        ax.text(0.5, 0.5, "no records for this plot", ha="center", va="center", transform=ax.transAxes)
    out = io.StringIO()
    fig.savefig(out, format="svg", metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    plt.close(fig)
    text = out.getvalue()
    svg = text[text.index("<svg"):]  # without the XML declaration and DOCTYPE (not allowed inside HTML)
    return svg.replace("<svg", f"<svg role=\"img\" aria-label=\"{_e(title)}\"", 1).replace(
        ">", f">\n<title>{_e(title)}</title>", 1)


def _times(timeline):
    import numpy as np

    return np.array(timeline["buckets"], dtype="datetime64[us]")


def _time_axis(ax):
    import matplotlib.dates as mdates

    locator = mdates.AutoDateLocator()
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    ax.set_xlabel("time (UTC)")


def _rate_by_rcode(ax, report):
    timeline = report["timeline"]
    if not timeline:
        return False
    width = timeline["bucket_seconds"]
    names = [name or "no response" for name in timeline["rcodes"]]
    rates = [[c / width for c in counts] for counts in timeline["rcodes"].values()]
    ax.stackplot(_times(timeline), rates, labels=names, step="post")
    ax.set_ylabel(f"per second (buckets of {_seconds_text(width)})")
    ax.legend(loc="upper left", bbox_to_anchor=(1, 1), fontsize=8, frameon=False)
    _time_axis(ax)


def _seconds_text(seconds):
    return _delay(round(seconds * 1_000_000))


def _query_only(ax, report):
    import numpy as np

    timeline = report["timeline"]
    if not timeline:
        return False
    shares = np.array([np.nan if s is None else 100 * s for s in timeline["query_only_share"]])
    ax.step(_times(timeline), shares, where="post")
    ax.set_ylim(0, max(1.0, float(np.nanmax(shares)) * 1.1) if np.isfinite(shares).any() else 1.0)
    ax.set_ylabel("% of the queries without a response")
    _time_axis(ax)


def _delay_cdf(ax, report):
    def line(transport, d):
        q = d["quantiles"]
        ax.step(q, [100 * i / (len(q) - 1) for i in range(len(q))], where="post",
                label=f"{_transport(transport)} ({d['count']:,}; p50 {_delay(d['p50'])}, p99 {_delay(d['p99'])})")

    return _delay_lines(ax, report, line, "% of the matched transactions", "lower right", ylim=(0, 100))


def _delay_histogram(ax, report):
    def line(transport, d):
        buckets = d["histogram"]
        edges = [b["from_us"] or min(1, b["to_us"] / 2) for b in buckets] + [buckets[-1]["to_us"]]
        shares = [100 * b["count"] / d["count"] for b in buckets]
        ax.stairs(shares, edges, label=_transport(transport), linewidth=1.5)

    return _delay_lines(ax, report, line, "% of the transport's matched", "upper right")


def _delay_lines(ax, report, line, ylabel, legend_loc, ylim=None):
    """A plot of one line a transport, drawn by line(transport, its delays), over a log axis of response delays;
    False if no transaction was matched."""
    from matplotlib.ticker import FuncFormatter

    by_transport = report["delay_by_transport"]
    if not by_transport:
        return False
    for transport, d in by_transport.items():
        line(transport, d)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda us, _: _delay(us)))
    ax.set_xlabel("response delay")
    ax.set_ylabel(ylabel)
    if ylim:
        ax.set_ylim(*ylim)
    ax.legend(loc=legend_loc, fontsize=8)


def _bars(ax, rows, total, what, mix=True):
    """Horizontal bars of (label, count), largest on top, each with its count and share; False if none. A mix
    has BAR_ROWS bars at most (the last: the rest); a top list is as long as it is."""
    if not rows:
        return False
    if mix and len(rows) > BAR_ROWS:
        rows = rows[:BAR_ROWS - 1] + [("other", sum(c for _, c in rows[BAR_ROWS - 1:]))]
    labels = [_cut(label) for label, _ in rows][::-1]
    counts = [c for _, c in rows][::-1]
    bars = ax.barh(range(len(rows)), counts)
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.bar_label(bars, [f"{c:,} ({_share(c, total)})" for c in counts], padding=3, fontsize=7)
    ax.set_xlabel(what)
    ax.margins(x=0.18)
    ax.figure.set_figheight(max(HEIGHT_INCHES, 0.8 + 0.22 * len(rows)))


def _cut(label):
    return label if len(label) <= LABEL_CHARACTERS else label[:LABEL_CHARACTERS - 1] + "…"


def _qtypes(ax, report):
    rows = [(r["name"] or "- (none)", r["count"]) for r in report["qtypes"]]
    return _bars(ax, rows, report["records"], "records")


def _top(ax, report, key, column):
    ranked = report[key]
    rows = [(_name(r[column]), r["count"]) for r in ranked["top"]]
    ax.set_title(f"  (of {ranked['distinct']:,} distinct)", loc="right", fontsize=8)
    return _bars(ax, rows, report["records"], "records", mix=False)


def _name(value):
    return value or '"" (none: a public suffix)'


def _qnames(ax, report):
    return _top(ax, report, "qnames", "qname")


def _domains(ax, report):
    return _top(ax, report, "registered_domains", "registered_domain")


def _clients(ax, report):
    return _top(ax, report, "clients", "src")


def _transport(name):
    return TRANSPORT_NAMES.get(name, name or "unknown")


def _transports(ax, report):
    rows = [(_transport(r["transport"]), r["count"]) for r in report["transports"]]
    return _bars(ax, rows, report["records"], "records")


def _buffer_sizes(ax, report):
    sizes = report["edns"]["buffer_sizes"]
    rows = [(f"{size:,} bytes" if size else "no EDNS (no OPT record)", c) for size, c in sizes]
    return _bars(ax, rows, sum(c for _, c in sizes), "queries")


def _do_bit(ax, report):
    do = report["edns"]["do"]
    rows = [(label, do[key]) for key, label in (("do", "EDNS, DO set"), ("no_do", "EDNS, DO clear"),
                                                 ("no_edns", "no EDNS"))]
    total = sum(do.values())
    return _bars(ax, rows, total, "queries") if total else False


def _truncated(ax, report):
    tc = report["tc"]
    if not tc:
        return False
    names = list(tc)
    shares = [100 * tc[t]["truncated"] / tc[t]["responses"] for t in names]
    bars = ax.bar([_transport(t) for t in names], shares)
    ax.bar_label(bars, [f"{tc[t]['truncated']:,} of {tc[t]['responses']:,}" for t in names], padding=3, fontsize=8)
    ax.set_ylabel("% of the responses with TC")
    ax.set_ylim(0, max(1.0, max(shares) * 1.25))


def _e(text):
    return html.escape(str(text), quote=True)


def _rows_table(rows):
    """A table of (header, value) rows; values that are counts are right-aligned."""
    cells = "".join(f"<tr><th>{_e(k)}</th><td{' class=n' if isinstance(v, int) else ''}>"
                    f"{_e(f'{v:,}' if isinstance(v, int) else v)}</td></tr>" for k, v in rows)
    return f"<table>{cells}</table>"


def _meta_table(report, meta):
    """The files' metadata (inspect --meta's keys; a value held by only some files says by how many) and their
    records' time span."""
    files = report["files"]
    rows = [("files", files)]
    if report["time"]:
        t = report["time"]
        rows.append(("time span", f"{t['first']} to {t['last']} ({_seconds(t['seconds'])})"))
    for key, values in meta.items():
        rows.append((key, "; ".join((v or "(empty)") if n == files else f"{v or '(empty)'} ({n:,} of {files:,} files)"
                                    for v, n in values)))
    return _rows_table(rows)


def _overview_table(report):
    records = report["records"]
    rows = [("records", records)]
    if report["rate"]:
        r = report["rate"]
        mean = "-" if r["mean_per_second"] is None else f"{r['mean_per_second']:,.0f}"
        rows.append(("per second", f"{mean} on average; the busiest second {r['peak_per_second']:,} "
                                   f"({r['peak_second']})"))
    tx = report["transactions"]
    rows += [(label, f"{tx[key]:,} ({_share(tx[key], records)})") for key, label in (
        ("matched", "matched"), ("query_only", "query only (unanswered)"), ("response_only", "response only"))]
    d = report["response_delay_us"]
    if d:
        rows.append(("response delay", "   ".join(f"{name} {_delay(d[name])}" for name in (
            "min", "p50", "p90", "p99", "max", "mean"))))
    truncated = sum(v["truncated"] for v in report["tc"].values())
    responses = sum(v["responses"] for v in report["tc"].values())
    rows.append(("truncated (TC) responses", f"{truncated:,} of {responses:,} ({_share(truncated, responses)})"))
    return _rows_table(rows)
