"""Test helpers, one module per thing they build (docs/testing.md):

- data: where the shared test data is, and skipping without it
- dnsprobe: running the real `dnsprobe` command (and Python in a fresh interpreter), reading back what it wrote
- frames: Ethernet/IP/UDP/TCP frames around DNS bytes, TCP connections, pcap and pcapng files
- messages: DNS messages as bytes
- stages: the messages and transactions of a capture through the stages in-process
- captures: generated captures (live traffic, traffic a flow split keeps whole, the benchmark mix)
- edge_frames: frames for every branch of the packet decoders (EDNS options, DNS over TCP in every shape)
- pcap_records: the classic pcap files of the shared data as bytes, and their records made big-endian
- matching: traffic that walks every branch of matching, and the matching configurations the tests run
- cdns: the captures the C-DNS block builders are compared on, and the comparison of two blocks
- live: the veth testbed, hugepages, the capture probe under test (AF_PACKET and DPDK)
- dnstap: dnstap messages, Frame Streams files and a producer
- servers: Knot DNS, Knot Resolver and Unbound in a network namespace
- cbpf: a classic BPF interpreter (what the kernel runs)
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
# The benchmark scripts are plain modules in benchmarks/ (the veth testbed, the traffic generator), and the fuzz
# harnesses in fuzz/ hold differential checks the tests run too (fuzz_dnstap.one_input): importable.
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "fuzz")]
