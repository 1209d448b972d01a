"""dnstap producers on our sockets (probe.capture.dnstap_listen, dnstap_socket): the handshake, several
producers at once, and producers that misbehave, each closed alone with its reason logged and counted.

The source is driven in-process here, against real sockets and with the real decoder; then the whole
`dnsprobe capture --dnstap-socket/--dnstap-listen` command against libfstrm's fstrm_replay and hand-made
producers. The real servers are in tests/oracle/test_dnstap_servers.py."""

import grp
import os
import re
import shutil
import socket
import stat
import subprocess
import threading
import time
import urllib.request

import pytest
from support.dnsprobe import rows_of
from support.dnstap import FstrmProducer, dnstap_frame, fstrm_file
from support.frames import T0
from support.messages import q_dns, r_dns

from probe.capture import dnstap_socket
from probe.capture.dnstap_listen import close_listeners, open_listeners
from probe.capture.dnstap_receive import PythonReceiver
from probe.capture.dnstap_socket import DnstapSocketSource
from probe.capture.fstrm import FINISH
from probe.config import load_config
from probe.decode.dnstap import DnstapDecoder
from probe.errors import ConfigError
from probe.model import M
from probe.stats import Stats

CT = "protobuf:dnstap.Dnstap"


class Tap:
    """A socket source and the decoder behind it, run by a thread as a worker runs them."""

    def __init__(self, path, max_connections=8, **dnstap):
        self.cfg = load_config(overrides={"dnstap.socket": str(path), **{f"dnstap.{k}": v for k, v in dnstap.items()}})
        self.listeners = open_listeners(self.cfg.dnstap)
        self.logs = []
        self.source = DnstapSocketSource(self.listeners, max_connections, self.logs.append)
        self.stats = Stats()
        self.decoder = DnstapDecoder(self.cfg.dnstap, self.cfg.decode, self.stats)
        self.msgs = []
        self.runs = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stopping.is_set():
            self._feed(self.source.read(64, timeout=0.02))

    def _feed(self, batch):
        self.runs += [(name, len(frames)) for name, frames in batch.runs]
        self.msgs += self.decoder.decode(batch)

    def poll(self, until, what, timeout=10.0):
        deadline = time.monotonic() + timeout
        while not until():
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {self.logs} {self.counters()}"
            time.sleep(0.01)

    def drain(self):
        self.stop()
        self._feed(self.source.drain())

    def counters(self):
        return {**self.source.counters(), **{k: v for k, v in self.stats.as_dict().items() if v}}

    def stop(self):
        self.stopping.set()
        self.thread.join()

    def close(self):
        self.stop()
        self.source.close()
        close_listeners(self.listeners)


@pytest.fixture(params=["c", "python"])
def tap(tmp_path, request, monkeypatch):
    """The source with the C receiver, and with its Python twin (as where the extension is not built)."""
    if request.param == "python":
        monkeypatch.setattr(dnstap_socket, "open_receiver", PythonReceiver)
    t = Tap(tmp_path / "tap.sock")
    yield t
    t.close()


def frames(n, first=0):
    return [dnstap_frame("CLIENT_QUERY", dns=q_dns(first + i), ts=T0 + i) for i in range(n)]


def test_the_socket_has_its_owner_group_and_mode(tmp_path):
    group = "nogroup" if _has_group("nogroup") else str(os.getgid())
    t = Tap(tmp_path / "t.sock", socket_mode="0620", socket_group=group)
    try:
        st = os.stat(tmp_path / "t.sock")
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o620
        assert st.st_gid == (grp.getgrnam(group).gr_gid if not group.isdigit() else int(group))
        assert st.st_uid == os.getuid()
    finally:
        t.close()
    assert not (tmp_path / "t.sock").exists()  # removed at the end


def test_a_socket_in_use_or_another_file_is_refused(tmp_path, tap):
    with pytest.raises(ConfigError, match="is in use"):
        open_listeners(load_config(overrides={"dnstap.socket": str(tmp_path / "tap.sock")}).dnstap)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="exists and is not a socket"):
        open_listeners(load_config(overrides={"dnstap.socket": str(tmp_path / "file")}).dnstap)
    with pytest.raises(ConfigError, match="no group 'no-such-group-i20'"):
        open_listeners(load_config(overrides={"dnstap.socket": str(tmp_path / "x.sock"),
                                              "dnstap.socket_group": "no-such-group-i20"}).dnstap)


