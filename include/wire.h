/* The PyObject-free part of the DNS decoders in C: frame classification and the DNS message walk.
 *
 * Shared by probe.decode._fastwire (the DNS part of message tuples) and probe.decode._decoderec (message records),
 * so that both read frames and messages by the same rules, those of the Python reference
 * (probe/decode/packets.py, probe/decode/dnswire.py). Include after Python.h (it uses Py_ssize_t).
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

static inline unsigned rd16(const unsigned char *p)
{
    return ((unsigned)p[0] << 8) | p[1];
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

static inline int dns_port(const unsigned char *portmap, unsigned port)
{
    return portmap[port >> 3] & (1 << (port & 7));
}

static inline uint32_t rd32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* The general path of PacketDecoder._frames (link.ethernet, _ipv4/_ipv6, _transport) for the frames it
 * decodes without a detour: Ethernet with any VLAN tags, IPv4 (options allowed, not a fragment) or IPv6
 * without extension headers, UDP or (when tcp) TCP, a DNS port, headers and lengths consistent so that
 * none of the Python code's checks fails. 1 when the frame is one of them. */
static inline int classify_general(const unsigned char *f, Py_ssize_t len, const unsigned char *portmap, int tcp, Fast *x)
{
    unsigned etype = rd16(f + 12);
    Py_ssize_t off = 14, l4, end;
    x->vlan = -1;
    while (etype == 0x8100 || etype == 0x88A8 || etype == 0x9100) { /* link.VLAN_TAGS */
        if (off + 4 > len)
            return 0;
        if (x->vlan < 0)
            x->vlan = rd16(f + off) & 0x0FFF;
        etype = rd16(f + off + 2);
        off += 4;
    }
    if (etype == 0x0800) {
        if (off + 20 > len || (f[off] >> 4) != 4)
            return 0;
        Py_ssize_t hl = (f[off] & 0x0F) * 4, total = rd16(f + off + 2);
        if (hl < 20 || total < hl || off + total > len || (rd16(f + off + 6) & 0x3FFF))
            return 0;
        x->ipv = 4;
        x->addr = off + 12;
        x->alen = 4;
        x->ttl = f[off + 8];
        x->proto = f[off + 9];
        l4 = off + hl;
        end = off + total;
    } else if (etype == 0x86DD) {
        if (off + 40 > len || (f[off] >> 4) != 6)
            return 0;
        unsigned plen = rd16(f + off + 4);
        end = plen ? off + 40 + plen : len; /* 0: a jumbogram, to the end of the frame */
        if (end > len)
            return 0;
        x->ipv = 6;
        x->addr = off + 8;
        x->alen = 16;
        x->ttl = f[off + 7];
        x->proto = f[off + 6];
        l4 = off + 40;
    } else {
        return 0;
    }
    Py_ssize_t plen = end - l4;
    if (x->proto == PROTO_UDP) {
        if (plen < 8)
            return 0;
        Py_ssize_t ulen = rd16(f + l4 + 4);
        if (ulen < 8 || ulen > plen)
            return 0;
        x->csum = rd16(f + l4 + 6);
        x->dns = l4 + 8;
        x->dns_len = ulen - 8;
    } else if (x->proto == PROTO_TCP && tcp) {
        if (plen < 20)
            return 0;
        Py_ssize_t thl = (f[l4 + 12] >> 4) * 4;
        if (thl < 20 || thl > plen)
            return 0;
        x->csum = 0;
        x->seq = rd32(f + l4 + 4);
        x->flags = f[l4 + 13];
        x->dns = l4 + thl;
        x->dns_len = plen - thl;
    } else {
        return 0;
    }
    x->sport = rd16(f + l4);
    x->dport = rd16(f + l4 + 2);
    return dns_port(portmap, x->sport) || dns_port(portmap, x->dport);
}

/* The frames the C loop decodes; 1 when the frame is one. First the conditions of the fast path at the top
 * of PacketDecoder._frames (untagged Ethernet, IPv4 without options or IPv6, UDP); a frame that fails them
 * goes through the general path there, so it is judged by the general path's rules here. */
