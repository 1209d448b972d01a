/* The C API that probe.decode._tcpstream exports to the frame loops (a capsule, as decoderec_api.h): the TCP stream
 * step without a Python call per segment. The frame loops (include/frameloop.h) take, as their tcp argument, a
 * (TcpReassembler, on_reset) pair: on_reset(src, ipv) runs for a segment with RST before the step, as
 * PacketDecoder._tcp_step does. */
#ifndef DNSPROBE_TCPSTREAM_API_H
#define DNSPROBE_TCPSTREAM_API_H

#include <Python.h>
#include <stdint.h>

#define TCPSTREAM_CAPSULE "probe.decode._tcpstream._C_API"
#define TCPSTREAM_API_VERSION 1

typedef struct {
    int version;        /* TCPSTREAM_API_VERSION */
    PyTypeObject *type; /* probe.decode._tcpstream.TcpReassembler */
    /* What TcpReassembler.segment(key, ts, wirelen, ttl, seq, flags, payload) does, the key given as its parts
     * (src and dst of alen <= 16 bytes): the messages it completes appended to out (a list) as the tuples it
     * returns; but its counts are left pending, for write_stats. reassembler must be of type. -1 with an
     * exception set on an error. */
    int (*segment)(PyObject *reassembler, const unsigned char *src, const unsigned char *dst, int alen, unsigned sport,
                   unsigned dport, long long ts, long long wirelen, long ttl, uint32_t seq, long flags,
                   PyObject *payload, PyObject *out);
    /* Adds the pending counts to the stats object (a frame loop calls it once, at its end, rather than an
     * attribute update per segment). -1 with an exception set on an error, or when one was set before. */
    int (*write_stats)(PyObject *reassembler);
} TcpstreamAPI;

#endif
