"""A pcap or pcapng byte stream through the capture reader with the C record splitter
(probe.capture._pcaprecords: split_packed into packed frames, as the reader uses it) and with its Python twin
(pcapfile.split_records, also what the reader splits into lists with when probe._records is not built): the same
batches, and the same error (CaptureFileError, same text) after them, or none. Read with a worker's share
(split_packed keeping worker k of 2's frames), each batch holds what _decoderec.select_share keeps of the whole
batch, and the same error follows."""

import os
import tempfile

from harness import check, run

from probe.capture import pcapfile
from probe.decode import _decoderec
from probe.errors import CaptureFileError

C_SPLIT, RECORDS = pcapfile._pcaprecords, pcapfile._records
assert C_SPLIT is not None and RECORDS is not None, "probe.capture._pcaprecords or probe._records is not built"
PATH = os.path.join(tempfile.mkdtemp(prefix="fuzz-pcap-"), "input.pcap")


def read_all(splitter, packed, share=None):
    pcapfile._pcaprecords, pcapfile._records = splitter, RECORDS if packed else None
    batches, error = [], None
    try:
        for batch in pcapfile.read_capture(PATH, 7, share=share):
            if share is None:
                batches.append((batch.linktype, batch.ts_ns, batch.wirelen, batch.data))
            else:
                batches.append((batch.linktype, batch.packed.lists(), batch.frames_read(), batch.last_ts()))
    except CaptureFileError as exc:
        error = str(exc)
    return batches, error


def shares_of(batches, k, n):
    """What worker k of n keeps of each whole batch, as read_all gives a shared read."""
    out = []
    for linktype, ts, wirelen, data in batches:
        frames = RECORDS.Frames()
        for t, w, d in zip(ts, wirelen, data):
            frames.add(d, t, w)
        out.append((linktype, _decoderec.select_share(frames, linktype, k, n).lists(), len(ts), ts[-1]))
    return out


def one_input(data):
    with open(PATH, "wb") as fh:
        fh.write(data)
    want = read_all(None, False)
    got = read_all(C_SPLIT, True)
    check(got == want, "capture (packed)", data, got, want)
    for k in (0, 1):
        got = read_all(C_SPLIT, True, (k, 2))
        check(got == (shares_of(want[0], k, 2), want[1]), f"capture, share {k} of 2", data, got, want)


if __name__ == "__main__":
    run(one_input)