static inline int classify(const unsigned char *f, Py_ssize_t len, const unsigned char *portmap, int tcp, Fast *x)
{
    long most = -1; /* the largest UDP length the IP header allows */
    if (len < 14)
        return 0;
    if (f[12] == 0x08 && f[13] == 0x00) {
        if (len >= 42 && f[14] == 0x45 && f[23] == PROTO_UDP && !(rd16(f + 20) & 0x3FFF)) {
            x->ipv = 4;
            x->addr = 26;
            x->alen = 4;
            x->ttl = f[22];
            most = (long)rd16(f + 16) - 20;
        }
    } else if (f[12] == 0x86 && f[13] == 0xDD) {
        if (len >= 62 && (f[14] >> 4) == 6 && f[20] == PROTO_UDP) {
            x->ipv = 6;
            x->addr = 22;
            x->alen = 16;
            x->ttl = f[21];
            most = rd16(f + 18);
        }
    }
    if (most >= 0) {
        Py_ssize_t udp = x->addr + 2 * x->alen;
        unsigned ulen = rd16(f + udp + 4);
        x->proto = PROTO_UDP;
        x->vlan = -1;
        x->sport = rd16(f + udp);
        x->dport = rd16(f + udp + 2);
        x->csum = rd16(f + udp + 6);
        x->dns = udp + 8;
        x->dns_len = (Py_ssize_t)ulen - 8;
        if ((dns_port(portmap, x->sport) || dns_port(portmap, x->dport)) && ulen >= 8 && (long)ulen <= most
            && (Py_ssize_t)ulen <= len - udp)
            return 1;
    }
    return classify_general(f, len, portmap, tcp, x);
}

/* ---------------------------------------------------------------------------------------------
 * The flow hash: which worker a frame goes to when several share the traffic */

/* A symmetric hash of the frame's IP address pair, the one thing every packet of a flow has in common: both
 * directions, every fragment of a datagram (no ports after the first), every segment of a TCP connection.
 * `dnsprobe read --workers N` keeps the frames whose hash % N is its worker's number, and live capture's fanout
 * program (probe/capture/bpf.py fanout_program, run by the kernel, which takes it modulo the group's size)
 * computes exactly this: the XOR of the 32-bit words of source and destination address, times 0x9E3779B1, xor
 * its upper half. The kernel runs that program on the frame as its receive path holds it: an outer 802.1Q or
 * 802.1ad tag already taken off (into the packet's metadata), the IP header found from the network header
 * and skb->protocol; so here too an outer 0x8100/0x88A8 tag is passed, and then up to two more tags (0x8100,
 * 0x88A8, 0x9100) as the program reads them. Raw IP (101, 228, 229, 12, 14), BSD loopback (0, 108: after its
 * 4-byte header) and Linux cooked captures (113: after 16 bytes, 276: after 20) find the IP header by its
 * version nibble. 0 for anything else, or a frame too short to hold the addresses (the kernel's program stops
 * there with 0). */
static inline uint32_t flow_hash(const unsigned char *f, Py_ssize_t len, int linktype)
{
    Py_ssize_t base;
    int v6;
    if (linktype == 1) {
        Py_ssize_t at = 12;
        if (at + 2 > len)
            return 0;
        unsigned etype = rd16(f + at);
        if (etype == 0x8100 || etype == 0x88A8) { /* the tag the kernel's receive path takes off */
            at += 4;
            if (at + 2 > len)
                return 0;
            etype = rd16(f + at);
        }
        for (int tags = 0; tags < 2 && (etype == 0x8100 || etype == 0x88A8 || etype == 0x9100); tags++) {
            at += 4;
            if (at + 2 > len)
                return 0;
            etype = rd16(f + at);
        }
        if (etype != 0x0800 && etype != 0x86DD)
            return 0;
        base = at + 2;
        v6 = etype == 0x86DD;
    } else {
        switch (linktype) {
        case 0:
        case 108: base = 4; break;
        case 113: base = 16; break;
        case 276: base = 20; break;
        case 12:
        case 14:
        case 101:
        case 228:
        case 229: base = 0; break;
        default: return 0;
        }
        if (base >= len)
            return 0;
        unsigned version = f[base] >> 4;
        if (version != 4 && version != 6)
            return 0;
        v6 = version == 6;
    }
    uint32_t x = 0;
    if (v6) {
        if (base + 40 > len)
            return 0;
        for (int k = 0; k < 8; k++)
            x ^= rd32(f + base + 8 + 4 * k);
    } else {
        if (base + 20 > len)
            return 0;
        x = rd32(f + base + 12) ^ rd32(f + base + 16);
    }
    x *= 0x9E3779B1u;
    return x ^ (x >> 16);
}

