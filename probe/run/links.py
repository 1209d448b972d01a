"""The interfaces of an AF_PACKET worker: capture while an interface is there and up, wait for it otherwise.

A capture socket reports an error (poll's POLLERR; SO_ERROR says ENETDOWN) when its interface goes down or is
removed. That is not a reason for the worker to die: it closes its files (readable), counts the event
(`capture_interruptions`), logs it and waits for the interface. A link that went down and comes back up
(the same interface index) resumes on the same socket, which the kernel attaches again; an interface that
was removed, or was down or (capture.wait_for_interface) did not exist at start, gets a new socket once an
interface of that name exists and is up. The worker learns of link changes from the kernel (an rtnetlink
socket in its poll set, LinkEvents), and also looks again after a delay that grows while it waits. While it
waits, worker 0 logs a line every minute (capture.wait_log_interval), so that a capture that records nothing says why.
"""

import errno
import os
import socket
import time

from probe.capture.afpacket import InterfaceUnavailable
from probe.errors import ConfigError
from probe.run.log import log
from probe.stats import SOCKET_COUNTERS

RTMGRP_LINK = 1
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 30.0


def interface_state(ifname):
    """(interface index or None when there is no such interface, whether it is up)."""
    try:
        index = socket.if_nametoindex(ifname)
    except OSError:
        return None, False
    try:
        with open(f"/sys/class/net/{ifname}/flags") as fh:
            up = bool(int(fh.read(), 16) & 1)  # IFF_UP
    except (OSError, ValueError):
        up = False
    return index, up


