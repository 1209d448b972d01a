"""The DPDK extension's memory safety (issue 32): what a frame reads of its mbuf, frames that outlive their port,
a Poller shared between threads.

- An mbuf whose pkt_len is above what its segments hold (a single segment's data_len, or a chain that ends
  early) gave a frame read past its data: the frame is now what the segments hold, counted as truncated
  (its wire length pkt_len). Run through the test hook of the mbuf-to-frame code (frames_from_mbufs: no device
  makes such mbufs on purpose); under `make test-asan` a read past a segment is a report.
- Frames from Poller.read point into their mbufs: port_close freed the pool under them (a later pool could take
  its memory), and eal_cleanup unmapped it. The pool now lives until the last frames let go of it, and
  eal_cleanup is refused while frames point into mbufs.
- A Poller read from two threads at once (its read releases the GIL) filled one mbuf array twice, two pollers
  of one queue called rte_eth_rx_burst on it together, two of one worker's ring dequeued from a
  single-consumer ring, and two distributing pollers filled the single-producer rings: the second read is
  refused, as are stopping and closing a port that a poll reads.

The EAL runs in a fresh interpreter (once per process, and a crash there fails the test only), on net_pcap vdevs
without hugepages.
"""

from support.dnsprobe import run_python
from support.frames import udp_frame, write_pcap
from support.live import EAL_SCRIPT, needs_dpdk, needs_root
from support.messages import q_dns, r_dns


@needs_dpdk
def test_a_frame_is_never_read_past_its_segments():
    from probe import _records
    from probe.capture import _dpdk

    frame = udp_frame(q_dns(0x3201))
    cases = [  # (segments, pkt_len) -> the frame
        (((frame,), len(frame)), frame),
        (((frame[:20],), len(frame)), frame[:20]),  # one segment, pkt_len above its data_len
        (((frame[:20], frame[20:40]), len(frame)), frame[:40]),  # a chain that ends before pkt_len
        (((frame[:20], b"", frame[20:]), len(frame)), frame),  # an empty segment
        (((frame[:20], frame[20:]), 30), frame[:30]),  # pkt_len below what they hold
        (((frame[:10], frame[10:]), len(frame) + 1000), frame),
        (((b"",), 64), b""),
    ]
    frames = _records.Frames()
    items = [(tuple(bytes(bytearray(s)) for s in segs), pkt_len, k, -1, False)
             for k, ((segs, pkt_len), _) in enumerate(cases)]
    assert _dpdk.frames_from_mbufs(items, frames) == len(cases)
    del items  # the frames hold the segments they point into
    ts, wirelen, data = frames.lists()
    assert data == [want for _, want in cases]
    assert wirelen == [pkt_len for (_, pkt_len), _ in cases]
    # A tag taken off is put back; an indirect mbuf's frame is copied, as a chain's is.
    frames = _records.Frames()
    _dpdk.frames_from_mbufs([((frame,), len(frame), 7, 0x123, True), ((frame[:5],), 20, 8, 0x123, False)], frames)
    assert frames.lists() == ([7, 8], [len(frame) + 4, 20],
                              [frame[:12] + b"\x81\x00\x01\x23" + frame[12:], frame[:5]])
    # An indirect mbuf of no bytes, in a burst with nothing else to copy, took a pointer into a copy buffer that
    # was never made (fuzz_dpdk's first finding, under UBSan).
    frames = _records.Frames()
    _dpdk.frames_from_mbufs([((b"", b""), 0, 9, -1, True)], frames)
    assert frames.lists() == ([9], [0], [b""])


OUTLIVE = EAL_SCRIPT + """
_dpdk.port_setup(0, 1, 512, 1023, 256, False)  # 256-byte mbufs: the response is a chain of two
frames = _records.Frames()
print(_dpdk.port_poller(0, (0,), 512, False).read(64, 2_000_000, frames))
_dpdk.port_stop(0)
_dpdk.port_close(0)
attempt(_dpdk.eal_cleanup)
# A second port's pool, filled with its frames: it could have taken the memory of the first one's.
_dpdk.port_setup(1, 1, 512, 1023, 256, False)
others = _records.Frames()
print(_dpdk.port_poller(1, (0,), 512, False).read(64, 2_000_000, others))
print(frames.lists()[2] == [bytes.fromhex(h) for h in sys.argv[2:]])
frames.clear()
others.clear()
_dpdk.port_stop(1)
_dpdk.port_close(1)
attempt(_dpdk.eal_cleanup)
dpdk.remove_runtime_dir()
"""