def test_a_leftover_socket_is_replaced(tmp_path):
    leftover = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    leftover.bind(str(tmp_path / "old.sock"))
    leftover.close()  # the file stays, nobody listens
    t = Tap(tmp_path / "old.sock")
    t.close()


def test_two_producers_at_once_with_the_handshake(tap):
    a = FstrmProducer(tap.cfg.dnstap.socket)
    b = FstrmProducer(tap.cfg.dnstap.socket)
    tap.poll(lambda: tap.source.counters()["dnstap_connections"] == 2, "two connections")
    a.handshake()
    b.handshake()
    for i in range(5):  # interleaved
        a.send(frames(10, 100 * i))
        b.send(frames(10, 1000 + 100 * i))
    tap.poll(lambda: len(tap.msgs) == 100, "100 messages")
    assert a.stop() == (FINISH, []) and b.stop() == (FINISH, [])
    tap.poll(lambda: tap.source.counters()["dnstap_disconnections"] == 2, "both closed")
    a.close()
    b.close()
    assert {name for name, _ in tap.runs} == {"w0c1", "w0c2"}
    assert sorted(m[M.ID] for m in tap.msgs) == sorted([100 * i + j for i in range(5) for j in range(10)]
                                                     + [1000 + 100 * i + j for i in range(5) for j in range(10)])
    c = tap.counters()
    assert (c["dnstap_connections"], c["dnstap_disconnections"], c["dnstap_frames"], c["dnstap_refused"]) == (
        2, 2, 100, 0)
    assert c["dnstap_bytes"] == sum(len(f) + 4 for f in frames(100)) + 2 * 2 * (8 + 4 + 8 + len(CT)) + 2 * 12
    assert sum("closed, after 50 frames" in line for line in tap.logs) == 2


def test_a_producer_that_disconnects_mid_frame(tap):
    good = FstrmProducer(tap.cfg.dnstap.socket).handshake()
    p = FstrmProducer(tap.cfg.dnstap.socket).handshake()
    data = b"".join(len(f).to_bytes(4, "big") + f for f in frames(3))
    p.sock.sendall(data[:-7])  # the third frame loses its end
    p.close()
    good.send(frames(4, 50))
    tap.poll(lambda: tap.source.counters()["dnstap_truncated"] == 1 and len(tap.msgs) == 6, "the cut")
    assert any("ended inside a frame" in line for line in tap.logs)
    good.send(frames(1, 60))  # the other producer goes on
    tap.poll(lambda: len(tap.msgs) == 7, "the other producer's frame")
    good.close()


def test_a_wrong_content_type_is_refused_in_the_handshake(tap):
    from probe.capture.fstrm import READY

    p = FstrmProducer(tap.cfg.dnstap.socket, content_type=b"protobuf:something.Else")
    p.control(READY, [p.content_type])
    tap.poll(lambda: tap.source.counters()["dnstap_refused"] == 1, "the refusal")
    assert p.answer() is None  # closed, no ACCEPT
    assert any("refused: READY offers [b'protobuf:something.Else']" in line for line in tap.logs)
    p.close()


def test_a_frame_that_is_not_dnstap_closes_that_producer_only(tap):
    good = FstrmProducer(tap.cfg.dnstap.socket).handshake()
    bad = FstrmProducer(tap.cfg.dnstap.socket).handshake()
    bad.send(frames(2) + [b"\xff\xfe not protobuf"] + frames(3, 10))
    tap.poll(lambda: tap.source.counters()["dnstap_disconnections"] == 1, "the bad producer closed")
    assert bad.answer() is None
    c = tap.counters()
    assert (c["dnstap_frames"], c["dnstap_decode_errors"], c["dnstap_frames_discarded"]) == (6, 1, 3)
    assert len(tap.msgs) == 2
    assert any("closed: a data frame of 15 bytes is not a protobuf dnstap message" in line for line in tap.logs)
    good.send(frames(2, 20))
    tap.poll(lambda: len(tap.msgs) == 4, "the good producer's frames")
    good.close()


@pytest.mark.parametrize("garbage, problem", [
    (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "a data frame before START"),
    (b"\0\0\0\0\x7f\xff\xff\xff", "a control frame of 2147483647 bytes"),
])
def test_garbage_instead_of_frame_streams(tap, garbage, problem):
    p = FstrmProducer(tap.cfg.dnstap.socket)
    p.sock.sendall(garbage)
    tap.poll(lambda: tap.source.counters()["dnstap_frame_errors"] == 1, "the frame error")
    assert any(problem in line for line in tap.logs), tap.logs
    p.close()


