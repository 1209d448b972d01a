/* The DNS walker in C (one implementation, include/wire.c, compiled into each extension that walks): frame
 * classification, the flow hash, names, sections and the OPT RR, by the rules of the Python reference
 * (probe/decode/packets.py, probe/decode/dnswire.py).
 *
 * Used by probe.decode._decoderec (message records; probe.decode._dnstap through its capsule), probe.decode._fastwire
 * (the DNS part of message tuples), export.cdns._cdnsblock (message ends, question names), export.parquet._answers
 * (the answers column) and the capture extensions (flow_hash). The helpers of the per-label loops stay inline here;
 * the rest is in wire.c. Include after Python.h (it uses Py_ssize_t).
 */
#ifndef DNSPROBE_WIRE_H
#define DNSPROBE_WIRE_H

#include <stdint.h>
#include <string.h>

#define MAX_NAME 255
#define TYPE_OPT 41
#define OPT_NSID 3
#define OPT_DAU 5
#define OPT_DHU 6
#define OPT_N3U 7
#define OPT_ECS 8
#define OPT_COOKIE 10
#define OPT_EDE 15
#define PROTO_UDP 17

/* Outcome of a walking step: go on, or the message is malformed at this point (the Python walker's
 * Malformed, IndexError or struct.error), or a Python error (an exception is set). */
enum { OK = 0, MAL = 1, ERR = -1 };
#define PROTO_TCP 6
#define MAX_LABELS 127 /* labels of at least 1 byte in MAX_NAME bytes */

/* Defined in wire.c: hidden, so that each extension calls its own copy directly. */
#define WIRE_API __attribute__((visibility("hidden")))

static inline unsigned rd16(const unsigned char *p)
{
    return ((unsigned)p[0] << 8) | p[1];
}

static inline int dns_port(const unsigned char *portmap, unsigned port)
{
    return portmap[port >> 3] & (1 << (port & 7));
}

static inline uint32_t rd32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* n (at most a few hundred) bytes copied from s to d in 16-, 8-, 4-byte moves, the last of them overlapping the one
 * before: the copies of a name's bytes are short, and a `rep movsb` (an inlined memcpy of a variable length), a
 * call of the C library's memcpy and a loop of byte moves each cost more than the copy itself. */
static inline void copy_short(char *d, const unsigned char *s, size_t n)
{
    if (n >= 16) {
        for (size_t i = 0; i + 16 < n; i += 16)
            memcpy(d + i, s + i, 16);
        memcpy(d + n - 16, s + n - 16, 16);
    } else if (n >= 8) {
        memcpy(d, s, 8);
        memcpy(d + n - 8, s + n - 8, 8);
    } else if (n >= 4) {
        memcpy(d, s, 4);
        memcpy(d + n - 4, s + n - 4, 4);
    } else {
        for (size_t i = 0; i < n; i++)
            d[i] = (char)s[i];
    }
}

/* b".".join(labels) of an uncompressed name (qwire bytes at name, ending with its root label: Walk.qwire) into out
 * (room for MAX_NAME bytes): its bytes after the first length byte, the other length bytes made dots. Its length. */
static inline Py_ssize_t qname_from_wire(const unsigned char *name, Py_ssize_t qwire, char *out)
{
    if (qwire < 2)
        return 0; /* the root */
    copy_short(out, name + 1, (size_t)qwire - 2);
    for (Py_ssize_t k = name[0] + 1; name[k]; k += name[k] + 1)
        out[k - 1] = '.';
    return qwire - 2;
}

/* Step over the ordinary labels (length 1 to 63) from *poff: *poff is left at the first other byte,
 * *c is that byte. MAL when the labels run past the end. */
static inline int step_labels(const unsigned char *p, Py_ssize_t n, Py_ssize_t *poff, unsigned *c)
{
    Py_ssize_t off = *poff;
    if (off >= n)
        return MAL;
    *c = p[off];
    while (*c > 0 && *c < 64) {
        off += *c + 1;
        if (off >= n)
            return MAL;
        *c = p[off];
    }
    *poff = off;
    return OK;
}

