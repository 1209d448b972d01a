/* export.parquet._answers: the answers column (export/parquet/answers.py) from a binary column of response
 * messages, in one pass: every RR of the answer, authority and additional sections as (section, owner name, type,
 * class, TTL, RDATA in presentation format), OPT left out.
 *
 * Why: walking each record and formatting its RDATA in Python cost several times the rest of `dnsprobe read`
 * (docs/performance.md). answers.py is the twin and the reference (it is compared with dnspython's text):
 * its tables (RDATA_LAYOUTS, TYPE_NAMES, SECTIONS) are given to Walker, so the layouts are declared once, and
 * tests/export/test_answers.py and fuzz/fuzz_answers.py compare the two column for column. The walk and its
 * failures are the twin's: a name as probe/decode/dnswire.py reads it (backward pointers only, 255 bytes), RDATA
 * that does not fit its layout in RFC 3597's form, a damaged message's records up to the damage.
 *
 * Walker(layouts, type_names, sections, caps): layouts, {type: (item, ...)} with answers.py's items; type_names,
 *   {type: mnemonic}; sections, the three section names; caps, (record base, record per byte, message base,
 *   message per byte), answers.py's text caps (a record's RDATA text, a message's names and RDATA text).
 * Walker.column(length, offset, buffers) -> (null_count, validity, list offsets, section, name, type, class,
 *   ttl, data, records, capped): the list column's buffers and its struct's fields (strings as (offsets, data),
 *   numbers as their data), for the binary column's buffers (strcolumn.h; a null message: a null list); capped,
 *   the records the caps changed.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "extmodule.h"
#include "valuetext.h"
#include "strcolumn.h"
#include "wire.h"

typedef enum { I_NAME, I_U8, I_U16, I_U32, I_TIME, I_IP4, I_IP6, I_TYPE, I_STR, I_STRS, I_HEX, I_B64, I_SALT,
               I_HASH, I_BITMAP, I_TAG, I_QUOTED, I_END } Item;

static const struct {
    const char *name;
    Item item;
} ITEMS[] = {
    {"N", I_NAME}, {"B", I_U8}, {"H", I_U16}, {"I", I_U32}, {"E", I_TIME}, {"4", I_IP4}, {"16", I_IP6},
    {"T", I_TYPE}, {"S", I_STR}, {"S*", I_STRS}, {"X", I_HEX}, {"B64", I_B64}, {"SALT", I_SALT},
    {"HASH", I_HASH}, {"BITMAP", I_BITMAP}, {"TAG", I_TAG}, {"Q*", I_QUOTED},
};
#define N_ITEMS ((int)(sizeof ITEMS / sizeof ITEMS[0]))
#define MAX_LAYOUT 16

typedef struct {
    uint16_t type;
    Item items[MAX_LAYOUT + 1]; /* ended by I_END */
} Layout;

typedef struct {
    uint16_t type;
    char *name;
} TypeName;

/* A growable byte buffer. */
typedef struct {
    char *p;
    size_t len, cap;
} Buf;

static inline int put(Buf *b, const void *s, size_t n)
{
    if (b->len + n > b->cap) {
        char *p = ext_grow(b->p, &b->cap, b->len + n, 1, 256);
        if (p == NULL)
            return -1;
        b->p = p;
    }
    if (n)
        memcpy(b->p + b->len, s, n);
    b->len += n;
    return 0;
}

static inline int put_char(Buf *b, char c)
{
    return put(b, &c, 1);
}

static int put_uint(Buf *b, unsigned long long v)
{
    char text[24];
    int n = snprintf(text, sizeof text, "%llu", v);
    return put(b, text, (size_t)n);
}

/* A string column of unknown length: int32 offsets (the first 0) and the text. */
typedef struct {
    Buf offsets, data;
} StrCol;

static int strcol_end(StrCol *c)
{
    if (c->data.len > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "answers column data over 2 GiB");
        return -1;
    }
    int32_t end = (int32_t)c->data.len;
    return put(&c->offsets, &end, 4);
}

