"""Decoding stage: frames, or dnstap messages, → DNS messages (probe.model's message tuples).

link (link layers, VLAN tags) → IP (fragments: fragments.py; allow/deny lists: ipfilter.py) → UDP or TCP
(streams and length-prefix framing: tcpstream.py, with its C twin in _tcpstream.c, which the C parser uses) →
the DNS walker (dnswire.py, with its C twin in _fastwire.c; dpkt through dpkt_parser.py when asked). packets.py
drives them for a batch; for the production pipeline it decodes the common frames into message records in C
(_decoderec.c, on the walk in include/wire.h that _fastwire.c shares), the others through the Python code.
dnstap messages (a DnstapBatch) go through dnstap.py instead (its loop in C in _dnstap.c, the protobuf schema in
dnstap_schema.py, the message types in dnstap_types.py) to the same walker. The walker's functions are a public
API: the C-DNS writer and the reader use them.
"""

from typing import Protocol


class Decoder(Protocol):
    """The decoding stage's interface, as the pipeline (probe.run.pipeline) uses it."""

    parser: str  # the DNS parser that runs: fast, wire or dpkt
    now_ns: int  # capture time of the newest frame decoded (the clock of timeouts and rotation)
    address_events: dict  # ICMP errors and TCP resets seen since the last export (C-DNS address events)

    def decode(self, batch, source_name="input") -> list:
        """A batch from a source → the DNS message tuples it completes, in capture order (the Python reference)."""

    def decode_into(self, batch, out, source_name="input") -> None:
        """The same messages appended to out, a probe._records.MsgBatch, as records (the production pipeline)."""

    def flush(self):
        """End of input: what is still reassembling (TCP streams, fragments) is dropped and counted."""
