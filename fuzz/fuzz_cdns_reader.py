"""A C-DNS file through the reader (export.cdns.reader, cbor2 underneath; no C twin): every record it gives
must have been read, or the file refused with a CaptureFileError naming the problem; any other exception is a
finding."""

import os
import tempfile

from harness import run

from export.cdns.reader import read_rows
from probe.errors import CaptureFileError

PATH = os.path.join(tempfile.mkdtemp(prefix="fuzz-cdns-"), "input.cdns")


def one_input(data):
    with open(PATH, "wb") as fh:
        fh.write(data)
    try:
        for _ in read_rows(PATH):
            pass
    except CaptureFileError:
        pass


if __name__ == "__main__":
    run(one_input)