typedef struct {
    PyObject_HEAD
    Layout *layouts;
    Py_ssize_t n_layouts;
    TypeName *names;
    Py_ssize_t n_names;
    char *sections[3];
    /* The caps (answers.py): a record's RDATA text at most record_base + record_per_byte * RDLENGTH bytes, a
     * message's owner names and RDATA texts at most message_base + message_per_byte * its length. */
    Py_ssize_t record_base, record_per_byte, message_base, message_per_byte;
} Walker;

/* ---- Reading: each returns the offset after what it read, or -1 when the message does not hold it ---- */

static const char NAME_SPECIAL[] = "\"().;\\@$";

/* A label byte as a name's presentation writes it (answers.py _NAME_ESC). */
static int put_label_byte(Buf *b, unsigned char c)
{
    if (c > 0x20 && c < 0x7f && c != '.' && strchr(NAME_SPECIAL, c) == NULL)
        return put_char(b, (char)c);
    if (c == '.' || (c != 0 && strchr(NAME_SPECIAL, c) != NULL)) {
        char esc[2] = {'\\', (char)c};
        return put(b, esc, 2);
    }
    char esc[5] = {'\\', (char)('0' + c / 100), (char)('0' + c / 10 % 10), (char)('0' + c % 10), 0};
    return put(b, esc, 4);
}

/* The name at off (dnswire.read_name) in presentation format (answers.name_text) into b (NULL: only read).
 * -2: no memory. */
static Py_ssize_t read_name(const unsigned char *m, Py_ssize_t len, Py_ssize_t off, Buf *b)
{
    NameLabels name;
    if (name_labels(m, len, &off, &name) != OK)
        return -1;
    if (b == NULL)
        return off;
    for (int i = 0; i < name.count; i++) {
        const unsigned char *label = m + name.at[i];
        for (unsigned k = 1; k <= label[0]; k++) {
            if (put_label_byte(b, label[k]) < 0)
                return -2;
        }
        if (put_char(b, '.') < 0)
            return -2;
    }
    if (name.count == 0 && put_char(b, '.') < 0)
        return -2;
    return off;
}

/* ---- RDATA ---- */

static const char *type_name(const Walker *w, unsigned type)
{
    Py_ssize_t lo = 0, hi = w->n_names;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (w->names[mid].type < type)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < w->n_names && w->names[lo].type == type ? w->names[lo].name : NULL;
}

static int put_type(Buf *b, const Walker *w, unsigned type)
{
    const char *name = type_name(w, type);
    if (name != NULL)
        return put(b, name, strlen(name));
    return put(b, "TYPE", 4) < 0 ? -1 : put_uint(b, type);
}

static int put_hex(Buf *b, const unsigned char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    for (size_t k = 0; k < n; k++) {
        char two[2] = {hex[s[k] >> 4], hex[s[k] & 15]};
        if (put(b, two, 2) < 0)
            return -1;
    }
    return 0;
}

/* A character-string's text, quoted (answers._quoted). */
static int put_quoted(Buf *b, const unsigned char *s, size_t n)
{
    if (put_char(b, '"') < 0)
        return -1;
    for (size_t k = 0; k < n; k++) {
        unsigned char c = s[k];
        int rc;
        if (c == '"' || c == '\\') {
            char esc[2] = {'\\', (char)c};
            rc = put(b, esc, 2);
        } else if (c >= 0x20 && c < 0x7f) {
            rc = put_char(b, (char)c);
        } else {
            char esc[4] = {'\\', (char)('0' + c / 100), (char)('0' + c / 10 % 10), (char)('0' + c % 10)};
            rc = put(b, esc, 4);
        }
        if (rc < 0)
            return -1;
    }
    return put_char(b, '"');
}

static int put_base64(Buf *b, const unsigned char *s, size_t n)
{
    static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t k = 0; k < n; k += 3) {
        uint32_t v = (uint32_t)s[k] << 16 | (k + 1 < n ? (uint32_t)s[k + 1] << 8 : 0) | (k + 2 < n ? s[k + 2] : 0);
        char four[4] = {alphabet[v >> 18 & 63], alphabet[v >> 12 & 63], k + 1 < n ? alphabet[v >> 6 & 63] : '=',
                        k + 2 < n ? alphabet[v & 63] : '='};
        if (put(b, four, 4) < 0)
            return -1;
    }
    return 0;
}

