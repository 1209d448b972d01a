"""A pcap or pcapng byte stream through the capture reader with the C record splitter
(probe.capture._pcaprecords) and with its Python twin (pcapfile.split_records): the same batches, and the
same error (CaptureFileError, same text) after them, or none."""

import os
import tempfile

from harness import check, run

from probe.capture import pcapfile
from probe.errors import CaptureFileError

C_SPLIT = pcapfile._pcaprecords
assert C_SPLIT is not None, "probe.capture._pcaprecords is not built"
PATH = os.path.join(tempfile.mkdtemp(prefix="fuzz-pcap-"), "input.pcap")


def read_all(splitter):
    pcapfile._pcaprecords = splitter
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
    got, want = read_all(C_SPLIT), read_all(None)
    check(got == want, "capture", data, got, want)


if __name__ == "__main__":
    run(one_input)
