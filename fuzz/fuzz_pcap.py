"""A pcap or pcapng byte stream through the capture reader with the C record splitter
(probe.capture._pcaprecords: split_packed into packed frames, as the reader uses it, and split into lists) and
with its Python twin (pcapfile.split_records): the same batches, and the same error (CaptureFileError, same
text) after them, or none."""

import os
import tempfile

from harness import check, run

from probe.capture import pcapfile
from probe.errors import CaptureFileError

C_SPLIT, RECORDS = pcapfile._pcaprecords, pcapfile._records
assert C_SPLIT is not None and RECORDS is not None, "probe.capture._pcaprecords or probe._records is not built"
PATH = os.path.join(tempfile.mkdtemp(prefix="fuzz-pcap-"), "input.pcap")


def read_all(splitter, packed):
    pcapfile._pcaprecords, pcapfile._records = splitter, RECORDS if packed else None
    batches, error = [], None
    try:
        for batch in pcapfile.read_capture(PATH, 7):
            batches.append((batch.linktype, batch.ts_ns, batch.wirelen, batch.data))
    except CaptureFileError as exc:
        error = str(exc)
    return batches, error


def one_input(data):
    with open(PATH, "wb") as fh:
        fh.write(data)
    want = read_all(None, False)
    for packed in (True, False):
        got = read_all(C_SPLIT, packed)
        check(got == want, f"capture ({'packed' if packed else 'lists'})", data, got, want)


if __name__ == "__main__":
    run(one_input)
