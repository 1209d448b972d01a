"""The user's BPF filter expression (filter.expression, `--filter`), compiled by libpcap, never parsed here.

libpcap (the system's libpcap.so, through ctypes: pcap_open_dead + pcap_compile) turns the expression into classic
BPF instructions for a link type: Ethernet for live capture, the file's link type for `dnsprobe read`. Live
AF_PACKET capture runs the program in the kernel ahead of the DNS filter (probe.capture.bpf.dns_filter chains
them); `read` runs it on every frame with libpcap's own interpreter (bpf_filter) before decoding.
"""

import ctypes

from probe.errors import ConfigError
from probe.model import LINKTYPE_RAW, FrameBatch

DLT_EN10MB = 1
DLT_RAW = 12  # libpcap's DLT for LINKTYPE_RAW (101) on Linux; the other link types read here share their numbers
PCAP_NETMASK_UNKNOWN = 0xFFFFFFFF
SNAPLEN = 262144


class _Insn(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]


class _Program(ctypes.Structure):
    _fields_ = [("bf_len", ctypes.c_uint), ("bf_insns", ctypes.POINTER(_Insn))]


_libpcap = None


def libpcap():
    """The system's libpcap, loaded once; ConfigError when it is not installed."""
    global _libpcap
    if _libpcap is None:
        import ctypes.util  # here: it imports subprocess, tempfile and shutil, which a read without --filter skips

        name = ctypes.util.find_library("pcap") or "libpcap.so.0.8"
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            raise ConfigError("filter.expression needs libpcap (Debian: apt install libpcap0.8)") from None
        lib.pcap_open_dead.restype = ctypes.c_void_p
        lib.pcap_open_dead.argtypes = [ctypes.c_int, ctypes.c_int]
        lib.pcap_compile.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Program), ctypes.c_char_p, ctypes.c_int,
                                     ctypes.c_uint32]
        lib.pcap_geterr.restype = ctypes.c_char_p
        lib.pcap_geterr.argtypes = [ctypes.c_void_p]
        lib.pcap_freecode.argtypes = [ctypes.POINTER(_Program)]
        lib.pcap_close.argtypes = [ctypes.c_void_p]
        lib.bpf_filter.restype = ctypes.c_uint
        lib.bpf_filter.argtypes = [ctypes.POINTER(_Insn), ctypes.c_char_p, ctypes.c_uint, ctypes.c_uint]
        _libpcap = lib
    return _libpcap


def compile_filter(expression, linktype=DLT_EN10MB):
    """The classic BPF program (list of (code, jt, jf, k)) libpcap compiles, optimised, from the expression for
    frames of the link type (a LINKTYPE_* number); ConfigError with libpcap's message when it does not compile."""
    lib = libpcap()
    handle = lib.pcap_open_dead(DLT_RAW if linktype == LINKTYPE_RAW else linktype, SNAPLEN)
    if not handle:
        raise ConfigError(f"libpcap cannot compile filters for link type {linktype}")
    program = _Program()
    try:
        if lib.pcap_compile(handle, ctypes.byref(program), expression.encode(), 1, PCAP_NETMASK_UNKNOWN) != 0:
            message = lib.pcap_geterr(handle).decode(errors="replace")
            raise ConfigError(f"config key 'filter.expression' ({expression!r}): {message}")
        try:
            return [(i.code, i.jt, i.jf, i.k) for i in program.bf_insns[: program.bf_len]]
        finally:
            lib.pcap_freecode(ctypes.byref(program))
    finally:
        lib.pcap_close(handle)


def check_expression(expression):
    """config's check of filter.expression: it compiles for Ethernet (ValueError with libpcap's message)."""
    try:
        compile_filter(expression)
    except ConfigError as exc:
        raise ValueError(str(exc).partition("): ")[2] or str(exc)) from None
    return expression


class FrameFilter:
    """The expression applied to frames by libpcap's bpf_filter, compiled once per link type met. keep(batch)
    returns the batch of the frames it accepts and counts the others in `rejected`."""

    def __init__(self, expression):
        self.expression = expression
        self.programs = {}  # linktype: (ctypes instruction array, length)
        self.rejected = 0

    def _program(self, linktype):
        if linktype not in self.programs:
            insns = compile_filter(self.expression, linktype)
            self.programs[linktype] = (_Insn * len(insns))(*(_Insn(*i) for i in insns))
        return self.programs[linktype]

    def keep(self, batch):
        if type(batch) is not FrameBatch or not len(batch):
            return batch
        program = self._program(batch.linktype)
        run = libpcap().bpf_filter
        kept = [i for i, (wirelen, data) in enumerate(zip(batch.wirelen, batch.data))
                if run(program, data, wirelen, len(data))]
        if len(kept) == len(batch):
            return batch
        self.rejected += len(batch) - len(kept)
        ts, wirelen, data = batch.ts_ns, batch.wirelen, batch.data
        return FrameBatch(batch.linktype, [ts[i] for i in kept], [wirelen[i] for i in kept], [data[i] for i in kept],
                          share=batch.share, read=(batch.frames_read(), batch.last_ts()))  # the clock runs on