/* Base 32 with the extended hex alphabet, lower case, without padding (NSEC3's next hashed owner). */
static int put_base32hex(Buf *b, const unsigned char *s, size_t n)
{
    static const char alphabet[] = "0123456789abcdefghijklmnopqrstuv";
    uint64_t acc = 0;
    int bits = 0;
    for (size_t k = 0; k < n; k++) {
        acc = acc << 8 | s[k];
        bits += 8;
        while (bits >= 5) {
            bits -= 5;
            if (put_char(b, alphabet[acc >> bits & 31]) < 0)
                return -1;
        }
    }
    if (bits > 0)
        return put_char(b, alphabet[acc << (5 - bits) & 31]);
    return 0;
}

/* NSEC/NSEC3 type bitmaps (answers._bitmap); 1: malformed. */
static int put_bitmap(Buf *b, const Walker *w, const unsigned char *s, size_t n)
{
    size_t pos = 0;
    int first = 1;
    while (pos < n) {
        if (pos + 2 > n)
            return 1;
        unsigned window = s[pos], length = s[pos + 1];
        if (length < 1 || length > 32 || pos + 2 + length > n)
            return 1;
        for (unsigned i = 0; i < length; i++) {
            for (unsigned bit = 0; bit < 8; bit++) {
                if (!(s[pos + 2 + i] & (0x80 >> bit)))
                    continue;
                if ((!first && put_char(b, ' ') < 0) || put_type(b, w, window * 256 + i * 8 + bit) < 0)
                    return -1;
                first = 0;
            }
        }
        pos += 2 + length;
    }
    return 0;
}

/* One layout item at m[pos..end) into b (nothing written for an empty part). Returns the next position, -1 when
 * the RDATA does not fit (the twin's Malformed, IndexError, ...), -2 with an exception (no memory). */
static Py_ssize_t put_item(Buf *b, const Walker *w, Item item, const unsigned char *m, Py_ssize_t len, Py_ssize_t pos,
                           Py_ssize_t end)
{
#define PUT(x)                                                                                                 \
    if ((x) < 0)                                                                                               \
        return -2;
    Py_ssize_t n;
    switch (item) {
    case I_NAME:
        return read_name(m, len, pos, b);
    case I_U8:
        if (pos >= len)
            return -1;
        PUT(put_uint(b, m[pos]));
        return pos + 1;
    case I_U16:
    case I_TYPE:
        if (pos + 2 > len)
            return -1;
        PUT(item == I_U16 ? put_uint(b, rd16(m + pos)) : put_type(b, w, rd16(m + pos)));
        return pos + 2;
    case I_U32:
    case I_TIME: {
        if (pos + 4 > len)
            return -1;
        uint32_t v = rd32(m + pos);
        if (item == I_U32) {
            PUT(put_uint(b, v));
        } else {
            time_t t = (time_t)v;
            struct tm tm;
            char text[32];
            if (gmtime_r(&t, &tm) == NULL)
                return -1;
            size_t k = strftime(text, sizeof text, "%Y%m%d%H%M%S", &tm);
            PUT(put(b, text, k));
        }
        return pos + 4;
    }
    case I_IP4:
    case I_IP6: {
        Py_ssize_t size = item == I_IP4 ? 4 : 16;
        char text[64];
        if (pos + size > len)
            return -1;
        n = item == I_IP4 ? ipv4_text(m + pos, text) : ipv6_text(m + pos, text);
        PUT(put(b, text, (size_t)n));
        return pos + size;
    }
    case I_STR:
    case I_TAG:
    case I_SALT:
    case I_HASH: {
        if (pos >= len)
            return -1;
        n = m[pos];
        if (pos + 1 + n > len)
            return -1;
        const unsigned char *s = m + pos + 1;
        if (item == I_STR) {
            PUT(put_quoted(b, s, (size_t)n));
        } else if (item == I_TAG) {
            if (n == 0)
                return -1;
            for (Py_ssize_t k = 0; k < n; k++) {
                unsigned char c = s[k];
                if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')))
                    return -1;
            }
            PUT(put(b, s, (size_t)n));
        } else if (item == I_SALT) {
            PUT(n ? put_hex(b, s, (size_t)n) : put_char(b, '-'));
        } else {
            PUT(put_base32hex(b, s, (size_t)n));
        }
        return pos + 1 + n;
    }
    case I_STRS:
        for (int first = 1; pos < end; first = 0) {
            if (!first)
                PUT(put_char(b, ' '));
            pos = put_item(b, w, I_STR, m, len, pos, end);
            if (pos < 0)
                return pos;
        }
        return pos;
    default:
        break;
    }
    /* The rest of the RDATA (empty when an item before ran past its end: the check after it then refuses it). */
    const unsigned char *rest = m + pos;
    size_t size = pos < end ? (size_t)(end - pos) : 0;
    int rc;
    switch (item) {
    case I_HEX: PUT(put_hex(b, rest, size)); break;
    case I_B64: PUT(put_base64(b, rest, size)); break;
    case I_QUOTED: PUT(put_quoted(b, rest, size)); break;
    case I_BITMAP:
        rc = put_bitmap(b, w, rest, size);
        if (rc != 0)
            return rc < 0 ? -2 : -1;
        break;
    default:
        PyErr_SetString(PyExc_SystemError, "unknown layout item");
        return -2;
    }
#undef PUT
    return end;
}