def test_an_absurd_data_frame_length(tap):
    p = FstrmProducer(tap.cfg.dnstap.socket).handshake()
    p.send(frames(1))
    p.sock.sendall(b"\x7f\xff\xff\xff" + b"x" * 100)
    tap.poll(lambda: tap.source.counters()["dnstap_frame_errors"] == 1, "the frame error")
    assert len(tap.msgs) == 1
    assert any("a data frame of 2147483647 bytes (at most 1048576)" in line for line in tap.logs)


def test_too_many_producers(tmp_path):
    t = Tap(tmp_path / "t.sock", max_connections=2)
    try:
        ps = [FstrmProducer(t.cfg.dnstap.socket) for _ in range(3)]
        t.poll(lambda: t.source.counters()["dnstap_refused"] == 1, "the refusal")
        assert t.source.counters()["dnstap_connections"] == 2
        assert any("dnstap.max_connections" in line for line in t.logs)
        for p in ps:
            p.close()
    finally:
        t.close()


def test_draining_takes_what_was_sent(tap):
    p = FstrmProducer(tap.cfg.dnstap.socket).handshake()
    tap.poll(lambda: tap.source.counters()["dnstap_connections"] == 1, "the connection")
    p.send(frames(500))
    tap.stop()  # the worker stops reading ...
    p.send(frames(500, 1000))
    time.sleep(0.1)  # ... while more is in the socket's buffer
    tap.drain()
    assert len(tap.msgs) == 1000 and tap.source.counters()["dnstap_disconnections"] == 1
    p.close()


def _has_group(name):
    try:
        grp.getgrnam(name)
        return True
    except KeyError:
        return False


# ---------------------------------------------------------------------------------------------
# The command


@pytest.mark.skipif(not shutil.which("fstrm_replay"),
                    reason="fstrm_replay missing (Debian package fstrm-bin; contrib/install-deps.sh)")
