"""The listening sockets of dnstap input: a Unix socket (dnstap.socket: owner, group and mode configurable so
that a server running as its own user can connect) and a TCP socket (dnstap.listen, HOST:PORT).

They are made once, by the process that starts the capture, before any worker: a server that finds no
socket at its start may never connect (Knot Resolver gives up). Every worker inherits them and accepts
from them (probe.capture.dnstap_socket); they stay open while workers restart.
"""

import grp
import os
import pwd
import socket
import stat
from pathlib import Path

from probe.errors import ConfigError

BACKLOG = 128
_made = {}  # a Unix socket we made -> (its path, its inode): removed at the end only if it is still that file


def _id(value, db, what, key):
    """A user or group id from a name or a number."""
    if value is None:
        return -1
    if str(value).isdigit():
        return int(value)
    try:
        return (db.getpwnam if db is pwd else db.getgrnam)(value)[2]
    except KeyError:
        raise ConfigError(f"config key '{key}': no {what} {value!r} on this machine") from None


def _unused(path):
    """Remove a socket left by an earlier run; refuse a socket another process listens on, or another file."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ConfigError(f"config key 'dnstap.socket': {path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        os.unlink(path)  # nobody listens: a leftover
        return
    finally:
        probe.close()
    raise ConfigError(f"config key 'dnstap.socket': {path} is in use (another process listens on it)")


def listen_unix(cfg):
    """The Unix socket of cfg (a DnstapConfig), listening, with its owner, group and mode set."""
    path = Path(cfg.socket)
    if not path.parent.is_dir():
        raise ConfigError(f"config key 'dnstap.socket': directory {path.parent} does not exist")
    uid = _id(cfg.socket_owner, pwd, "user", "dnstap.socket_owner")
    gid = _id(cfg.socket_group, grp, "group", "dnstap.socket_group")
    _unused(path)

    def bind(sock):
        sock.bind(str(path))
        os.chmod(path, int(cfg.socket_mode, 8))
        if uid >= 0 or gid >= 0:
            os.chown(path, uid, gid)
        _made[sock] = (str(path), os.stat(path).st_ino)

    return _listening(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM), bind, "dnstap.socket", path)


def listen_tcp(cfg):
    """The TCP socket of cfg.listen (HOST:PORT, an IPv6 address in brackets), listening."""
    host, _, port = cfg.listen.rpartition(":")
    host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(f"config key 'dnstap.listen': {cfg.listen}: {exc.strerror}") from None
    family, _, _, _, address = infos[0]

    def bind(sock):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)

    return _listening(socket.socket(family, socket.SOCK_STREAM), bind, "dnstap.listen", cfg.listen)


def _listening(sock, bind, key, where):
    """sock bound by bind(sock), listening and non-blocking; ConfigError naming key and where when it cannot."""
    try:
        bind(sock)
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"config key '{key}': cannot listen on {where}: {exc.strerror}") from None
    sock.setblocking(False)
    return sock


def open_listeners(cfg):
    """The listening sockets dnstap.socket and dnstap.listen ask for (none: an empty list)."""
    out = []
    try:
        if cfg.socket:
            out.append(listen_unix(cfg))
        if cfg.listen:
            out.append(listen_tcp(cfg))
    except BaseException:
        close_listeners(out)
        raise
    return out


def close_listeners(listeners):
    """Close them; a Unix socket's file is removed if it is still the one we made."""
    for sock in listeners:
        sock.close()
        path, inode = _made.pop(sock, (None, None))
        try:
            if path and os.stat(path).st_ino == inode:
                os.unlink(path)
        except OSError:
            pass
