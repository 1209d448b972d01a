/* probe.capture._ring: read the ready blocks of a TPACKET_V3 receive ring into packed frames, in C.
 *
 * Why: AfPacketSource.read (probe/capture/afpacket.py) walked every frame of a block in Python (a struct unpack,
 * a bytes slice, a bignum timestamp: about a fifth of a live worker's time once the rest of the path was in C).
 * This does the same walk and gives the frames as a probe._records.Frames (FrameBatch.packed) pointing into a
 * copy of each block, so that no object is made per frame. AfPacketSource.read stays the reference (and the
 * path where this is not built); tests/capture/test_ring.py compares the two on blocks laid out as the kernel
 * lays them out.
 *
 * read_blocks(ring, next_block, block_size, block_count, max_frames, frames) -> (next_block, last_seq, n)
 *   ring: the mapped ring (any writable buffer at a multiple of 4; block_size one too, else ValueError). From
 *   block next_block on, while the block is handed to user space (TP_STATUS_USER) and fewer than max_frames
 *   frames were taken: copy the block out in one piece, give it back to the kernel at once (TP_STATUS_KERNEL),
 *   and add its frames to `frames` (timestamp tp_sec * 1e9 + tp_nsec, wire length tp_len, the snaplen bytes at
 *   tp_mac; a VLAN tag the kernel took off, TP_STATUS_VLAN_VALID, given as TPID << 16 | TCI with TPID 0x8100
 *   unless TP_STATUS_VLAN_TPID_VALID gives another). Returns the next block to read, the sequence number of the
 *   last block read (0: none) and the frames added.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <linux/if_packet.h>
#include <stdint.h>
#include <string.h>

#include "records.h"

/* TP_STATUS_KERNEL, TP_STATUS_USER, TP_STATUS_VLAN_VALID, TP_STATUS_VLAN_TPID_VALID: <linux/if_packet.h> */

/* struct tpacket_block_desc / tpacket_hdr_v1 (offsets from the block's start) and struct tpacket3_hdr. */
enum { BLOCK_STATUS = 8, BLOCK_NUM_PKTS = 12, BLOCK_FIRST = 16, BLOCK_LEN = 20, BLOCK_SEQ = 24 };
enum { F_NEXT = 0, F_SEC = 4, F_NSEC = 8, F_SNAPLEN = 12, F_LEN = 16, F_STATUS = 20, F_MAC = 24, F_TCI = 32,
       F_TPID = 36, FRAME_HDR = 38 };

static inline uint32_t le32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline uint16_t le16(const unsigned char *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* The frames of one copied block, added to f; -1 with an exception. A frame whose header or bytes would lie
 * outside the block is not taken, and a next offset shorter than a frame header ends the walk (the kernel
 * writes neither; the walk stops rather than read past the block or the same frame again). */
static int add_block(Frames *f, PyObject *copy, uint32_t num, uint32_t first, Py_ssize_t *added)
{
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(copy);
    Py_ssize_t len = PyBytes_GET_SIZE(copy), pos = first;
    if (num && records->frames_own(f, copy) < 0)
        return -1;
    for (uint32_t k = 0; k < num; k++) {
        if (pos < 0 || pos + FRAME_HDR > len)
            break;
        const unsigned char *h = b + pos;
        uint32_t snaplen = le32(h + F_SNAPLEN), status = le32(h + F_STATUS);
        uint16_t mac = le16(h + F_MAC);
        if (pos + mac + (Py_ssize_t)snaplen > len)
            break;
        uint32_t tag = 0;
        if (status & TP_STATUS_VLAN_VALID) {
            uint16_t tpid = le16(h + F_TPID);
            tag = ((uint32_t)(status & TP_STATUS_VLAN_TPID_VALID && tpid ? tpid : 0x8100) << 16) | le16(h + F_TCI);
        }
        int64_t ts = (int64_t)le32(h + F_SEC) * 1000000000LL + le32(h + F_NSEC);
        if (records->frames_add(f, h + mac, snaplen, le32(h + F_LEN), ts, tag) < 0)
            return -1;
        (*added)++;
        /* The kernel's next offset is a whole frame (header and bytes, aligned): one shorter would read the same
         * bytes again, as often as a damaged count says (2^32 - 1 times: memory without end). */
        uint32_t next = le32(h + F_NEXT);
        if (next < FRAME_HDR)
            break;
        pos += next;
    }
    return 0;
}

static PyObject *read_blocks(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *ring_obj;
    Frames *frames;
    Py_ssize_t next, block_size, block_count, max_frames;
    if (!PyArg_ParseTuple(args, "OnnnnO!:read_blocks", &ring_obj, &next, &block_size, &block_count, &max_frames,
                          records->frames_type, &frames))
        return NULL;
    Py_buffer ring;
    if (PyObject_GetBuffer(ring_obj, &ring, PyBUF_WRITABLE) < 0)
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t ring_size;
    if (block_size < 32 || block_count < 1 || __builtin_mul_overflow(block_size, block_count, &ring_size) ||
        ring_size > ring.len || next < 0 || next >= block_count) {
        PyErr_SetString(PyExc_ValueError, "read_blocks: the ring is not block_count blocks of block_size bytes");
        goto done;
    }
    /* Each block's status word is read and written atomically: it must be aligned. The kernel's blocks are whole
     * pages in a mapping (AfPacketSource checks capture.block_size), so this only refuses a size or buffer no ring
     * has. */
    if (block_size % 4 || (uintptr_t)ring.buf % 4) {
        PyErr_SetString(PyExc_ValueError, "read_blocks: block_size and the ring's address must be multiples of 4");
        goto done;
    }
    unsigned long long last_seq = 0;
    Py_ssize_t added = 0;
    while (added < max_frames) {
        unsigned char *blk = (unsigned char *)ring.buf + next * block_size;
        uint32_t *status = (uint32_t *)(blk + BLOCK_STATUS);
        if (!(__atomic_load_n(status, __ATOMIC_ACQUIRE) & TP_STATUS_USER))
            break;
        uint32_t num = le32(blk + BLOCK_NUM_PKTS), first = le32(blk + BLOCK_FIRST), blen = le32(blk + BLOCK_LEN);
        memcpy(&last_seq, blk + BLOCK_SEQ, 8);
        if (!(first <= blen && blen <= block_size))
            blen = (uint32_t)block_size;
        /* One copy; the block goes back to the kernel at once. */
        PyObject *copy = PyBytes_FromStringAndSize((const char *)blk, blen);
        if (copy == NULL)
            goto done;
        __atomic_store_n(status, TP_STATUS_KERNEL, __ATOMIC_RELEASE);
        next = (next + 1) % block_count;
        int rc = add_block(frames, copy, num, first, &added);
        Py_DECREF(copy);
        if (rc < 0)
            goto done;
    }
    result = Py_BuildValue("(nKn)", next, last_seq, added);
done:
    PyBuffer_Release(&ring);
    return result;
}

static PyMethodDef methods[] = {
    {"read_blocks", read_blocks, METH_VARARGS,
     "read_blocks(ring, next_block, block_size, block_count, max_frames, frames) -> (next_block, last_seq, n): "
     "the ready blocks of a TPACKET_V3 ring as packed frames (AfPacketSource.read in C)."},
    {NULL, NULL, 0, NULL},
};

PyMODINIT_FUNC PyInit__ring(void)
{
    return records_import() < 0 ? NULL : ext_module("probe.capture._ring", NULL, methods, NULL, NULL, NULL);
}