def test_capture_from_fstrm_replay_and_bad_producers(tmp_path, out_dir, probes):
    """`dnsprobe capture --dnstap-socket` and `--dnstap-listen` with libfstrm's fstrm_replay as producers
    (three at once, and one reconnecting), beside producers that misbehave: every good message is a record."""
    sock, port = tmp_path / "tap.sock", _free_port()
    n = 300
    msgs = []
    for i in range(n):
        msgs.append(dnstap_frame("CLIENT_QUERY", dns=q_dns(i), qport=20000 + i, ts=T0 + i * 1000))
        msgs.append(dnstap_frame("CLIENT_RESPONSE", dns=r_dns(i), qport=20000 + i, ts=T0 + i * 1000 + 500))
    data = tmp_path / "replay.fstrm"
    data.write_bytes(fstrm_file(msgs))
    metrics_port = _free_port()
    probe = probes(None, out_dir, "--dnstap-socket", sock, "--dnstap-listen", f"127.0.0.1:{port}",
                   "--dnstap-socket-mode", "0600", "--prometheus-port", metrics_port, "--set", "run.progress=always")
    probe.wait_ready()
    assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600

    def replay(*where):
        return subprocess.Popen(["fstrm_replay", "-t", CT, "-r", str(data), *where],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    bad = FstrmProducer(sock).handshake()
    bad.send(msgs[:4])
    bad.sock.sendall(b"\0\0\1\0" + b"cut")  # then disconnects mid-frame
    bad.close()
    wrong = subprocess.run(["fstrm_replay", "-t", "protobuf:other", "-r", str(data), "-u", str(sock)],
                           capture_output=True, text=True, timeout=30)
    assert wrong.returncode != 0  # refused in the handshake
    garbage = FstrmProducer(sock).handshake()
    garbage.send([b"\x08\x96\x01 garbage"])
    replays = [replay("-u", str(sock)) for _ in range(3)] + [replay("-a", "127.0.0.1", "-p", str(port))]
    for r in replays:
        assert r.wait(30) == 0, r.stdout.read()
    assert replay("-u", str(sock)).wait(30) == 0  # a producer that comes back
    probe.wait_counter("dnstap_frames", 5 * 2 * n + 4 + 1)
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as page:
        metrics = page.read().decode()
    assert f'dnsprobe_dnstap_frames_total{{worker="0"}} {5 * 2 * n + 4 + 1}.0' in metrics
    assert 'dnsprobe_dnstap_client_query_total{worker="0"}' in metrics
    time.sleep(1.2)  # a status line with the producers' messages
    garbage.close()
    assert probe.stop() == 0, probe.stderr
    doc = probe.stats()
    c = doc["counters"]
    # connections: the cut one, the refused one, the garbage one, four replays and the one that came back
    assert (c["dnstap_connections"], c["dnstap_refused"], c["dnstap_truncated"], c["dnstap_decode_errors"]) == (
        8, 1, 1, 1), c
    assert c["dnstap_disconnections"] == 8 and c["dnstap_frame_errors"] == 0
    assert c["dnstap_client_query"] == 5 * n + 2 and c["dnstap_client_response"] == 5 * n + 2
    assert doc["dnstap"] == [f"dnstap socket {sock}", f"dnstap TCP 127.0.0.1:{port}"]
    rows = rows_of(out_dir)
    assert len(rows) == c["records"] and c["packets"] == 0
    # the same server (identity srv) five times over: its transactions pair within and across its connections
    assert c["matched"] == 5 * n + 2 and sum(r["response_present"] and r["query_present"] for r in rows) == 5 * n + 2
    assert {(r["transport"], r["dnstap_type"], r["server_identity"]) for r in rows} == {("udp", "client", "srv")}
    err = probe.stderr
    for needle in ("refused: READY offers [b'protobuf:other']", "ended inside a frame",
                   "is not a protobuf dnstap message", "(fstrm_replay, pid"):
        assert needle in err, (needle, err)
    assert not sock.exists()  # removed at the end
    assert "Traceback" not in err
    assert re.search(r"dnstap messages [\d,]+ from \d producer\(s\)\s+\([\d,]+/s\)", err), err


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_capture_needs_something_to_capture(out_dir):
    from support.dnsprobe import run_dnsprobe

    proc = run_dnsprobe("capture", "-o", out_dir, "-q", check=False)
    assert proc.returncode == 2 and "nothing to capture" in proc.stderr
    proc = run_dnsprobe("capture", "--dnstap-socket", "/nonexistent-dir-i20/s", "-o", out_dir, "-q", check=False)
    assert proc.returncode == 2 and "directory /nonexistent-dir-i20 does not exist" in proc.stderr
    proc = run_dnsprobe("capture", "--dnstap-listen", "localhost", "-o", out_dir, "-q", check=False)
    assert proc.returncode == 2 and "is not HOST:PORT" in proc.stderr
    proc = run_dnsprobe("capture", "--dnstap-socket", "/tmp/x.sock", "--dnstap-socket-mode", "rw", "-o", out_dir,
                        "-q", check=False)
    assert proc.returncode == 2 and "'rw' is not an octal mode" in proc.stderr


@pytest.mark.skipif(not shutil.which("fstrm_replay") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs fstrm_replay (Debian fstrm-bin) and 2 cores")
def test_two_workers_share_the_producers(tmp_path, out_dir, probes):
    """Both workers accept from the one socket (the one that accepts a connection keeps it): every message is
    counted once and written once, whichever worker took its producer."""
    sock = tmp_path / "tap.sock"
    msgs = []
    for i in range(200):
        msgs.append(dnstap_frame("AUTH_QUERY", dns=q_dns(i), qport=30000 + i, ts=T0 + i * 1000))
        msgs.append(dnstap_frame("AUTH_RESPONSE", dns=r_dns(i), qport=30000 + i, ts=T0 + i * 1000 + 300))
    data = tmp_path / "replay.fstrm"
    data.write_bytes(fstrm_file(msgs))
    probe = probes(None, out_dir, "--dnstap-socket", sock, coremask="0x3")
    probe.wait_ready()
    replays = [subprocess.Popen(["fstrm_replay", "-t", CT, "-r", str(data), "-u", str(sock)]) for _ in range(6)]
    assert all(r.wait(30) == 0 for r in replays)
    probe.wait_counter("dnstap_frames", 6 * 400)
    assert probe.stop() == 0, probe.stderr
    doc = probe.stats()
    c = doc["counters"]
    assert (c["dnstap_connections"], c["dnstap_disconnections"], c["dnstap_auth_query"]) == (6, 6, 1200)
    per_worker = [w["counters"]["dnstap_connections"] for w in doc["workers"].values()]
    assert sum(per_worker) == 6 and len(per_worker) == 2
    rows = rows_of(out_dir)
    assert len(rows) == c["records"] and sum(r["query_present"] for r in rows) == 1200
    assert {p.name.split(".")[-2] for p in out_dir.glob("*.parquet")} <= {"w0", "w1"}