@needs_dpdk
@needs_root
def test_frames_outlive_their_port(tmp_path):
    ours = [udp_frame(q_dns(0x3202)), udp_frame(r_dns(0x3202, answers=12))]
    theirs = [udp_frame(q_dns(k, qname="x" * 60 + ".example")) for k in range(8)]
    assert len(ours[1]) > 256 - 128 > len(ours[0])  # (128 bytes of an mbuf are its headroom)
    first = write_pcap(tmp_path / "ours.pcap", [(1_700_000_000 * 10**9 + k, f) for k, f in enumerate(ours)])
    second = write_pcap(tmp_path / "theirs.pcap", [(1_700_000_000 * 10**9 + k, f) for k, f in enumerate(theirs)])
    proc = run_python(OUTLIVE, f"{first};{second}", *(f.hex() for f in ours))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "2",
        "1 batch(es) of frames still point into mbufs: let go of them (Frames.clear()) before the EAL is cleaned up",
        "8",
        "True",
        "done",
    ], proc.stdout + proc.stderr


SHARED = EAL_SCRIPT + """
_dpdk.port_setup(0, 2, 512, 1023, 2048, False)  # (two queues, each reading the file's one frame)
_dpdk.make_rings(2, 1024)
poller = _dpdk.port_poller(0, (0,), 512, False)
print(poller.read(64, 2_000_000, _records.Frames()), _dpdk.port_poller(0, (1,), 512, False).read(64, 2_000_000,
      _records.Frames()))
# Each read waits 3 s for frames that do not come, the GIL released: queue 0, queue 1 distributing, worker 1's ring.
readers = [threading.Thread(target=p.read, args=(64, 3_000_000, _records.Frames())) for p in
           (poller, _dpdk.port_poller(0, (1,), 512, True), _dpdk.ring_poller(1))]
for r in readers:
    r.start()
time.sleep(0.5)
attempt(poller.read, 64, 0, _records.Frames())
attempt(_dpdk.port_poller(0, (0,), 512, False).read, 64, 0, _records.Frames())
attempt(_dpdk.rx_burst, 0, 0, 8, 0)
attempt(_dpdk.port_poller(0, (0,), 512, True).read, 64, 0, _records.Frames())
attempt(_dpdk.ring_poller(1).read, 64, 0, _records.Frames())
attempt(_dpdk.port_stop, 0)
attempt(_dpdk.port_close, 0)
for r in readers:
    r.join()
attempt(poller.read, 64, 0, _records.Frames())
attempt(_dpdk.ring_poller(1).read, 64, 0, _records.Frames())
attempt(_dpdk.port_stop, 0)
attempt(_dpdk.port_close, 0)
attempt(_dpdk.eal_cleanup)
dpdk.remove_runtime_dir()
"""


@needs_dpdk
@needs_root
def test_a_poller_a_queue_and_a_ring_are_read_by_one_thread_at_a_time(tmp_path):
    pcap = write_pcap(tmp_path / "one.pcap", [(1_700_000_000 * 10**9, udp_frame(q_dns(0x3203)))])
    proc = run_python(SHARED, f"{pcap},rx_pcap={pcap}")  # (one device of two queues)
    assert proc.returncode == 0, proc.stderr
    busy = "an RX queue of this poller is being read by another thread"
    assert proc.stdout.splitlines() == [
        "1 1",
        "this poller is being read by another thread (a poller is read by one thread at a time)",
        busy,
        busy,
        "another thread is distributing frames to the workers' rings",
        "the ring of this worker is being read by another thread",
        "port 0 is being read by a poller in another thread",
        "port 0 is being read by a poller in another thread",
        *["done"] * 5,
    ], proc.stdout + proc.stderr