/* ---------------------------------------------------------------------------------------------
 * The message walk as positions: what dnswire.parse_message reads, without making any object */

/* dnswire.read_name: a possibly compressed name at *poff, its labels joined by '.' into `joined` (room
 * for 2 * MAX_NAME + 2 bytes) and counted; *poff is set to the offset after the name. */
static inline int read_name_joined(const unsigned char *p, Py_ssize_t n, Py_ssize_t *poff, char *joined, Py_ssize_t *jlen,
                            long *labels)
{
    Py_ssize_t off = *poff, start = off, end = -1, tlen = 0;
    long total = 0, count = 0;
    for (;;) {
        if (off >= n)
            return MAL;
        unsigned c = p[off];
        if (c == 0) {
            off += 1;
            break;
        }
        if (c >= 0xC0) {
            if (off + 1 >= n)
                return MAL;
            Py_ssize_t ptr = ((c & 0x3F) << 8) | p[off + 1];
            if (ptr >= start) /* only backward pointers, so no loops */
                return MAL;
            if (end < 0)
                end = off + 2;
            start = off = ptr;
            continue;
        }
        if (c & 0xC0)
            return MAL; /* label types 0x40 and 0x80 */
        total += c + 1;
        if (total > MAX_NAME)
            return MAL;
        if (off + 1 + c > n)
            return MAL;
        if (count)
            joined[tlen++] = '.';
        memcpy(joined + tlen, p + off + 1, c);
        tlen += c;
        count++;
        off += c + 1;
    }
    *jlen = tlen;
    *labels = count;
    *poff = end < 0 ? off : end;
    return OK;
}

/* The checks dnswire.parse_opt makes on the options of an OPT RR at p[start..end): MAL where it raises. */
static inline int opt_options_ok(const unsigned char *p, Py_ssize_t start, Py_ssize_t end)
{
    for (Py_ssize_t pos = start; pos < end;) {
        if (pos + 4 > end)
            return MAL;
        unsigned code = rd16(p + pos), olen = rd16(p + pos + 2);
        const unsigned char *v = p + pos + 4;
        pos += 4 + olen;
        if (pos > end)
            return MAL;
        if (code == OPT_ECS) {
            if (olen < 4)
                return MAL;
            unsigned family = rd16(v);
            Py_ssize_t alen = olen - 4;
            if (!((family == 1 && alen <= 4) || (family == 2 && alen <= 16)))
                return MAL;
        } else if (code == OPT_EDE && olen < 2) {
            return MAL;
        }
    }
    return OK;
}

/* Where the parts of a message are, as dnswire.parse_message finds them. A field is set only when the
 * Python walker would have assigned it before it stopped (-1 / 0: None). */
typedef struct {
    long id, flags, qd, an, ns, ar; /* the header; -1: shorter than a header */
    int has_qname;                  /* the first question's name was read: joined, jlen, labels */
    long labels;
    Py_ssize_t jlen;
    char joined[2 * MAX_NAME + 2];
    long qtype, qclass, last_an;    /* -1: None */
    int has_opt;                    /* the first OPT RR of the additional section, decoded */
    unsigned opt_class;
    uint32_t opt_ttl;
    Py_ssize_t opt_start, opt_end;  /* its RDATA */
    int malformed;
} Walk;

/* dnswire.walk_rrs: step over count RRs from *poff; *rtype: the type of the last one. With opt (the
 * additional section), the first OPT RR is checked and its place kept; outputs are set only on OK, as
 * the Python assignments happen only when the call returns. */
