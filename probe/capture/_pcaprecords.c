/* probe.capture._pcaprecords: split classic pcap records out of a buffer, in C (its Python reference:
 * split_records in probe/capture/pcapfile.py).
 *
 * Why: the Python loop over record headers (unpack, checks, three list appends, a slice) was a large part
 * of the pipeline once decoding and record building were in C. This
 * does the same per record and leaves file handling, buffering and errors to probe/capture/pcapfile.py,
 * whose Python loop stays as the reference the tests compare this with.
 *
 * split_packed(buf, pos, big_endian, ts_mult, limit, frames) -> (pos, status)
 *   Adds up to `limit` records that lie entirely in buf[pos:] to a probe._records.Frames (FrameBatch.packed;
 *   timestamp in ns = seconds * 1e9 + fraction * ts_mult; original length; captured bytes): the frames point
 *   into buf (a bytes object the Frames then keeps), so no object is made per record. Returns the position
 *   after them with status 0 (stopped: limit reached or the next record is not complete in buf) or 1 (the
 *   record header at the returned position announces an impossible captured or original length). Available
 *   where probe._records is built (else the reader splits into its lists with the Python reference).
 *
 * split_packed(buf, pos, big_endian, ts_mult, limit, frames, linktype, k, n) -> (pos, status, taken, last_ts)
 *   With a share (`dnsprobe read --workers n`, worker k): up to `limit` records are taken as above, but only those
 *   whose flow_hash (include/wire.h) modulo n is k go into frames, the frames _decoderec.select_share would keep.
 *   taken counts every record taken and last_ts is the last one's time (0 when none): the worker's capture clock
 *   runs on all of them. Selecting here spares a worker the layout of the frames it skips.
 *
 * data_frames(buf, pos, limit, max_data) -> (end, count)
 *   The Frame Streams reader's scan for whole data frames, which are split the same way (a length, then the
 *   frame): its reference is data_frames_python in probe/capture/fstrm.py; no object is made per frame.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "records.h"
#include "wire.h"

/* Largest captured length accepted, as the Python reader (and libpcap's 256 KiB maximum snaplen). */
#define MAX_CAPLEN 0x40000u
/* Largest original length accepted, as the Python reader: lengths are int32 columns downstream. */
#define MAX_WIRELEN 0x7FFFFFFFu

static uint32_t get32(const unsigned char *p, int big)
{
    if (big)
        return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
    return ((uint32_t)p[3] << 24) | ((uint32_t)p[2] << 16) | ((uint32_t)p[1] << 8) | p[0];
}

/* One record header at h (16 bytes): 0 and its fields, or 1 when it announces impossible lengths. */
static int record_header(const unsigned char *h, int big, long long ts_mult, long long *ts, uint32_t *caplen,
                         uint32_t *wirelen)
{
    uint32_t sec = get32(h, big), frac = get32(h + 4, big);
    *caplen = get32(h + 8, big);
    *wirelen = get32(h + 12, big);
    if (*caplen > MAX_CAPLEN || (uint64_t)*caplen > (uint64_t)*wirelen + MAX_CAPLEN || *wirelen > MAX_WIRELEN)
        return 1;
    *ts = (long long)sec * 1000000000LL + (long long)frac * ts_mult;
    return 0;
}

static PyObject *split_packed(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *buf_obj;
    Frames *frames;
    Py_ssize_t pos, limit, k = 0, n = 0;
    int big, linktype = 0;
    long long ts_mult;
    if (records == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "split_packed needs probe._records, which is not built");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O!npLnO!|inn:split_packed", &PyBytes_Type, &buf_obj, &pos, &big, &ts_mult, &limit,
                          records->frames_type, &frames, &linktype, &k, &n))
        return NULL;
    int shared = PyTuple_GET_SIZE(args) > 6;
    if (shared && (n < 1 || k < 0 || k >= n)) {
        PyErr_SetString(PyExc_ValueError, "split_packed: worker k of n with 0 <= k < n");
        return NULL;
    }
    const unsigned char *buf = (const unsigned char *)PyBytes_AS_STRING(buf_obj);
    Py_ssize_t end = PyBytes_GET_SIZE(buf_obj);
    int status = 0;
    if (pos < 0 || pos > end) {
        PyErr_SetString(PyExc_ValueError, "position outside the buffer");
        return NULL;
    }
    if (limit > 0 && pos + 16 <= end && records->frames_own(frames, buf_obj) < 0)
        return NULL;
    Py_ssize_t done = 0;
    long long last_ts = 0;
    for (; done < limit && pos + 16 <= end; done++) {
        long long ts;
        uint32_t caplen, wirelen;
        if (record_header(buf + pos, big, ts_mult, &ts, &caplen, &wirelen)) {
            status = 1;
            break;
        }
        if (pos + 16 + (Py_ssize_t)caplen > end)
            break;
        const unsigned char *f = buf + pos + 16;
        if ((!shared || (Py_ssize_t)(flow_hash(f, caplen, linktype) % (uint32_t)n) == k)
            && records->frames_add(frames, f, caplen, wirelen, ts, 0) < 0)
            return NULL;
        last_ts = ts;
        pos += 16 + caplen;
    }
    if (shared)
        return Py_BuildValue("(ninL)", pos, status, done, last_ts);
    return Py_BuildValue("(ni)", pos, status);
}

/* fstrm.data_frames_python in C (see there). */
static PyObject *data_frames(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer view;
    Py_ssize_t pos, limit, max_data, count = 0;
    if (!PyArg_ParseTuple(args, "y*nnn:data_frames", &view, &pos, &limit, &max_data))
        return NULL;
    const uint8_t *buf = view.buf;
    Py_ssize_t end = view.len;
    if (pos < 0)
        pos = 0;
    while (count < limit && end - pos >= 4) {
        uint32_t n = (uint32_t)buf[pos] << 24 | (uint32_t)buf[pos + 1] << 16 | (uint32_t)buf[pos + 2] << 8 | buf[pos + 3];
        if (n == 0 || n > (uint64_t)max_data || (uint64_t)(end - pos - 4) < n)
            break;
        pos += 4 + (Py_ssize_t)n;
        count++;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(nn)", pos, count);
}

static PyMethodDef methods[] = {
    {"split_packed", split_packed, METH_VARARGS,
     "split_packed(buf, pos, big_endian, ts_mult, limit, frames[, linktype, k, n]) -> (pos, status[, taken, last_ts]): "
     "split into a probe._records.Frames (with a share: worker k of n's frames only)"},
    {"data_frames", data_frames, METH_VARARGS,
     "data_frames(buf, pos, limit, max_data) -> (end, count): the whole Frame Streams data frames from pos on (see "
     "probe.capture.fstrm.data_frames_python)."},
    {NULL, NULL, 0, NULL},
};

PyMODINIT_FUNC PyInit__pcaprecords(void)
{
    /* split_packed needs probe._records; data_frames does not. */
    if (records_import() < 0)
        PyErr_Clear();
    return ext_module("probe.capture._pcaprecords", NULL, methods, NULL, NULL, NULL);
}
