"""export.on_close: a command run for every finished file, as dnscap's -k runs one (rclone, an S3 client, a queue
producer ship the file).

Every process of a run that finishes a file (the pipeline of `dnsprobe read`, its read workers, the capture
workers, the recovery of a dead worker's files) announces it on a pipe made before that process was forked
(export.base.announce_finished), once the file is complete under its final name. The run's own process reads the
pipe and runs the command, never through a shell, with the file's absolute path as its last argument: at most
export.on_close_jobs at once, the others queued in the order the files were finished, so no writer ever waits for
a command. The capture's supervisor does this in its loop (poll()); `dnsprobe read`, busy with its pipeline, in a
thread (start_thread()).

A command has no stdin and its stdout is discarded; its stderr goes to a temporary file whose end is logged when
it fails. It runs in a session of its own (a terminal's ^C is not its), on any core (not the capture's), with the
run's environment; in a capture with capture.user, as that user (its groups, HOME, USER, LOGNAME), as the workers
are. One that runs longer than export.on_close_timeout gets SIGTERM, then SIGKILL KILL_GRACE_S later. A command
that fails (exit status not 0, a signal, the timeout, or no start) is logged and counted (on_close_failed); the
file stays where it is and the capture goes on. At the end of a run every file announced gets its command: the
run waits for them (a second ^C leaves the running ones to end on their own and runs no more).
"""

import collections
import os
import select
import signal
import threading
import time

from export.base import announce_finished_to, off_capture_cores
from probe.errors import ConfigError
from probe.run.log import log

KILL_GRACE_S = 5.0  # after SIGTERM, a command that ran out of time is killed
POLL_S = 0.1  # how often the read thread looks at the running commands
STDERR_LINES = 5  # lines of a failed command's stderr end in its log line
STDERR_CHARS = 500  # at most


class _Job:
    def __init__(self, path, proc, stderr):
        self.path, self.proc, self.stderr = path, proc, stderr
        self.started = time.monotonic()
        self.terminated = None  # when SIGTERM was sent for export.on_close_timeout
        self.killed = False


