"""What a live worker does so that a transaction it completed survives it: the timing of its flushes
(export.flush_seconds), and what its snapshots tell the supervisor about what is not in a file yet.

A worker flushes its pipeline (completed transactions → its exporter → the file being written, readable) at the
latest export.flush_seconds after the first transaction that is not in a file yet, less a margin for the
worker's own loop. If the worker dies, the supervisor knows from its last snapshot how much it had not written
(`unwritten`: completed transactions; `pending_queries`: queries waiting for their response), and counts that as
lost_in_dead_worker; what the file holds is made into a finished file (export.recovery).
"""

FLUSH_MARGIN_S = 0.5  # at most; half of export.flush_seconds when that is shorter
KEEP_FILE_NAMES = 1000  # names of written files a capture's statistics list (the last ones); `files` counts all


class FlushClock:
    """due(): time to flush a pipeline that holds completed transactions not yet in a file."""

    def __init__(self, flush_seconds):
        self.delay = flush_seconds - min(FLUSH_MARGIN_S, flush_seconds / 2) if flush_seconds else None
        self.since = None  # when the oldest transaction not yet in a file was first seen

    def due(self, pipeline, now):
        if self.delay is None:
            return False
        if self.since is None:
            if pipeline.unwritten()[0]:
                self.since = now
            return False
        return now - self.since >= self.delay

    def flushed(self):
        self.since = None

    def timeout(self, now, longest):
        """How long a worker may wait for packets before it must flush (seconds, at most `longest`)."""
        if self.since is None:
            return longest
        return max(0.0, min(longest, self.since + self.delay - now))


class FileReport:
    """The part of a worker's snapshot about its files, for one or more pipelines (DPDK: one per queue)."""

    def __init__(self, pipelines):
        self.pipelines = pipelines
        self.sent = [0] * len(pipelines)  # file names already reported, per pipeline

    def snapshot(self):
        unwritten = pending = 0
        live, new = [], []
        for i, pipeline in enumerate(self.pipelines):
            done, waiting = pipeline.unwritten()
            unwritten += done
            pending += waiting
            summary = pipeline.summary()
            live += summary["live_files"]
            new += summary["files_written"][self.sent[i] :]
            self.sent[i] = len(summary["files_written"])
        return {"unwritten": unwritten, "pending_queries": pending, "live_files": live, "new_files": new}
