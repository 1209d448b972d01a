#!/usr/bin/env python3
"""Refresh the public resolver prefix lists (export/enrich/resolvers/) from their sources; needs network access.

    python3 contrib/refresh-resolver-lists.py export/enrich/resolvers

Google: the TXT records of locations.publicdns.goog. (dig), lines 'PREFIX IATA'. Cloudflare: the plain lists at
https://www.cloudflare.com/ips-v4 and /ips-v6. Quad9's and OpenDNS's lists are kept by hand (their headers name
the pages). Each rewritten file keeps its header, with the date of this refresh. Review the diff before committing.
"""

import datetime
import ipaddress
import subprocess
import sys
import urllib.request
from pathlib import Path

CLOUDFLARE = ("https://www.cloudflare.com/ips-v4", "https://www.cloudflare.com/ips-v6")


def google_prefixes(txt_output):
    """Prefixes of `dig +short TXT locations.publicdns.goog.` output: one quoted 'PREFIX IATA' per line."""
    out = []
    for line in txt_output.splitlines():
        for part in line.split('" "'):
            words = part.strip().strip('"').split()
            if len(words) == 2:
                out.append(str(ipaddress.ip_network(words[0], strict=False)))
    return out


def plain_prefixes(text):
    return [str(ipaddress.ip_network(w, strict=False)) for w in text.split() if w]


def rewrite(path, prefixes):
    if not prefixes:
        raise SystemExit(f"{path}: the source gave no prefixes; file left as it was")
    today = datetime.date.today().isoformat()
    header = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        if line.startswith("# Compiled"):
            line = f"# Compiled {today} by contrib/refresh-resolver-lists.py from the source above."
        header.append(line)
    path.write_text("\n".join(header + prefixes) + "\n")
    print(f"{path}: {len(prefixes)} prefixes")


def main(directory):
    directory = Path(directory)
    dig = subprocess.run(["dig", "+short", "TXT", "locations.publicdns.goog."], capture_output=True, text=True,
                         check=True)
    rewrite(directory / "google.txt", google_prefixes(dig.stdout))
    cloudflare = []
    for url in CLOUDFLARE:
        with urllib.request.urlopen(url, timeout=30) as resp:
            cloudflare += plain_prefixes(resp.read().decode())
    rewrite(directory / "cloudflare.txt", cloudflare)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / "export" / "enrich"
                  / "resolvers"))