/* dnswire.skip_name (also the name loop inlined in dnswire.walk_rrs: the same rules) */
static inline int skip_name(const unsigned char *p, Py_ssize_t n, Py_ssize_t *poff)
{
    Py_ssize_t off = *poff, start = off;
    unsigned c;
    if (step_labels(p, n, &off, &c) != OK)
        return MAL;
    if (c == 0) {
        *poff = off + 1;
        return OK;
    }
    if (c >= 0xC0) {
        if (off + 1 >= n || (Py_ssize_t)(((c & 0x3F) << 8) | p[off + 1]) >= start)
            return MAL;
        *poff = off + 2;
        return OK;
    }
    return MAL;
}

#define PROTO_TCP 6

typedef struct {
    int ipv;               /* 4 or 6 */
    int proto;             /* PROTO_UDP or PROTO_TCP */
    long vlan;             /* the outermost VLAN id, -1: none (None) */
    Py_ssize_t addr, alen; /* source address offset and length; the destination follows it */
    unsigned sport, dport, ttl, csum, flags;
    uint32_t seq;
    Py_ssize_t dns, dns_len; /* UDP: the DNS message; TCP: the segment's payload (offset and length) */
} Fast;

/* The options of an OPT RR as dnswire.parse_opt reads them: the last option of each kind that has a text (a later one
 * replaces an earlier one), whether a COOKIE is there, how many EDE options. */
enum { AT_NSID, AT_DAU, AT_DHU, AT_N3U, AT_ECS, N_OPT_TEXTS };
typedef struct {
    Py_ssize_t last[N_OPT_TEXTS]; /* the option's offset, -1: none */
    int cookie;
    long n_ede;
} OptScan;

/* The labels of a name: the offset of each one's length byte, in order, pointers followed. */
typedef struct {
    int count;
    Py_ssize_t at[MAX_LABELS];
} NameLabels;

/* Where the parts of a message are, as dnswire.parse_message finds them. A field is set only when the
 * Python walker would have assigned it before it stopped (-1 / 0: None). */
typedef struct {
    long id, flags, qd, an, ns, ar; /* the header; -1: shorter than a header */
    int has_qname;                  /* the first question's name was read: jlen, labels, and the text */
    Py_ssize_t qwire;               /* > 0: it is uncompressed, p[12..12 + qwire) with its root label (its text:
                                       qname_from_wire; not joined by the walk) */
    long labels;
    Py_ssize_t jlen;                /* the length of b".".join(labels) */
    char joined[2 * MAX_NAME + 2];  /* qwire 0: b".".join(labels) */
    long qtype, qclass, last_an;    /* -1: None */
    int has_opt;                    /* the first OPT RR of the additional section, decoded */
    unsigned opt_class;
    uint32_t opt_ttl;
    Py_ssize_t opt_start, opt_end;  /* its RDATA */
    OptScan opts;                   /* its options */
    int malformed;
} Walk;

WIRE_API int classify(const unsigned char *f, Py_ssize_t len, const unsigned char *portmap, int tcp, Fast *x);
WIRE_API uint32_t flow_hash(const unsigned char *f, Py_ssize_t len, int linktype);
WIRE_API int name_labels(const unsigned char *p, Py_ssize_t n, Py_ssize_t *poff, NameLabels *out);
WIRE_API int read_name_joined(const unsigned char *p, Py_ssize_t n, Py_ssize_t *poff, char *joined, Py_ssize_t *jlen,
                              long *labels);
WIRE_API int skip_questions(const unsigned char *p, Py_ssize_t n, Py_ssize_t *poff, long count);
WIRE_API int walk_rrs_at(const unsigned char *p, Py_ssize_t n, Py_ssize_t *poff, unsigned count, unsigned *rtype,
                         Walk *opt);
WIRE_API void walk_message(const unsigned char *p, Py_ssize_t n, Walk *w);

/* The texts of dnswire.parse_opt that are lists of numbers, written into out; their length. algorithms_text:
 * dnswire._algorithms of an option value v[0..n), "1,2,3" (room for 4n bytes). other_codes_text: the `other`
 * text, the codes of the walk's OPT options that have a payload and no text of their own (room for 2 bytes per
 * byte of the OPT RDATA). */
WIRE_API Py_ssize_t algorithms_text(const unsigned char *v, size_t n, char *out);
WIRE_API Py_ssize_t other_codes_text(const unsigned char *p, const Walk *w, char *out);

#endif