class LinkEvents:
    """A netlink socket that becomes readable when any link of this network namespace changes."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_NONBLOCK, socket.NETLINK_ROUTE)
        self.sock.bind((0, RTMGRP_LINK))

    def fileno(self):
        return self.sock.fileno()

    def drain(self):
        """Read the notifications waiting (their content does not matter: the interfaces are looked at again)."""
        try:
            while self.sock.recv(65536):
                pass
        except OSError:  # EAGAIN: none left; ENOBUFS: some were lost, which changes nothing here
            pass

    def close(self):
        self.sock.close()


class CaptureInterface:
    """One interface of a worker: its source (an AfPacketSource) and, with the IP lists in the kernel, its
    RejectedCounter while it captures; the wait for the interface while it cannot.

    state: "capturing"; "down" (the link went down: the socket is kept and resumes by itself); "waiting" (no
    socket: the interface is absent, or was down when a socket was wanted)."""

    def __init__(self, ifname, opener, worker_id, stats, wait_line_s=60.0):
        """opener(ifname) → (source, counter or None), raising InterfaceUnavailable or another ConfigError;
        wait_line_s: how often worker 0 says that it still waits (capture.wait_log_interval)."""
        self.ifname = ifname
        self.opener = opener
        self.worker_id = worker_id
        self.stats = stats
        self.wait_line_s = wait_line_s
        self.source = self.counter = None
        self.index = None
        self.state = "waiting"
        self.since = time.monotonic()
        self.delay = RETRY_FIRST_S
        self.next_try = 0.0
        self.next_line = float("inf")  # when worker 0 says again that it still waits
        self.retired = dict.fromkeys(SOCKET_COUNTERS + ("frames",), 0)  # counters of the sockets closed
        self.rejected_retired = 0
        self.last_problem = None

    # -- opening --

    def open(self, wait):
        """Open at start: True when capturing; with wait, an interface that is absent or down is waited for
        (logged) instead of an error. (A capture's workers always wait: probe.run.capture decided before it started
        them whether an interface absent at start is an error.)"""
        try:
            self._open()
            return True
        except InterfaceUnavailable as exc:
            if not wait:
                raise
            self._wait(str(exc))
            return False

    def _open(self):
        index, _ = interface_state(self.ifname)
        self.source, self.counter = self.opener(self.ifname)
        self.index = index
        self.state = "capturing"

    def _wait(self, why):
        self._stopped("waiting")
        self.last_problem = why
        log(f"worker {self.worker_id}: {why}; waiting for it")

    # -- faults --

    def check_fault(self):
        """The source's socket reported an error: True when it is a fault (logged and counted; the worker then
        closes its files), False when the error was gone already. The socket is kept: it resumes by itself when
        the link comes back up, and a removed interface's ring is still read for a while (the kernel hands over
        its last block after capture.block_timeout_ms)."""
        err = self.source.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if not err:
            return False
        self.stats.capture_interruptions += 1
        index, _ = interface_state(self.ifname)
        gone = "" if err == errno.ENETDOWN and index == self.index else (
            " (the interface was removed)" if index is None else " (the interface was replaced)"
            if index != self.index else "")
        log(f"worker {self.worker_id}: interface {self.ifname!r}: capture socket error: {os.strerror(err)}{gone}; "
            "files closed, capture resumes when it is back and up")
        self._stopped("down")
        return True

    def _stopped(self, state):
        """Not capturing from now on (state "waiting" or "down"): the first try again after RETRY_FIRST_S, the
        first line saying it still waits after wait_line_s."""
        self.state = state
        self.since = time.monotonic()
        self.delay = RETRY_FIRST_S
        self.next_try = self.since + self.delay
        self.next_line = self.since + self.wait_line_s

    def retry(self, now, woken, drain_s):
        """Look at an interface that is down or waited for again (on a link notification, or when its delay has
        passed); True when the set of sockets changed. drain_s: how long the socket of a removed interface is
        still read before it is closed."""
        if self.state == "capturing":
            return False
        if now >= self.next_line:
            self._still_waiting(now)
        if not woken and now < self.next_try:
            return False
        index, up = interface_state(self.ifname)
        changed = False
        if self.state == "down":
            if index == self.index:
                if up:
                    self.state = "capturing"
                    log(f"worker {self.worker_id}: interface {self.ifname!r} is up again after "
                        f"{now - self.since:.1f} s; capturing")
                else:
                    self._later(now)
                return False
            if now - self.since < drain_s:  # removed or replaced: read what its ring still holds first
                self.next_try = self.since + drain_s
                return False
            self.close()
            self.state = "waiting"
            changed = True
        if index is None or not up:
            self._later(now)
            return changed
        try:
            self._open()
        except ConfigError as exc:  # gone again, or not an interface we can capture on (logged once)
            if str(exc) != self.last_problem:
                self.last_problem = str(exc)
                log(f"worker {self.worker_id}: {exc}; trying again")
            self._later(now)
            return changed
        log(f"worker {self.worker_id}: interface {self.ifname!r} is there and up after {now - self.since:.1f} s; "
            "capturing")
        return True

    def _still_waiting(self, now):
        self.next_line = now + self.wait_line_s
        if self.worker_id != 0:  # one line per interface, not one per worker
            return
        index, up = interface_state(self.ifname)
        why = "it does not exist" if index is None else "it is down" if not up else "its socket is being replaced"
        log(f"worker 0: still waiting for interface {self.ifname!r} after {_elapsed(now - self.since)}: {why}")

    def _later(self, now):
        self.next_try = now + self.delay
        self.delay = min(self.delay * 2, RETRY_MAX_S)

    # -- counters, closing --

    def counters(self):
        """The kernel's counters for this interface over all its sockets, frames read, and the state."""
        out = dict(self.retired)
        if self.source is not None:
            for name, value in self.source.counters().items():
                out[name] += value
        out["state"] = self.state
        return out

    def rejected(self):
        return self.rejected_retired + (self.counter.read() if self.counter is not None else 0)

    def close(self):
        if self.source is not None:
            for name, value in self.source.counters().items():
                self.retired[name] += value
            self.source.close()
            self.source = None
        if self.counter is not None:
            self.rejected_retired += self.counter.read()
            self.counter.close()
            self.counter = None


def _elapsed(seconds):
    """'3 min', or '20 s' under a minute (capture.wait_log_interval may be short)."""
    return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"
