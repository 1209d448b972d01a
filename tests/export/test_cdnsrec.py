"""The C-DNS block builder on message records (export.cdns._cdnsblock.add_records, the columnar pipeline's
C-DNS) against its Python reference (Block.add_python on the same transactions as tuples): every table with the
same entries in the same order, the same items, earliest-time, statistics and encoded bytes, on the captures
of support.cdns (DNS Probe's, compactor's matching/unmatched/malformed/EDNS cases, the sample) and the
benchmark mix, added in chunks of several sizes; only the malformed transactions go to Python.
"""

import pytest
from support.captures import bench_mix
from support.cdns import CAPTURES, CHUNKS, assert_same, exporter
from support.data import COMPACTOR_DATA, DNSPROBE_DATA
from support.stages import transactions

from export.cdns import block as cdns
from probe import _records
from probe.model import M


def test_captures_found():
    assert DNSPROBE_DATA.exists() and COMPACTOR_DATA.exists()
    assert all(p.exists() for p in CAPTURES)


@pytest.mark.parametrize("path", CAPTURES + ["bench-mix"], ids=lambda p: getattr(p, "name", p))
def test_record_block_equals_python_block(path, tmp_path):
    txs = transactions(bench_mix() if path == "bench-mix" else path)
    assert txs
    batch = _records.TxBatch()
    for t in txs:
        batch.append(t)
    writer = exporter(tmp_path)
    fast, slow = cdns.Block(writer), cdns.Block(writer, python=True)
    i = k = 0
    while i < len(txs):
        stop = min(len(txs), i + CHUNKS[k % len(CHUNKS)])
        fast.add(batch, i, stop)
        slow.add_python(txs[i:stop])
        i, k = stop, k + 1
    assert_same(fast, slow)
    # Only the malformed transactions went to Python.
    block = cdns.Block(writer)
    handed = []
    i = 0
    while i < len(txs):
        i, block.earliest, *_ = cdns._cdnsblock.add_records(
            batch, i, len(txs), block.ip, block.names, block.classtype, block.sigs, block.items, block.earliest, None
        )
        if i < len(txs):
            handed.append(i)
            i += 1
    assert handed == [i for i, (q, r, _) in enumerate(txs) if (q if q is not None else r)[M.MALFORMED]]


def test_add_records_takes_only_a_txbatch_and_items():
    items, sigs = cdns._cdnsblock.Items(), cdns._cdnsblock.Keys(arity=17)
    ip, names = cdns._cdnsblock.Keys(), cdns._cdnsblock.Keys()
    with pytest.raises(TypeError, match="TxBatch"):
        cdns._cdnsblock.add_records([], 0, 0, ip, names, {}, sigs, items, None, None)
    with pytest.raises(TypeError, match="Items"):
        cdns._cdnsblock.add_records(_records.TxBatch(), 0, 0, ip, names, {}, sigs, [], None, None)
    with pytest.raises(TypeError, match="Keys"):  # the address, name and signature tables are held in C
        cdns._cdnsblock.add_records(_records.TxBatch(), 0, 0, {}, {}, {}, {}, items, None, None)
    with pytest.raises(TypeError, match="arity"):
        cdns._cdnsblock.add_records(_records.TxBatch(), 0, 0, ip, names, {}, ip, items, None, None)


def test_metrics_of_records_equal_those_of_tuples(tmp_path):
    """With Prometheus on, the C-DNS exporter counts a TxBatch from its Parquet record columns (DnsMetrics.add_records,
    no tuples made): the same counts by RCODE, QTYPE and transport and the same delay histogram as the tuples give."""
    from export.metrics import DnsMetrics

    counted = 0
    for path in CAPTURES + [bench_mix()]:
        txs = transactions(path)
        batch = _records.TxBatch()
        for t in txs:
            batch.append(t)
        got, want = DnsMetrics(), DnsMetrics()
        got.add_records(batch)
        want.add_transactions(txs)
        assert got.transactions == want.transactions, path.name
        assert (got.delay_le, got.delay_count, got.delay_sum_us) == (want.delay_le, want.delay_count,
                                                                    want.delay_sum_us), path.name
        counted += want.delay_count
    assert counted > 5000
    writer = exporter(tmp_path)  # the exporter counts what it is given as it writes it
    writer.metrics = DnsMetrics()
    writer.write(batch)
    writer.close()
    assert writer.metrics.as_dict() == got.as_dict()
