/* The common-frame loop of PacketDecoder.decode_into (probe/decode/_decoderec.c: message records into a
 * MsgBatch): its arguments, counts, the IP lists and the TCP stream step, and where it stops, by the rules of
 * the Python frame loop (probe/decode/packets.py). The loop over the three lists of a FrameBatch is written
 * here, with the step for one frame given by its includer. */
#ifndef DNSPROBE_FRAMELOOP_H
#define DNSPROBE_FRAMELOOP_H

#include <Python.h>

#include "tcpstream_api.h"
#include "wire.h"

/* The C TCP stream step's API, imported at the first (TcpReassembler, on_reset) tcp argument (not at module
 * import: the frame loops also run with the Python step). */
static TcpstreamAPI *tcp_api;

/* The counts list the frame loop adds to (packets.py's c_counts). */
enum { C_BYTES, C_MESSAGES, C_RESPONSES, C_MALFORMED, C_FILTERED, N_COUNTS };

/* The checks of the portmap, counts and tcp arguments. */
static int check_frame_args(Py_ssize_t portmap_len, PyObject *counts, PyObject *tcp)
{
    if (portmap_len != 8192 || PyList_GET_SIZE(counts) != N_COUNTS) {
        PyErr_SetString(PyExc_ValueError, "portmap must have 8192 bytes and counts 5 items");
        return -1;
    }
    if (PyTuple_Check(tcp)) {
        if (tcp_api == NULL) {
            TcpstreamAPI *api = (TcpstreamAPI *)PyCapsule_Import(TCPSTREAM_CAPSULE, 0);
            if (api == NULL)
                return -1;
            if (api->version != TCPSTREAM_API_VERSION) {
                PyErr_SetString(PyExc_ImportError, "probe.decode._tcpstream has another C API version");
                return -1;
            }
            tcp_api = api;
        }
        if (PyTuple_GET_SIZE(tcp) != 2 || !PyObject_TypeCheck(PyTuple_GET_ITEM(tcp, 0), tcp_api->type)
            || !PyCallable_Check(PyTuple_GET_ITEM(tcp, 1))) {
            PyErr_SetString(PyExc_TypeError, "tcp must be callable, None or a (TcpReassembler, on_reset) pair");
            return -1;
        }
    } else if (tcp != Py_None && !PyCallable_Check(tcp)) {
        PyErr_SetString(PyExc_TypeError, "tcp must be callable, None or a (TcpReassembler, on_reset) pair");
        return -1;
    }
    return 0;
}

/* counts[i] += add[i]. The counts must be exact ints: anything else could run Python code (__index__) that
 * changes the list under the loop. */
static int add_counts(PyObject *counts, const long long *add)
{
    for (Py_ssize_t i = 0; i < N_COUNTS; i++) {
        if (!add[i])
            continue;
        PyObject *item = i < PyList_GET_SIZE(counts) ? PyList_GET_ITEM(counts, i) : NULL;
        if (item == NULL || !PyLong_CheckExact(item)) {
            PyErr_SetString(PyExc_TypeError, "counts must be a list of 5 ints");
            return -1;
        }
        long long old = PyLong_AsLongLong(item), sum;
        if (old == -1 && PyErr_Occurred())
            return -1;
        if (__builtin_add_overflow(old, add[i], &sum)) {
            PyErr_SetString(PyExc_OverflowError, "a count does not fit in 64 bits");
            return -1;
        }
        PyObject *v = PyLong_FromLongLong(sum);
        if (v == NULL || PyList_SetItem(counts, i, v) < 0)
            return -1;
    }
    return 0;
}

/* The IP lists' verdict on a frame's addresses (keep: the list's callable, or None to keep all): 1 keep,
 * 0 drop (counted as filtered), -1 error. */
static int keep_frame(PyObject *keep, PyObject *src, PyObject *dst, long long *counts)
{
    if (keep == Py_None)
        return 1;
    PyObject *res = PyObject_CallFunctionObjArgs(keep, src, dst, NULL);
    if (res == NULL)
        return -1;
    int yes = PyObject_IsTrue(res);
    Py_DECREF(res);
    if (yes == 0)
        counts[C_FILTERED]++;
    return yes;
}

