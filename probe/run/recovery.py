"""The supervisor's side of recovery: files left unfinished by a worker that died (or by an earlier run that
ended without closing them) are finished by export.recovery, in a process of their own, so that the supervisor
goes on (restarting the worker at once) while a large journal is converted."""

from export.recovery import recover
from probe.run.log import log


def _recover_main(directories, export_cfg, recursive, conn):
    done, errors = recover(directories, export_cfg, recursive)
    conn.send(([(str(path), rows) for path, rows in done], errors))
    conn.close()


class Recoveries:
    """Recovery processes started by the supervisor, and what they finished."""

    def __init__(self, ctx, export_cfg):
        self.ctx = ctx
        self.cfg = export_cfg
        self.running = []  # (process, connection, why)
        self.files = []  # (path, rows) of the files finished
        self.errors = []

    def start(self, directories, why, recursive=False):
        """Finish the orphaned live files of the directories (recursive: and below them) in a new process."""
        parent, child = self.ctx.Pipe(duplex=False)
        args = (sorted(set(map(str, directories))), self.cfg, recursive, child)
        proc = self.ctx.Process(target=_recover_main, args=args,
                                name="dnsprobe-recovery", daemon=True)
        proc.start()
        child.close()
        self.running.append((proc, parent, why))

    def waitables(self):
        return [conn for _, conn, _ in self.running]

    def poll(self, block=False):
        """Collect the recoveries that have finished (all of them with block); returns the files they finished."""
        finished = []
        for entry in list(self.running):
            proc, conn, why = entry
            if not block and not conn.poll():
                if proc.exitcode is None:
                    continue
            try:
                files, errors = conn.recv()
            except (EOFError, OSError):
                files, errors = [], [f"the recovery of the files {why} ended without a result ({proc.exitcode})"]
            proc.join()
            conn.close()
            self.running.remove(entry)
            for path, rows in files:
                log(f"recovered {path} ({rows:,} records) {why}")
            for error in errors:
                log(error)
            finished += files
            self.files += files
            self.errors += errors
        return finished

    def wait(self):
        return self.poll(block=True)
