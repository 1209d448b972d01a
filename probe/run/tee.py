"""One input read once and copied into a pipe per reader: how `dnsprobe read --workers N` gives a compressed file or
a pipe to every worker. The parent decompresses it once (N workers decompressing each their copy would spend N times
the decompressor's CPU, the larger share of the work for xz), and each worker reads plain bytes.

The copy never waits for one reader while another could take more: every pipe is written without blocking and has
a queue of its own, up to QUEUE bytes behind; only when a queue is full does reading stop. A reader that closes its
end (it stopped at an error, or the input is another worker's dnstap file) gets no more of the input.
"""

import collections
import fcntl
import lzma
import os
import select

from probe.errors import CaptureFileError

CHUNK = 1 << 20  # bytes read from the input (decompressed) at a time
QUEUE = 8 << 20  # bytes held for a reader that is behind, before the input is read further
PIPE_SIZE = 1 << 20  # asked of the kernel for each pipe, so that a reader rarely waits for the next chunk


def pipe():
    """(read end, write end) of a new pipe, as large as the kernel lets it be."""
    r, w = os.pipe()
    try:
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    except OSError:
        pass  # over fs.pipe-max-size: the default size works too, with more wake-ups
    return r, w


def copy(stream, path, fds):
    """Copy what `stream` (the input `path`, decompressed) gives into the pipes `fds`, and close them; returns the
    CaptureFileError that ended the input early (the readers then see it end there), or None."""
    queues = {fd: collections.deque() for fd in fds}  # pipe -> chunks (memoryviews) not yet written
    queued = dict.fromkeys(fds, 0)
    for fd in fds:
        os.set_blocking(fd, False)
    problem = None
    ended = False
    try:
        while queues:
            if not ended and all(n < QUEUE for n in queued.values()):
                try:
                    chunk = stream.read(CHUNK)
                except (OSError, EOFError, lzma.LZMAError) as exc:  # (the messages of one worker's reader)
                    problem = CaptureFileError(path, f"decompression failed: {exc}")
                    chunk = b""
                except Exception as exc:  # zstandard raises its own ZstdError type
                    problem = CaptureFileError(path, f"read failed: {exc}")
                    chunk = b""
                if chunk:
                    for fd, queue in queues.items():
                        queue.append(memoryview(chunk))
                        queued[fd] += len(chunk)
                else:
                    ended = True
            else:  # a queue is full, or the input has ended: wait until a pipe takes more
                select.select([], [fd for fd, q in queues.items() if q], [], 0.1)
            for fd in list(queues):
                if not _write(fd, queues[fd], queued) or (ended and not queues[fd]):
                    os.close(fd)  # its reader went away, or it has the whole input
                    del queues[fd], queued[fd]
    finally:
        for fd in queues:
            os.close(fd)
    return problem


def _write(fd, queue, queued):
    """Write what the pipe takes now; False when its reader has closed it."""
    try:
        while queue:
            n = os.write(fd, queue[0])
            queued[fd] -= n
            if n < len(queue[0]):
                queue[0] = queue[0][n:]
                break
            queue.popleft()
    except BlockingIOError:
        pass
    except BrokenPipeError:
        return False
    return True