/* Handles one message the TCP stream step completed: m, a (bytes, ts, wirelen, ttl, rtt_ms) tuple (held). */
typedef int (*TcpMessageFn)(void *ctx, PyObject *m);

/* The TCP segment of frame f through the stream step. tcp is the Python step, tcp(ipv, (src, sport, dst, dport),
 * ts, wirelen, ttl, seq, flags, payload), which does what PacketDecoder._transport does before the messages (the
 * RST count and address event, the stream step) and returns the messages completed, as TcpReassembler.segment
 * returns them; or a (TcpReassembler, on_reset) pair (check_frame_args): on_reset(src, ipv) for a RST, then the
 * C step through its API, with no Python call. Each message goes to fn. */
static int tcp_segment(PyObject *tcp, const unsigned char *f, const Fast *x, PyObject *ipv, PyObject *src,
                       PyObject *sport, PyObject *dst, PyObject *dport, PyObject *ts, PyObject *wl, TcpMessageFn fn,
                       void *ctx)
{
    PyObject *payload = PyBytes_FromStringAndSize((const char *)f + x->dns, x->dns_len);
    PyObject *ttl = NULL, *flags = NULL, *seq = NULL, *key = NULL, *res = NULL, *messages = NULL;
    if (payload != NULL && PyTuple_Check(tcp)) {
        long long ts_ns = PyLong_AsLongLong(ts), wirelen = PyLong_AsLongLong(wl);
        int ok = !PyErr_Occurred();
        if (ok && (x->flags & 0x04)) { /* TCP_RST */
            res = PyObject_CallFunctionObjArgs(PyTuple_GET_ITEM(tcp, 1), src, ipv, NULL);
            ok = res != NULL;
        }
        if (ok && (messages = PyList_New(0)) != NULL
            && tcp_api->segment(PyTuple_GET_ITEM(tcp, 0), f + x->addr, f + x->addr + x->alen, x->alen, x->sport,
                                x->dport, ts_ns, wirelen, (long)x->ttl, x->seq, (long)x->flags, payload, messages) < 0)
            Py_CLEAR(messages);
    } else if (payload != NULL) {
        ttl = PyLong_FromLong(x->ttl), flags = PyLong_FromLong(x->flags), seq = PyLong_FromUnsignedLong(x->seq);
        key = PyTuple_Pack(4, src, sport, dst, dport);
        if (ttl != NULL && flags != NULL && seq != NULL && key != NULL) {
            PyObject *args[8] = {ipv, key, ts, wl, ttl, seq, flags, payload};
            res = PyObject_Vectorcall(tcp, args, 8, NULL);
            messages = res ? PySequence_Fast(res, "the TCP step must return a sequence") : NULL;
        }
    }
    int r = messages != NULL ? 0 : -1;
    for (Py_ssize_t i = 0; r == 0 && i < PySequence_Fast_GET_SIZE(messages); i++) {
        PyObject *m = PySequence_Fast_GET_ITEM(messages, i);
        if (!PyTuple_Check(m) || PyTuple_GET_SIZE(m) != 5 || !PyBytes_Check(PyTuple_GET_ITEM(m, 0))) {
            PyErr_SetString(PyExc_TypeError, "the TCP step must return (bytes, ts, wirelen, ttl, rtt_ms) tuples");
            r = -1;
            break;
        }
        Py_INCREF(m); /* (fn may run Python code) */
        r = fn(ctx, m) < 0 ? -1 : 0;
        Py_DECREF(m);
    }
    Py_XDECREF(ttl);
    Py_XDECREF(flags);
    Py_XDECREF(seq);
    Py_XDECREF(payload);
    Py_XDECREF(key);
    Py_XDECREF(res);
    Py_XDECREF(messages);
    return r;
}

/* The end of a frame loop's call: the C stream step's counts written to the stats object (once per call, not
 * per segment). result: the call's result, or NULL with an exception set (kept). */
static PyObject *tcp_done(PyObject *tcp, PyObject *result)
{
    if (PyTuple_Check(tcp) && tcp_api->write_stats(PyTuple_GET_ITEM(tcp, 0)) < 0)
        Py_CLEAR(result);
    return result;
}

