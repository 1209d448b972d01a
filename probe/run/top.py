"""The supervisor's side of `dnsprobe top` (capture.top): the last seconds of every worker's counts (TopWindow,
added from the "top" part of each snapshot, export.live_top.TopCounts.take), merged into one snapshot on request,
served as JSON on a local Unix socket (capture.top_socket; mode 0660, owned by the capture's user and group).

With capture.top on-demand (the default) the workers count only while a client asks: the supervisor tells them to
start ("top-on", TopWindow.command) at a client's first request, and to stop ("top-off") once none has asked for
capture.top_idle_seconds of the monotonic clock; the request that started the counting waits for its first complete
second (at most FIRST_WAIT_S). With true they always count; with false never, and a request is refused.

The protocol: a client connects, sends the number of seconds it wants (a decimal line, at most WINDOW_S), and reads
one JSON document until the server closes the connection (probe.cli.top); a refusal is {"error": why}."""

import json
import os
import socket
import threading
import time
from pathlib import Path

from probe.run.log import log

WINDOW_S = 60  # seconds of capture time the supervisor keeps (each: up to 3 x TOP_K entries)
SOCKET_NAME = "_dnsprobe.top.sock"  # in the output directory, unless capture.top_socket says where
PERCENTILES = (50, 90, 95, 99, 99.9)
LISTED = 100  # entries of each top list in a snapshot
FIRST_WAIT_S = 3.0  # the request that started the counting waits at most this long for a complete second
OFF = "capture.top is false in this capture's configuration: it counts nothing for `dnsprobe top`"


def socket_path(cfg):
    """Where the capture with configuration cfg serves `dnsprobe top`."""
    return Path(cfg.capture.top_socket or Path(cfg.export.directory) / SOCKET_NAME)


class TopWindow:
    """The seconds of capture time of all workers, each second's figures summed and its summaries merged."""

    def __init__(self, mode="true", idle_s=60.0):
        """mode: capture.top (on-demand, true, false); idle_s: capture.top_idle_seconds."""
        self.lock = threading.Lock()
        self.filled = threading.Condition(self.lock)  # a second handed over (for the first request's wait)
        self.seconds = {}  # second → its figures, as export.live_top.Second.as_dict gives them
        self.mode, self.idle_s = mode, idle_s
        self.counting = mode == "true"  # the workers count (were told so)
        self.asked = None  # monotonic time of a client's last request answered
        self.waiting = 0  # requests being answered (no idle stop meanwhile)
        self.started = None  # monotonic time of the request that started the counting (on-demand)
        self.since = None  # the first second of capture time counted since the counting started
        self.reporting = set()  # the workers that handed their counts over since it started

    def ask(self, now):
        """A client's request at monotonic time now: on-demand, the counting is to start if it does not run. Then
        wait_first(), which ends it."""
        with self.lock:
            self.asked = now
            self.waiting += 1
            if self.mode == "on-demand" and not self.counting and self.started is None:
                self.started = now

    def command(self, now):
        """What the supervisor tells the workers now: "top-on" once a client asked and they do not count, "top-off"
        once none asked for idle_s (the figures counted are then dropped), else None."""
        with self.lock:
            if self.mode != "on-demand" or self.started is None:
                return None
            if not self.counting:
                self.counting = True
                return "top-on"
            if self.waiting or now - self.asked < self.idle_s:
                return None
            self.counting, self.started, self.since = False, None, None
            self.seconds, self.reporting = {}, set()
            return "top-off"

    def wait_first(self):
        """The request that started the counting: wait (at most FIRST_WAIT_S from its start) until a complete second
        is handed over: one after the first second counted, which started within it. The idle time counts from the
        end of the wait."""
        with self.filled:
            deadline = self.started + FIRST_WAIT_S if self.started is not None else 0
            while not (self.since is not None and max(self.seconds, default=self.since) >= self.since + 2):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self.filled.wait(remaining)
            self.asked = time.monotonic()
            self.waiting -= 1

    def add(self, taken, worker=None):
        """The seconds a worker handed over (with its snapshot; worker: its id)."""
        from export.topk import merged

        with self.lock:
            if not self.counting:
                return  # counted before the worker was told to stop
            if worker is not None:
                self.reporting.add(worker)
            if taken:
                first = min(doc["second"] for doc in taken)
                self.since = first if self.since is None else min(self.since, first)
                self.filled.notify_all()
            for doc in taken:
                s = doc["second"]
                have = self.seconds.get(s)
                if have is None:
                    self.seconds[s] = {**doc, **{key: dict(doc[key]) for key in ("rcode", "qtype", "delay")}}
                    continue
                have["packets"] += doc["packets"]
                have["transactions"] += doc["transactions"]
                for key in ("rcode", "qtype", "delay"):
                    for value, n in doc[key]:
                        have[key][value] = have[key].get(value, 0) + n
                for name in ("qnames", "domains", "clients"):
                    have[name] = merged([have[name], doc[name]])
            if self.seconds:
                newest = max(self.seconds)
                for s in [s for s in self.seconds if s <= newest - WINDOW_S]:
                    del self.seconds[s]

    def snapshot(self, n, listed=LISTED):
        """The figures of the last n seconds (ending at the newest second counted) as a JSON-able dict."""
        from export.topk import merged

        with self.lock:
            newest = max(self.seconds, default=None)
            picked = [] if newest is None else [self.seconds[s] for s in range(newest - n + 1, newest + 1)
                                                if s in self.seconds]
            since, counting, reporting = self.since, self.counting, len(self.reporting)
        # the rates: over the seconds counted, fewer than n while the counting has just started
        counted = n if since is None or newest is None else max(1, min(n, newest - since + 1))
        doc = {"seconds": n, "last_second": newest, "counting": counting, "counting_since": since,
               "counting_workers": reporting,
               "packets": sum(p["packets"] for p in picked), "transactions": sum(p["transactions"] for p in picked)}
        doc["packets_per_second"] = doc["packets"] / counted
        doc["transactions_per_second"] = doc["transactions"] / counted
        for key in ("rcode", "qtype"):
            doc[key] = _mix(picked, key)
        doc["delay"] = _percentiles(picked)
        for name, key in (("qnames", "qnames"), ("registered_domains", "domains"), ("clients", "clients")):
            doc[name] = [{"value": v, "count": c, "error": e}
                         for v, c, e in merged([p[key] for p in picked])[:listed]]
        return doc