static inline int walk_rrs_at(const unsigned char *p, Py_ssize_t n, Py_ssize_t *poff, unsigned count, unsigned *rtype,
                       Walk *opt)
{
    Py_ssize_t off = *poff, opt_start = 0, opt_end = 0;
    unsigned t = 0, opt_class = 0;
    uint32_t opt_ttl = 0;
    int found = 0;
    for (unsigned i = 0; i < count; i++) {
        if (skip_name(p, n, &off) != OK || off + 10 > n)
            return MAL;
        t = rd16(p + off);
        unsigned rdlen = rd16(p + off + 8);
        off += 10 + rdlen;
        if (t == TYPE_OPT && opt != NULL && !found) {
            if (off > n)
                return MAL;
            const unsigned char *h = p + off - rdlen - 8;
            if (opt_options_ok(p, off - rdlen, off) != OK)
                return MAL;
            found = 1;
            opt_class = rd16(h);
            opt_ttl = rd32(h + 2);
            opt_start = off - rdlen;
            opt_end = off;
        }
    }
    *poff = off;
    if (rtype != NULL)
        *rtype = t;
    if (opt != NULL && found) {
        opt->has_opt = 1;
        opt->opt_class = opt_class;
        opt->opt_ttl = opt_ttl;
        opt->opt_start = opt_start;
        opt->opt_end = opt_end;
    }
    return OK;
}

/* The body of dnswire.parse_message after the header. */
static inline int walk_body(const unsigned char *p, Py_ssize_t n, Walk *w)
{
    Py_ssize_t off = 12;
    int r;
    if (w->qd) {
        unsigned c;
        if (step_labels(p, n, &off, &c) != OK)
            return MAL;
        if (c == 0 && off - 12 < MAX_NAME) {
            /* the usual first question: uncompressed, ending with its root label */
            Py_ssize_t k = 12, tlen = 0;
            long count = 0;
            while (p[k]) {
                if (count)
                    w->joined[tlen++] = '.';
                memcpy(w->joined + tlen, p + k + 1, p[k]);
                tlen += p[k];
                count++;
                k += p[k] + 1;
            }
            w->jlen = tlen;
            w->labels = count;
            off += 1;
        } else {
            off = 12;
            if ((r = read_name_joined(p, n, &off, w->joined, &w->jlen, &w->labels)) != OK)
                return r;
        }
        w->has_qname = 1;
        if (off + 4 > n)
            return MAL;
        w->qtype = rd16(p + off);
        w->qclass = rd16(p + off + 2);
        off += 4;
        for (long i = 1; i < w->qd; i++) {
            if ((r = skip_name(p, n, &off)) != OK)
                return r;
            off += 4;
        }
    }
    if (off > n)
        return MAL;
    if (w->an) {
        unsigned t;
        if ((r = walk_rrs_at(p, n, &off, (unsigned)w->an, &t, NULL)) != OK)
            return r;
        w->last_an = t;
    }
    if (w->ns && (r = walk_rrs_at(p, n, &off, (unsigned)w->ns, NULL, NULL)) != OK)
        return r;
    if (w->ar && (r = walk_rrs_at(p, n, &off, (unsigned)w->ar, NULL, w)) != OK)
        return r;
    return off > n ? MAL : OK;
}

/* dnswire.parse_message as positions: fills w (malformed set as the Python walker sets it). */
static inline void walk_message(const unsigned char *p, Py_ssize_t n, Walk *w)
{
    w->id = w->flags = w->qd = w->an = w->ns = w->ar = -1;
    w->has_qname = 0;
    w->jlen = 0;
    w->labels = w->qtype = w->qclass = w->last_an = -1;
    w->has_opt = 0;
    w->malformed = 1;
    if (n < 12)
        return;
    w->id = rd16(p);
    w->flags = rd16(p + 2);
    w->qd = rd16(p + 4);
    w->an = rd16(p + 6);
    w->ns = rd16(p + 8);
    w->ar = rd16(p + 10);
    w->malformed = walk_body(p, n, w) != OK;
}

#endif