/* RDATA m[start..end) of the given type in presentation format into b (answers.rdata_text): 0, 1 when the text was
 * over the record cap (then RFC 3597's form), -1: no memory. */
static int put_rdata(Buf *b, const Walker *w, unsigned type, const unsigned char *m, Py_ssize_t len,
                     Py_ssize_t start, Py_ssize_t end)
{
    size_t mark = b->len;
    int over = 0;
    const Layout *layout = NULL;
    for (Py_ssize_t lo = 0, hi = w->n_layouts; lo < hi;) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (w->layouts[mid].type < type) {
            lo = mid + 1;
        } else {
            hi = mid;
            if (w->layouts[mid].type == type)
                layout = &w->layouts[mid];
        }
    }
    if (layout != NULL) {
        Py_ssize_t pos = start;
        for (const Item *item = layout->items; *item != I_END && pos >= 0; item++) {
            size_t before = b->len;
            if (before > mark && put_char(b, ' ') < 0) /* (a separator, taken back below if the part is empty) */
                return -1;
            pos = put_item(b, w, *item, m, len, pos, end);
            if (pos == -2)
                return -1;
            if (b->len == before + (before > mark)) /* an empty part adds nothing, not even its space */
                b->len = before;
            if (pos > end)
                pos = -1;
        }
        over = pos == end && b->len - mark > (size_t)(w->record_base + w->record_per_byte * (end - start));
        if (pos == end && !over)
            return 0;
        b->len = mark; /* it does not fit, or its text is over the cap: RFC 3597's form */
    }
    if (put(b, "\\# ", 3) < 0 || put_uint(b, (unsigned long long)(end - start)) < 0)
        return -1;
    if (end > start && (put_char(b, ' ') < 0 || put_hex(b, m + start, (size_t)(end - start)) < 0))
        return -1;
    return over;
}

/* ---- The column ---- */

typedef struct {
    Buf list_offsets;
    StrCol section, name, data;
    Buf type, klass, ttl;
    Py_ssize_t records, capped;
} Out;

static void out_free(Out *o)
{
    Buf *bufs[] = {&o->list_offsets, &o->section.offsets, &o->section.data, &o->name.offsets, &o->name.data,
                   &o->data.offsets, &o->data.data, &o->type, &o->klass, &o->ttl};
    for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++)
        PyMem_Free(bufs[k]->p);
}

/* One record into o: its owner name (in owner) and RDATA text unless the message's text is over its cap (*room
 * left: then the name and text are empty, and *room -1 for the records after it). -1: no memory. */
