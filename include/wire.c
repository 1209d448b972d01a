/* The DNS walker (declared, with its inline helpers, in wire.h): its Python reference is probe/decode/packets.py
 * (classify: PacketDecoder._frames) and probe/decode/dnswire.py (the names, sections and OPT RR). Compiled into
 * each extension that includes wire.h (setup.py). */
#include <Python.h>

#include "wire.h"

/* The IP header's fields a frame's message keeps: version, where the addresses are (source, then destination),
 * TTL (or hop limit) and protocol. */
static inline void ip_fields(Fast *x, int ipv, Py_ssize_t addr, unsigned ttl, unsigned proto)
{
    x->ipv = ipv;
    x->addr = addr;
    x->alen = ipv == 4 ? 4 : 16;
    x->ttl = ttl;
    x->proto = proto;
}

/* The general path of PacketDecoder._frames (link.ethernet, _ipv4/_ipv6, _transport) for the frames it
 * decodes without a detour: Ethernet with any VLAN tags, IPv4 (options allowed, not a fragment) or IPv6
 * without extension headers, UDP or (when tcp) TCP, a DNS port, headers and lengths consistent so that
 * none of the Python code's checks fails. 1 when the frame is one of them. */
static int classify_general(const unsigned char *f, Py_ssize_t len, const unsigned char *portmap, int tcp, Fast *x)
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
        ip_fields(x, 4, off + 12, f[off + 8], f[off + 9]);
        l4 = off + hl;
        end = off + total;
    } else if (etype == 0x86DD) {
        if (off + 40 > len || (f[off] >> 4) != 6)
            return 0;
        unsigned plen = rd16(f + off + 4);
        end = plen ? off + 40 + plen : len; /* 0: a jumbogram, to the end of the frame */
        if (end > len)
            return 0;
        ip_fields(x, 6, off + 8, f[off + 7], f[off + 6]);
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
int classify(const unsigned char *f, Py_ssize_t len, const unsigned char *portmap, int tcp, Fast *x)
{
    long most = -1; /* the largest UDP length the IP header allows */
    if (len < 14)
        return 0;
    if (f[12] == 0x08 && f[13] == 0x00) {
        if (len >= 42 && f[14] == 0x45 && f[23] == PROTO_UDP && !(rd16(f + 20) & 0x3FFF)) {
            ip_fields(x, 4, 26, f[22], PROTO_UDP);
            most = (long)rd16(f + 16) - 20;
        }
    } else if (f[12] == 0x86 && f[13] == 0xDD) {
        if (len >= 62 && (f[14] >> 4) == 6 && f[20] == PROTO_UDP) {
            ip_fields(x, 6, 22, f[21], PROTO_UDP);
            most = rd16(f + 18);
        }
    }
    if (most >= 0) {
        Py_ssize_t udp = x->addr + 2 * x->alen;
        unsigned ulen = rd16(f + udp + 4);
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
uint32_t flow_hash(const unsigned char *f, Py_ssize_t len, int linktype)
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


/* dnswire.read_name's walk: the labels of the possibly compressed name at *poff into out; *poff is set to the
 * offset after the name (after its first pointer). */
int name_labels(const unsigned char *p, Py_ssize_t n, Py_ssize_t *poff, NameLabels *out)
{
    Py_ssize_t off = *poff, start = off, end = -1;
    long total = 0;
    out->count = 0;
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
        if (total > MAX_NAME || off + 1 + c > n)
            return MAL;
        out->at[out->count++] = off;
        off += c + 1;
    }
    *poff = end < 0 ? off : end;
    return OK;
}

/* b".".join(labels), one label (its length byte at label) at a time. */
static inline void join_label(char *joined, Py_ssize_t *jlen, long *count, const unsigned char *label)
{
    size_t len = label[0];
    if ((*count)++)
        joined[(*jlen)++] = '.';
    copy_short(joined + *jlen, label + 1, len);
    *jlen += (Py_ssize_t)len;
}

/* dnswire.read_name: the name at *poff, its labels joined by '.' into `joined` (room for 2 * MAX_NAME + 2 bytes)
 * and counted; *poff is set to the offset after the name. */
int read_name_joined(const unsigned char *p, Py_ssize_t n, Py_ssize_t *poff, char *joined, Py_ssize_t *jlen,
                     long *labels)
{
    NameLabels name;
    if (name_labels(p, n, poff, &name) != OK)
        return MAL;
    *jlen = *labels = 0;
    for (int i = 0; i < name.count; i++)
        join_label(joined, jlen, labels, p + name.at[i]);
    return OK;
}

/* count questions from *poff (dnswire.parse_message's loop over the questions after the first one). */
int skip_questions(const unsigned char *p, Py_ssize_t n, Py_ssize_t *poff, long count)
{
    for (long i = 0; i < count; i++) {
        if (skip_name(p, n, poff) != OK)
            return MAL;
        *poff += 4;
    }
    return OK;
}

/* dnswire.parse_opt's walk over the options of an OPT RR at p[start..end): MAL where it raises. */
static int opt_scan(const unsigned char *p, Py_ssize_t start, Py_ssize_t end, OptScan *s)
{
    for (int k = 0; k < N_OPT_TEXTS; k++)
        s->last[k] = -1;
    s->cookie = 0;
    s->n_ede = 0;
    for (Py_ssize_t pos = start; pos < end;) {
        if (pos + 4 > end)
            return MAL;
        unsigned code = rd16(p + pos), olen = rd16(p + pos + 2);
        const unsigned char *v = p + pos + 4;
        if (pos + 4 + olen > end)
            return MAL;
        switch (code) {
        case OPT_NSID: s->last[AT_NSID] = pos; break;
        case OPT_DAU: s->last[AT_DAU] = pos; break;
        case OPT_DHU: s->last[AT_DHU] = pos; break;
        case OPT_N3U: s->last[AT_N3U] = pos; break;
        case OPT_COOKIE: s->cookie = 1; break;
        case OPT_ECS: {
            if (olen < 4)
                return MAL;
            unsigned family = rd16(v), alen = olen - 4;
            if (!((family == 1 && alen <= 4) || (family == 2 && alen <= 16)))
                return MAL;
            s->last[AT_ECS] = pos;
            break;
        }
        case OPT_EDE:
            if (olen < 2)
                return MAL;
            s->n_ede++;
            break;
        }
        pos += 4 + olen;
    }
    return OK;
}

/* dnswire.walk_rrs: step over count RRs from *poff; *rtype: the type of the last one. With opt (the
 * additional section), the first OPT RR is checked and its place kept; outputs are set only on OK, as
 * the Python assignments happen only when the call returns. */
int walk_rrs_at(const unsigned char *p, Py_ssize_t n, Py_ssize_t *poff, unsigned count, unsigned *rtype, Walk *opt)
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
            if (opt_scan(p, off - rdlen, off, &opt->opts) != OK) /* (read only when has_opt is set) */
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
static int walk_body(const unsigned char *p, Py_ssize_t n, Walk *w)
{
    Py_ssize_t off = 12;
    int r;
    if (w->qd) {
        unsigned c;
        long labels = 0;
        /* step_labels, counting the labels */
        for (;; labels++) {
            if (off >= n)
                return MAL;
            c = p[off];
            if (c == 0 || c >= 64)
                break;
            off += c + 1;
        }
        if (c == 0 && off - 12 < MAX_NAME) {
            /* the usual first question: uncompressed, ending with its root label (its text is not joined here:
             * the record's writer makes it from the wire, in place) */
            w->qwire = off + 1 - 12;
            w->labels = labels;
            w->jlen = w->qwire > 1 ? w->qwire - 2 : 0;
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
        if ((r = skip_questions(p, n, &off, w->qd - 1)) != OK)
            return r;
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
void walk_message(const unsigned char *p, Py_ssize_t n, Walk *w)
{
    w->id = w->flags = w->qd = w->an = w->ns = w->ar = -1;
    w->has_qname = 0;
    w->jlen = w->qwire = 0;
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

/* The decimal digits of v (below 100000: an option code, an algorithm number) at out; their count. (sprintf's
 * format parsing cost more than the rest of an OPT RR's texts.) */
static inline Py_ssize_t decimal(char *out, unsigned v)
{
    char digits[5];
    int k = 0;
    do {
        digits[k++] = (char)('0' + v % 10);
        v /= 10;
    } while (v && k < 5);
    for (int i = 0; i < k; i++)
        out[i] = digits[k - 1 - i];
    return k;
}

Py_ssize_t algorithms_text(const unsigned char *v, size_t n, char *out)
{
    Py_ssize_t len = 0;
    for (size_t i = 0; i < n; i++) {
        if (i)
            out[len++] = ',';
        len += decimal(out + len, v[i]);
    }
    return len;
}

Py_ssize_t other_codes_text(const unsigned char *p, const Walk *w, char *out)
{
    Py_ssize_t len = 0;
    for (Py_ssize_t pos = w->opt_start; pos < w->opt_end; pos += 4 + rd16(p + pos + 2)) {
        unsigned code = rd16(p + pos);
        if (rd16(p + pos + 2) && code != OPT_NSID && code != OPT_DAU && code != OPT_DHU && code != OPT_N3U) {
            if (len)
                out[len++] = ',';
            len += decimal(out + len, code);
        }
    }
    return len;
}