def _mix(picked, key):
    from probe.decode.mnemonics import rcode_name, rr_type_name

    total = {}
    for p in picked:
        for value, n in p[key].items():
            total[value] = total.get(value, 0) + n
    name = rcode_name if key == "rcode" else rr_type_name
    ranked = sorted(total.items(), key=lambda vn: (-vn[1], vn[0] is None, vn[0] or 0))
    return [{"value": value, "name": "none" if value is None else name(value), "count": n} for value, n in ranked]


def _percentiles(picked):
    """Percentiles of the response delays (µs; the value of rank floor(q × (n − 1)), as inspect --summary)."""
    from export.live_top import delay_of_bin

    total = {}
    for p in picked:
        for b, n in p["delay"].items():
            total[b] = total.get(b, 0) + n
    count = sum(total.values())
    if not count:
        return {"count": 0}
    out, seen, bins = {"count": count}, 0, sorted(total.items())
    ranks = sorted(((count - 1) * q / 100, q) for q in PERCENTILES)
    for b, n in bins:
        seen += n
        while ranks and ranks[0][0] < seen:
            out[f"p{ranks.pop(0)[1]:g}"] = delay_of_bin(b)
    return out


def serve_top(supervisor):
    """Serve the supervisor's TopWindow on its Unix socket, from a thread; returns the socket (None: not served)."""
    cfg = supervisor.cfg
    path = socket_path(cfg)
    try:
        if path.is_socket():
            path.unlink()  # a capture's that ended without removing it (only one capture writes a directory)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(path))
        os.chmod(path, 0o660)
        if cfg.capture.user:
            from probe.run.checks import lookup_user

            pw = lookup_user(cfg.capture.user)
            os.chown(path, pw.pw_uid, pw.pw_gid)
        server.listen(8)
    except OSError as exc:
        log(f"`dnsprobe top` is not served: cannot listen on {path}: {exc.strerror or exc}")
        return None
    thread = threading.Thread(target=_answer, args=(server, supervisor.top), name="dnsprobe-top", daemon=True)
    thread.start()
    return server


def _answer(server, window):
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return  # closed at the end of the capture
        with conn:
            try:
                conn.settimeout(2.0)
                request = conn.recv(64).decode("ascii", "replace").strip()
                n = min(max(int(request or 10), 1), WINDOW_S)
                if window.mode == "false":
                    conn.sendall(json.dumps({"error": OFF}).encode())
                    continue
                window.ask(time.monotonic())
                window.wait_first()
                conn.sendall(json.dumps(window.snapshot(n)).encode())
            except (OSError, ValueError):
                continue  # a client gone, or not speaking the protocol
            except Exception as exc:  # noqa: BLE001 (a bug in a snapshot must not end the serving thread)
                log(f"`dnsprobe top`: cannot make a snapshot: {exc!r}")


def stop_serving(server, cfg):
    if server is None:
        return
    try:
        server.shutdown(socket.SHUT_RDWR)  # wakes the thread's accept()
    except OSError:
        pass
    server.close()
    try:
        socket_path(cfg).unlink()
    except OSError:
        pass


def fetch(path, seconds):
    """One snapshot of the last `seconds` seconds from the capture serving on path (OSError: none there)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(10.0)
        conn.connect(str(path))
        conn.sendall(f"{seconds}\n".encode())
        chunks = []
        while chunk := conn.recv(1 << 16):
            chunks.append(chunk)
    return json.loads(b"".join(chunks))