static int put_record(const Walker *w, const unsigned char *m, Py_ssize_t len, Out *o, const Buf *owner, int section,
                      Py_ssize_t start, Py_ssize_t end, Py_ssize_t *room)
{
    const unsigned char *rr = m + start - 10;
    unsigned type = rd16(rr);
    int32_t t = (int32_t)type, c = (int32_t)rd16(rr + 2);
    int64_t ttl = rd32(rr + 4);
    size_t mark = o->data.data.len;
    /* (past the message's cap the text is not made: it would be dropped) */
    int capped = *room < 0 ? 0 : put_rdata(&o->data.data, w, type, m, len, start, end);
    if (capped < 0)
        return -1;
    Py_ssize_t text = (Py_ssize_t)(owner->len + o->data.data.len - mark);
    int blank = *room < text;
    if (blank) {
        o->data.data.len = mark;
        *room = -1;
    } else {
        *room -= text;
    }
    const char *s = w->sections[section];
    if (put(&o->section.data, s, strlen(s)) < 0 || strcol_end(&o->section) < 0 ||
        put(&o->name.data, owner->p, blank ? 0 : owner->len) < 0 || strcol_end(&o->name) < 0 ||
        strcol_end(&o->data) < 0 || put(&o->type, &t, 4) < 0 || put(&o->klass, &c, 4) < 0 ||
        put(&o->ttl, &ttl, 8) < 0)
        return -1;
    o->records++;
    o->capped += capped || blank;
    return 0;
}

/* Every record of message m into o (answers.message_records); -1: no memory. */
static int message_records(const Walker *w, const unsigned char *m, Py_ssize_t len, Out *o, Buf *owner)
{
    if (len < 12)
        return 0;
    unsigned counts[4];
    for (int k = 0; k < 4; k++)
        counts[k] = rd16(m + 4 + 2 * k);
    Py_ssize_t off = 12, room = w->message_base + w->message_per_byte * len;
    if (skip_questions(m, len, &off, counts[0]) != OK)
        return 0;
    for (int section = 0; section < 3; section++) {
        for (unsigned k = 0; k < counts[section + 1]; k++) {
            owner->len = 0;
            off = read_name(m, len, off, room < 0 ? NULL : owner); /* (past the cap the name is not written) */
            if (off == -2)
                return -1;
            if (off < 0 || off + 10 > len)
                return 0;
            Py_ssize_t start = off + 10;
            off = start + rd16(m + off + 8);
            if (off > len)
                return 0;
            if (rd16(m + start - 10) != TYPE_OPT && put_record(w, m, len, o, owner, section, start, off, &room) < 0)
                return -1;
        }
    }
    return 0;
}

static PyObject *bytes_of(const Buf *b)
{
    return PyBytes_FromStringAndSize(b->p ? b->p : "", (Py_ssize_t)b->len);
}

static PyObject *walker_column(Walker *w, PyObject *args)
{
    Py_ssize_t n, offset;
    PyObject *buffers;
    if (!PyArg_ParseTuple(args, "nnO:column", &n, &offset, &buffers))
        return NULL;
    if (w->layouts == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Walker not initialised");
        return NULL;
    }
    TextIn in;
    if (textin_open(&in, n, offset, buffers) < 0)
        return NULL;
    Out o;
    memset(&o, 0, sizeof o);
    Buf owner = {0};
    PyObject *result = NULL, *validity = NULL;
    Py_ssize_t nulls = 0;
    int32_t zero = 0;
    if (put(&o.list_offsets, &zero, 4) < 0 || put(&o.section.offsets, &zero, 4) < 0 ||
        put(&o.name.offsets, &zero, 4) < 0 || put(&o.data.offsets, &zero, 4) < 0)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *s;
        Py_ssize_t len;
        int got = textin_get(&in, i, &s, &len);
        if (got < 0)
            goto done;
        if (got == 0) {
            if (validity == NULL) {
                validity = PyBytes_FromStringAndSize(NULL, (n + 7) / 8);
                if (validity == NULL)
                    goto done;
                memset(PyBytes_AS_STRING(validity), 0xff, (size_t)(n + 7) / 8);
            }
            PyBytes_AS_STRING(validity)[i >> 3] &= (char)~(1 << (i & 7));
            nulls++;
        } else if (message_records(w, (const unsigned char *)s, len, &o, &owner) < 0) {
            goto done;
        }
        if (o.records > INT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "over 2**31 answers in one batch");
            goto done;
        }
        int32_t end = (int32_t)o.records;
        if (put(&o.list_offsets, &end, 4) < 0)
            goto done;
    }
    result = Py_BuildValue("(nONNNNNNNNNNnn)", nulls, validity ? validity : Py_None, bytes_of(&o.list_offsets),
                           bytes_of(&o.section.offsets), bytes_of(&o.section.data), bytes_of(&o.name.offsets),
                           bytes_of(&o.name.data), bytes_of(&o.type), bytes_of(&o.klass), bytes_of(&o.ttl),
                           bytes_of(&o.data.offsets), bytes_of(&o.data.data), o.records, o.capped);