static int frame_ok(PyObject *frame, const unsigned char *portmap, int tcp, Fast *x)
{
    return PyBytes_Check(frame)
           && classify((const unsigned char *)PyBytes_AS_STRING(frame), PyBytes_GET_SIZE(frame), portmap, tcp, x);
}

/* The end of a loop without an error: (i, j), with its counts added to counts_obj; NULL on error. */
static PyObject *loop_result(Py_ssize_t i, Py_ssize_t j, PyObject *counts_obj, const long long *counts)
{
    PyObject *result = Py_BuildValue("(nn)", i, j);
    if (result != NULL && add_counts(counts_obj, counts) < 0)
        Py_CLEAR(result);
    return result;
}

/* The step for one frame that classify accepted as x: its messages made, or the frame counted as filtered.
 * ts and wl: the frame's time and length objects (held); wirelen: the length's value; keep: the IP list of
 * its IP version. */
typedef int (*FrameStep)(void *ctx, PyObject *ts, PyObject *wl, long long wirelen, PyObject *frame, const Fast *x,
                         PyObject *keep, long long *counts);

/* The loop of decode_frames over the FrameBatch lists ts_obj, wl_obj and data_obj from frame `start` on: step
 * for each frame it handles until the first it does not; returns (i, j), that frame's index and the next
 * handled one's (the caller decodes frames i..j-1 in Python and calls again from j: messages stay in capture
 * order), with the counts added to counts_obj; NULL on error. */
static inline PyObject *frame_loop(PyObject *ts_obj, PyObject *wl_obj, PyObject *data_obj, Py_ssize_t start,
                                   const unsigned char *portmap, int do_tcp, PyObject *keep4, PyObject *keep6,
                                   PyObject *counts_obj, FrameStep step, void *ctx)
{
    PyObject *ts = NULL, *wl = NULL, *data = NULL, *result = NULL;
    long long counts[N_COUNTS] = {0};
    ts = PySequence_Fast(ts_obj, "ts_ns must be a sequence");
    wl = ts ? PySequence_Fast(wl_obj, "wirelen must be a sequence") : NULL;
    data = wl ? PySequence_Fast(data_obj, "data must be a sequence") : NULL;
    if (data == NULL)
        goto done;
    if (PySequence_Fast_GET_SIZE(ts) != PySequence_Fast_GET_SIZE(data)
        || PySequence_Fast_GET_SIZE(wl) != PySequence_Fast_GET_SIZE(data)) {
        PyErr_SetString(PyExc_ValueError, "ts_ns, wirelen and data differ in length");
        goto done;
    }
    /* The lengths are read again after each frame: keep4/keep6 and tcp are Python code. */
#define N_NOW()                                                                                            \
    Py_MIN(PySequence_Fast_GET_SIZE(data), Py_MIN(PySequence_Fast_GET_SIZE(ts), PySequence_Fast_GET_SIZE(wl)))
    Py_ssize_t i = start < 0 ? 0 : start;
    Fast x;
    for (; i < N_NOW(); i++) {
        PyObject *frame = PySequence_Fast_GET_ITEM(data, i);
        if (!frame_ok(frame, portmap, do_tcp, &x))
            break;
        PyObject *w = PySequence_Fast_GET_ITEM(wl, i), *t = PySequence_Fast_GET_ITEM(ts, i);
        /* Held before the conversion: a wirelen's __index__ is Python code that may empty the lists. */
        Py_INCREF(frame);
        Py_INCREF(w);
        Py_INCREF(t);
        long long wirelen = PyLong_AsLongLong(w);
        int bad = wirelen == -1 && PyErr_Occurred();
        if (!bad)
            bad = step(ctx, t, w, wirelen, frame, &x, x.ipv == 4 ? keep4 : keep6, counts) < 0;
        Py_DECREF(frame);
        Py_DECREF(w);
        Py_DECREF(t);
        if (bad)
            goto done;
        counts[C_BYTES] += wirelen;
    }
    Py_ssize_t j = i;
    while (j < N_NOW() && !frame_ok(PySequence_Fast_GET_ITEM(data, j), portmap, do_tcp, &x))
        j++;
#undef N_NOW
    result = loop_result(i, j, counts_obj, counts);
done:
    Py_XDECREF(ts);
    Py_XDECREF(wl);
    Py_XDECREF(data);
    return result;
}

#endif
