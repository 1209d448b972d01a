"""One input read once and copied into a pipe per reader: how `dnsprobe read --workers N` gives a compressed file or
a pipe to every worker. The parent decompresses it once (N workers decompressing each their copy would spend N times
the decompressor's CPU, the larger share of the work for xz), and each worker reads plain bytes.

The copy never waits for one reader while another could take more: every pipe is written without blocking and has
a queue of its own, up to QUEUE bytes behind; only when a queue is full does reading stop. A reader that closes its
end (it stopped at an error, or the input is another worker's dnstap file) gets no more of the input.

A pipe is read as it arrives (when it pauses, what came is passed on, not held until a chunk is full), and
an interrupt (the KeyboardInterrupt of SIGINT or SIGTERM) stops the reading but not the copy: what was read is still
written to every reader before the pipes are closed, so the workers write every frame the command read.
"""

import collections
import fcntl
import os
import select
import signal

from probe.compressed import read_error

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


def copy(stream, path, fds, pipe=False):
    """Copy what `stream` (the input `path`, decompressed) gives into the pipes `fds`, and close them; returns the
    CaptureFileError that ended the input early (the readers then see it end there), or None. pipe: the input is a
    pipe, read as it arrives (as one reader reads it, probe.capture.pcapfile: a file is read in whole chunks)."""
    queues = {fd: collections.deque() for fd in fds}  # pipe -> chunks (memoryviews) not yet written
    queued = dict.fromkeys(fds, 0)
    for fd in fds:
        os.set_blocking(fd, False)
    problem = None
    ended = False
    read = stream.read1 if pipe else stream.read
    try:
        while queues:
            if not ended and all(n < QUEUE for n in queued.values()):
                try:
                    chunk = read(CHUNK)
                except Exception as exc:  # (the messages of one worker's reader)
                    problem = read_error(path, exc)
                    chunk = b""
                if chunk:
                    for fd, queue in queues.items():
                        queue.append(memoryview(chunk))
                        queued[fd] += len(chunk)
                else:
                    ended = True
            else:  # a queue is full, or the input has ended: wait until a pipe takes more
                select.select([], [fd for fd, q in queues.items() if q], [], 0.1)
            _write_all(queues, queued, ended)
    except KeyboardInterrupt:
        for fd in queues:
            os.set_blocking(fd, True)
        # A reader that stopped has closed its end: no waiting for it. A second interrupt gives the flush up.
        _write_all(queues, queued, True, hold=False)
        raise
    finally:
        for fd in queues:
            os.close(fd)
    return problem


def _write_all(queues, queued, ended, hold=True):
    """Write to every pipe what it takes now, and close those whose reader went away or that have the whole input.
    hold: an interrupt waits until the writing is done and its bookkeeping true (else bytes could be written twice)."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM} if hold else set())
    try:
        for fd in list(queues):
            if not _write(fd, queues[fd], queued) or (ended and not queues[fd]):
                os.close(fd)
                del queues[fd], queued[fd]
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


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