done:
    Py_XDECREF(validity);
    out_free(&o);
    PyMem_Free(owner.p);
    textin_close(&in);
    return result;
}

/* ---- The tables ---- */

static void walker_free(Walker *w)
{
    PyMem_Free(w->layouts);
    for (Py_ssize_t k = 0; k < w->n_names; k++)
        PyMem_Free(w->names[k].name);
    PyMem_Free(w->names);
    for (int k = 0; k < 3; k++) {
        PyMem_Free(w->sections[k]);
        w->sections[k] = NULL;
    }
    w->layouts = NULL;
    w->names = NULL;
    w->n_layouts = w->n_names = 0;
}

static char *copy_text(PyObject *s)
{
    Py_ssize_t n;
    const char *u = PyUnicode_Check(s) ? PyUnicode_AsUTF8AndSize(s, &n) : NULL;
    if (u == NULL) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_TypeError, "a str is expected, not %R", s);
        return NULL;
    }
    char *p = PyMem_Malloc((size_t)n + 1);
    if (p == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    memcpy(p, u, (size_t)n + 1);
    return p;
}

static int by_type(const void *a, const void *b)
{
    return (int)*(const uint16_t *)a - (int)*(const uint16_t *)b; /* (type is the first member of both) */
}

static int read_type(PyObject *key, uint16_t *type)
{
    long v = PyLong_Check(key) ? PyLong_AsLong(key) : -1;
    if (v < 0 || v > 65535) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "%R is not an RR type", key);
        return -1;
    }
    *type = (uint16_t)v;
    return 0;
}

/* The layouts from (type, items) pairs into w->layouts (sized for them). */
static int read_layouts(Walker *w, PyObject *pairs)
{
    for (Py_ssize_t at = 0; at < PyList_GET_SIZE(pairs); at++) {
        PyObject *pair = PyList_GET_ITEM(pairs, at);
        Layout *l = &w->layouts[w->n_layouts];
        if (read_type(PyTuple_GET_ITEM(pair, 0), &l->type) < 0)
            return -1;
        PyObject *items = PySequence_Fast(PyTuple_GET_ITEM(pair, 1), "a layout must be a sequence of items");
        if (items == NULL)
            return -1;
        Py_ssize_t count = PySequence_Fast_GET_SIZE(items);
        for (Py_ssize_t k = 0; k < count && k < MAX_LAYOUT; k++) {
            PyObject *item = PySequence_Fast_GET_ITEM(items, k);
            const char *s = PyUnicode_Check(item) ? PyUnicode_AsUTF8(item) : NULL;
            int found = -1;
            for (int j = 0; s != NULL && j < N_ITEMS; j++) {
                if (strcmp(ITEMS[j].name, s) == 0)
                    found = j;
            }
            if (found < 0) {
                /* (item is borrowed from items, which may be its only owner: named before items goes) */
                if (!PyErr_Occurred())
                    PyErr_Format(PyExc_ValueError, "unknown RDATA layout item %R", item);
                Py_DECREF(items);
                return -1;
            }
            l->items[k] = ITEMS[found].item;
        }
        Py_DECREF(items);
        if (count > MAX_LAYOUT) {
            PyErr_Format(PyExc_ValueError, "a layout of over %d items", MAX_LAYOUT);
            return -1;
        }
        l->items[count] = I_END;
        w->n_layouts++;
    }
    return 0;
}

