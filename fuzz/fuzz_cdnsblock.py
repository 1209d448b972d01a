"""Transactions through the C-DNS block builder in C, as message records (Block.add on a TxBatch:
export.cdns._cdnsblock.add_records), and its Python reference, as tuples (Block.add_python): equal tables in the
same order, items, counters, and equal block bytes (the C encoding against encode(python=True), which uses no
C)."""

import tempfile

from harness import check, run
from stages import transactions

from export.cdns import block as cdns
from export.cdns.writer import CdnsExporter
from probe import _records
from probe.config import load_config
from probe.stats import Stats

TABLES = ("ip", "names", "classtype", "sigs", "qrr", "qlist", "rr", "rrlist", "mm_data")
WRITER = CdnsExporter(load_config(overrides={"export.format": "cdns"}), tempfile.mkdtemp(prefix="fuzz-cdns-"), 0,
                      Stats(), tx_records=True)


def one_input(data):
    txs = transactions(data)
    if not txs:
        return
    fast, slow = cdns.Block(WRITER), cdns.Block(WRITER, python=True)
    step = len(data) % 7 + 1
    batch = _records.TxBatch()
    for t in txs:
        batch.append(t)
    for i in range(0, len(txs), step):
        fast.add(batch, i, min(i + step, len(txs)))
        slow.add_python(txs[i : i + step])
    for name in TABLES:
        a, b = list(getattr(fast, name).items()), list(getattr(slow, name).items())
        check(a == b, f"table {name}", data, a, b)
    check(list(fast.items) == list(slow.items), "items", data, list(fast.items), slow.items)
    for name in ("malformed", "earliest", "processed", "unmatched_q", "unmatched_r"):
        check(getattr(fast, name) == getattr(slow, name), name, data, getattr(fast, name), getattr(slow, name))
    a, b = fast.encode(), slow.encode(python=True)
    check(a == b, "block bytes", data, a, b)


if __name__ == "__main__":
    run(one_input)
