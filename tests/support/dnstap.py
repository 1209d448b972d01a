"""dnstap: messages and Frame Streams built with the project's own schema table and codec, and a producer."""

import struct
from pathlib import Path

from support.frames import C4, CPORT, NS, S4, T0
from support.messages import q_dns, r_dns


def dnstap_frame(mtype="CLIENT_QUERY", identity=b"srv", dns=None, family="INET", protocol="UDP", qaddr=C4, raddr=S4,
                 qport=CPORT, rport=53, ts=T0, embedded=None, **extra):
    """A serialized dnstap message. dns: the DNS message (query_message for a query type, response_message for a
    response type; default a query or response for www.example.com id 1); embedded: a query_message also
    carried in a response; ts: ns, set as query_time or response_time; None omits a field. extra: more
    Message fields by name (a value None clears a field set above)."""
    import ipaddress

    from probe.decode.dnstap_schema import Dnstap
    from probe.decode.dnstap_types import MESSAGE_TYPES

    numbers = {name: n for n, (name, _, _) in MESSAGE_TYPES.items()}
    response = MESSAGE_TYPES[numbers[mtype]][2]
    d = Dnstap(type=1)
    if identity is not None:
        d.identity = identity
    m = d.message
    m.type = numbers[mtype]
    if family is not None:
        m.socket_family = {"INET": 1, "INET6": 2}[family]
    if protocol is not None:
        m.socket_protocol = {"UDP": 1, "TCP": 2, "DOT": 3, "DOH": 4, "DNSCryptUDP": 5, "DNSCryptTCP": 6,
                             "DOQ": 7}[protocol]
    for name, value in (("query_address", qaddr), ("response_address", raddr)):
        if value is not None:
            setattr(m, name, ipaddress.ip_address(value).packed if isinstance(value, str) else value)
    if qport is not None:
        m.query_port = qport
    if rport is not None:
        m.response_port = rport
    half = "response" if response else "query"
    if dns is None:
        dns = r_dns(1) if response else q_dns(1)
    setattr(m, f"{half}_message", dns)
    if embedded is not None:
        m.query_message = embedded
    if ts is not None:
        setattr(m, f"{half}_time_sec", ts // NS)
        setattr(m, f"{half}_time_nsec", ts % NS)
    for name, value in extra.items():
        if value is None:
            m.ClearField(name)
        else:
            setattr(m, name, value)
    return d.SerializeToString()


def fstrm_file(frames, content_type=b"protobuf:dnstap.Dnstap", stop=True):
    """The bytes of a Frame Streams file: START, one data frame per item, STOP."""
    from probe.capture.fstrm import START, STOP, encode_control

    out = [encode_control(START, [content_type] if content_type else [])]
    out += [struct.pack("!I", len(f)) + f for f in frames]
    if stop:
        out.append(encode_control(STOP))
    return b"".join(out)


class FstrmProducer:
    """A dnstap producer on a Unix or TCP socket, by hand: the bidirectional handshake, frames, STOP/FINISH."""

    def __init__(self, address, content_type=b"protobuf:dnstap.Dnstap"):
        import socket as socketlib

        family = socketlib.AF_UNIX if isinstance(address, (str, Path)) else socketlib.AF_INET
        self.sock = socketlib.socket(family, socketlib.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(str(address) if family == socketlib.AF_UNIX else address)
        self.content_type = content_type

    def control(self, ctype, types=()):
        from probe.capture.fstrm import encode_control

        self.sock.sendall(encode_control(ctype, types))

    def answer(self):
        """The next control frame from the reader as (type, [content types]); None when it closed."""
        from probe.capture.fstrm import FrameReader

        reader, data = FrameReader(), b""
        while True:
            control = reader.take([], 1, data_allowed=False) if data else None
            if control is not None:
                return control
            try:
                data = self.sock.recv(4096)
            except ConnectionResetError:
                return None
            if not data:
                return None
            reader.feed(data)

    def handshake(self):
        from probe.capture.fstrm import ACCEPT, READY, START

        self.control(READY, [self.content_type])
        assert self.answer() == (ACCEPT, [self.content_type])
        self.control(START, [self.content_type])
        return self

    def send(self, frames):
        self.sock.sendall(b"".join(struct.pack("!I", len(f)) + f for f in frames))

    def stop(self):
        """STOP; returns the reader's answer (FINISH expected)."""
        from probe.capture.fstrm import STOP

        self.control(STOP)
        return self.answer()

    def close(self):
        self.sock.close()