static int read_sections(Walker *w, PyObject *sections)
{
    PyObject *seq = PySequence_Fast(sections, "sections must be a sequence of 3 str");
    if (seq == NULL)
        return -1;
    int rc = 0;
    if (PySequence_Fast_GET_SIZE(seq) != 3) {
        PyErr_SetString(PyExc_ValueError, "sections must be a sequence of 3 str");
        rc = -1;
    }
    for (int k = 0; k < 3 && rc == 0; k++) {
        if ((w->sections[k] = copy_text(PySequence_Fast_GET_ITEM(seq, k))) == NULL)
            rc = -1;
    }
    Py_DECREF(seq);
    return rc;
}

static int walker_init(Walker *w, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"layouts", "type_names", "sections", "caps", NULL};
    PyObject *layouts, *names, *sections;
    Py_ssize_t caps[4];
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!O(nnnn):Walker", kwlist, &PyDict_Type, &layouts, &PyDict_Type,
                                     &names, &sections, &caps[0], &caps[1], &caps[2], &caps[3]))
        return -1;
    for (int k = 0; k < 4; k++) {
        if (caps[k] < 0 || caps[k] > INT32_MAX / 2) {
            PyErr_SetString(PyExc_ValueError, "caps must be 4 numbers from 0 to 2**30");
            return -1;
        }
    }
    walker_free(w);
    /* Snapshots of the tables, taken before any of their contents runs code (a layout's iteration may change
     * them): the tables are sized for, and read from, these (PyDict_Items: a list of (key, value) tuples). */
    PyObject *layout_pairs = PyDict_Items(layouts), *name_pairs = PyDict_Items(names);
    if (layout_pairs == NULL || name_pairs == NULL)
        goto fail;
    if (read_sections(w, sections) < 0)
        goto fail;
    w->layouts = PyMem_Calloc((size_t)PyList_GET_SIZE(layout_pairs) + 1, sizeof(Layout));
    w->names = PyMem_Calloc((size_t)PyList_GET_SIZE(name_pairs) + 1, sizeof(TypeName));
    if (w->layouts == NULL || w->names == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    if (read_layouts(w, layout_pairs) < 0)
        goto fail;
    for (Py_ssize_t at = 0; at < PyList_GET_SIZE(name_pairs); at++) {
        PyObject *pair = PyList_GET_ITEM(name_pairs, at);
        TypeName *t = &w->names[w->n_names];
        if (read_type(PyTuple_GET_ITEM(pair, 0), &t->type) < 0 ||
            (t->name = copy_text(PyTuple_GET_ITEM(pair, 1))) == NULL)
            goto fail;
        w->n_names++;
    }
    Py_DECREF(layout_pairs);
    Py_DECREF(name_pairs);
    qsort(w->layouts, (size_t)w->n_layouts, sizeof(Layout), by_type);
    qsort(w->names, (size_t)w->n_names, sizeof(TypeName), by_type);
    w->record_base = caps[0];
    w->record_per_byte = caps[1];
    w->message_base = caps[2];
    w->message_per_byte = caps[3];
    return 0;
fail:
    Py_XDECREF(layout_pairs);
    Py_XDECREF(name_pairs);
    walker_free(w);
    return -1;
}

static void walker_dealloc(Walker *w)
{
    walker_free(w);
    Py_TYPE(w)->tp_free((PyObject *)w);
}

static PyMethodDef walker_methods[] = {
    {"column", (PyCFunction)walker_column, METH_VARARGS,
     "column(length, offset, buffers) -> the answers column's buffers for a binary column of responses."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject WalkerType = EXT_TYPE(Walker, "export.parquet._answers.Walker", 0,
    "Walker(layouts, type_names, sections, caps): responses' records in presentation format.",
    .tp_new = PyType_GenericNew, .tp_init = (initproc)walker_init, .tp_dealloc = (destructor)walker_dealloc,
    .tp_methods = walker_methods);

PyMODINIT_FUNC PyInit__answers(void)
{
    return ext_module("export.parquet._answers", NULL, NULL, (PyTypeObject *[]){&WalkerType, NULL}, NULL, NULL);
}