class OnCloseCommands:
    """The export.on_close commands of one run; does nothing when export.on_close is not set. Make it before the
    processes that write files are forked (they inherit the pipe it announces finished files on)."""

    def __init__(self, export_cfg, user=None):
        self.argv = list(export_cfg.on_close or ())
        self.jobs = export_cfg.on_close_jobs
        self.timeout = export_cfg.on_close_timeout
        self.commands = self.failed = 0  # ended, of which failed
        self.queue = collections.deque()  # paths announced, waiting for a free job
        self.running = []
        self.pipe = None  # (read end, write end)
        self.buffer = b""
        self.thread = None
        self.closing = self.abandoned = False
        self.told = False  # the end's waiting was logged
        if not self.argv:
            return
        import shutil  # (this, subprocess and tempfile: only with commands; a run without them starts sooner)

        self.program = shutil.which(self.argv[0])
        if self.program is None:
            raise ConfigError(f"config key 'export.on_close': {self.argv[0]!r} is not a program found in PATH or an"
                              " executable file")
        self.spawn = _as_user(user)
        self.pipe = os.pipe()
        os.set_blocking(self.pipe[0], False)
        announce_finished_to(self.pipe[1])

    def waitables(self):
        """What the supervisor waits on besides its workers: a file announced."""
        return [self.pipe[0]] if self.pipe else []

    def count(self, stats):
        stats.on_close_commands = self.commands
        stats.on_close_failed = self.failed

    def poll(self):
        """Without waiting: take the files announced, account for the commands that ended (or ran out of time),
        start queued ones while fewer than export.on_close_jobs run."""
        if self.pipe is None:
            return
        self._take_announced()
        now = time.monotonic()
        self.running = [job for job in self.running if not self._ended(job, now)]
        while self.queue and len(self.running) < self.jobs and not self.abandoned:
            self._start(self.queue.popleft())
        if self.closing and not self.told and (self.queue or self.running):
            self.told = True
            log(f"waiting for {len(self.queue) + len(self.running):,} export.on_close command(s)")

    def start_thread(self):
        """Run the commands from a thread of this process (a run whose main thread is busy with a pipeline). Start
        it after the last fork of the run: a thread forked along would be lost."""
        if self.pipe is not None:
            self.thread = threading.Thread(target=self._loop, name="dnsprobe-on-close", daemon=True)
            self.thread.start()

    def _loop(self):
        off_capture_cores()  # the commands it starts inherit this thread's cores
        while not self.abandoned:
            closing = self.closing  # (read first: every file announced before wait() is then in the pipe)
            self.poll()
            if closing and not self.queue and not self.running:
                return
            select.select([self.pipe[0]], [], [], POLL_S)

    def wait(self):
        """The end of the run, once nothing writes files any more: every file announced gets its command; returns
        when they have all ended. A KeyboardInterrupt stops the waiting: then returns True."""
        if self.pipe is None:
            return self.abandoned
        self.closing = True
        try:
            if self.thread is not None:
                while self.thread.is_alive():
                    self.thread.join(0.5)
            else:
                self.poll()
                while self.queue or self.running:
                    time.sleep(POLL_S)
                    self.poll()
        except KeyboardInterrupt:
            self.abandoned = True
            if self.thread is not None:
                self.thread.join()
            log(f"interrupted: {len(self.running):,} export.on_close command(s) left to end on their own,"
                f" {len(self.queue):,} not run")
        announce_finished_to(None)
        for fd in self.pipe:
            os.close(fd)
        self.pipe = None
        return self.abandoned

    def _take_announced(self):
        while True:
            try:
                data = os.read(self.pipe[0], 65536)
            except BlockingIOError:
                break
            if not data:
                break
            self.buffer += data
        *paths, self.buffer = self.buffer.split(b"\0")
        self.queue.extend(os.fsdecode(p) for p in paths)

    def _start(self, path):
        import subprocess
        import tempfile

        stderr = tempfile.TemporaryFile()
        try:
            proc = subprocess.Popen([*self.argv, path], executable=self.program, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True, **self.spawn)
        except (OSError, subprocess.SubprocessError) as exc:
            stderr.close()
            self.commands += 1
            self.failed += 1
            log(f"export.on_close: cannot run {self.argv[0]} for {path}: {getattr(exc, 'strerror', None) or exc}")
            return
        self.running.append(_Job(path, proc, stderr))

    def _ended(self, job, now):
        """Whether the command has ended (accounted for); one that ran out of time is signalled."""
        code = job.proc.poll()
        if code is None:
            if self.timeout and now - job.started >= self.timeout:
                if job.terminated is None:
                    job.terminated = now
                    _signal_group(job.proc, signal.SIGTERM)
                elif now - job.terminated >= KILL_GRACE_S and not job.killed:
                    job.killed = True
                    _signal_group(job.proc, signal.SIGKILL)
            return False
        self.commands += 1
        if code or job.terminated is not None:
            self.failed += 1
            how = f"exit status {code}" if code >= 0 else f"killed by {signal.Signals(-code).name}"
            if job.terminated is not None:
                how = f"still running after export.on_close_timeout ({self.timeout:g} s), stopped ({how})"
            tail = _tail(job.stderr)
            log(f"export.on_close: {self.argv[0]} {job.path} failed: {how}; the file is kept"
                + (f"; stderr: {tail}" if tail else ""))
        job.stderr.close()
        return True


def _signal_group(proc, sig):
    try:
        os.killpg(proc.pid, sig)  # its session's group: what it started goes too
    except ProcessLookupError:
        pass


def _tail(fh):
    """The last lines of a command's stderr, on one line."""
    fh.seek(0, os.SEEK_END)
    fh.seek(max(0, fh.tell() - 4 * STDERR_CHARS))
    lines = [line.strip() for line in fh.read().decode("utf-8", "replace").splitlines() if line.strip()]
    text = " | ".join(lines[-STDERR_LINES:])
    return text if len(text) <= STDERR_CHARS else "..." + text[-STDERR_CHARS:]


def _as_user(name):
    """How a capture with capture.user runs the commands: as that user, as its workers run (nothing to change when
    it is not set, or when this process cannot switch users)."""
    if not name or os.geteuid() != 0:
        return {}
    import pwd

    pw = pwd.getpwnam(name)
    env = {**os.environ, "HOME": pw.pw_dir, "USER": pw.pw_name, "LOGNAME": pw.pw_name}
    return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": os.getgrouplist(pw.pw_name, pw.pw_gid),
            "env": env}
