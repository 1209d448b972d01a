/*
 * probe.capture._dpdk: the small part of DPDK that dnsprobe needs, as a CPython extension.
 *
 * Built by setup.py only when `pkg-config --exists libdpdk` succeeds (Debian: libdpdk-dev).
 * Python side: probe/capture/dpdk.py. Functions:
 *
 *   eal_init(args)                        rte_eal_init with argv = args (a list of str); once per process
 *   port_count()                          ports EAL found (PCI devices bound to DPDK, --vdev devices)
 *   port_info(port)                       dict: name, driver, max_rx_queues, rss_offloads
 *   port_setup(port, queues, ring_size, mempool_size, mbuf_size, promiscuous)
 *                                         configure `queues` RX queues (no TX), symmetric RSS on IP/UDP/TCP
 *                                         where the device hashes, one mbuf pool, start; returns the RSS
 *                                         hash functions in use (0: no RSS)
 *   rx_burst_packed(port, queue, max, timeout_us, frames)
 *                                         the same into a probe._records.Frames (FrameBatch.packed): one copy of
 *                                         the burst's frames into one buffer, no object per frame; returns n
 *   rx_burst(port, queue, max, timeout_us)
 *                                         poll the queue, GIL released, until it has frames and the queue is
 *                                         empty again, or `max` frames, or timeout_us passed without any;
 *                                         returns (data, ts_ns, wirelen): three lists, one entry per frame
 *   port_stats(port)                      dict: ipackets, imissed, ierrors, rx_nombuf (rte_eth_stats)
 *   port_stop(port), port_close(port), eal_cleanup()
 *
 * Timestamps: DPDK gives no per-packet time by default, so a frame is stamped with the TSC read right after
 * the rte_eth_rx_burst() call that returned it (all frames of one hardware burst share it). Cycles become
 * nanoseconds since the epoch through a base pair (TSC, CLOCK_REALTIME) taken at eal_init and re-taken at
 * most once a second, so the stamps follow NTP adjustments of the system clock. Every mbuf received is freed
 * before rx_burst returns, also when building the Python objects fails.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_pause.h>
#include <rte_version.h>

#include "records.h"

#define MAX_QUEUES 128
#define RX_CHUNK 64 /* frames asked of one rte_eth_rx_burst call */
#define IDLE_SPINS 64 /* empty polls before the poller starts sleeping between polls */
#define IDLE_SLEEP_NS 20000 /* sleep between polls of an idle queue */
#define HOLD_US 1000 /* how long frames already received wait for more while the queue is empty */

static PyObject *DpdkError;
static int eal_ready = 0;
static struct rte_mempool *pools[RTE_MAX_ETHPORTS];
static unsigned int rx_queues[RTE_MAX_ETHPORTS]; /* RX queues set up by port_setup (0: none, or stopped) */

/* TSC → realtime base; changed only with the GIL held. */
static uint64_t tsc_hz = 0;
static uint64_t base_tsc = 0;
static uint64_t base_ns = 0;

static uint64_t
realtime_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static void
clock_rebase(void)
{
	base_tsc = rte_get_tsc_cycles();
	base_ns = realtime_ns();
}

static inline uint64_t
tsc_to_ns(uint64_t tsc, uint64_t b_tsc, uint64_t b_ns)
{
	if (tsc <= b_tsc)
		return b_ns;
	return b_ns + (uint64_t)((unsigned __int128)(tsc - b_tsc) * 1000000000ULL / tsc_hz);
}

static PyObject *
raise_dpdk(const char *what, int err)
{
	if (err < 0)
		err = -err;
	PyErr_Format(DpdkError, "%s: %s", what, rte_strerror(err));
	return NULL;
}

/* A port number as Python gave it (not yet cut to DPDK's 16 bits, which would make 65536 port 0). */
static int
check_port(unsigned int port)
{
	if (!eal_ready) {
		PyErr_SetString(DpdkError, "the DPDK EAL is not initialised");
		return -1;
	}
	if (port >= RTE_MAX_ETHPORTS || !rte_eth_dev_is_valid_port((uint16_t)port)) {
		PyErr_Format(DpdkError, "DPDK port %u does not exist (%u port(s) found)", port, rte_eth_dev_count_avail());
		return -1;
	}
	return 0;
}

/* The one argument of the port functions: a port that exists. */
static int
parse_port(PyObject *args, unsigned int *port)
{
	if (!PyArg_ParseTuple(args, "I", port))
		return -1;
	return check_port(*port);
}

static PyObject *
py_eal_init(PyObject *Py_UNUSED(self), PyObject *args)
{
	PyObject *list;
	if (!PyArg_ParseTuple(args, "O!", &PyList_Type, &list))
		return NULL;
	if (eal_ready) {
		PyErr_SetString(DpdkError, "the DPDK EAL is already initialised in this process");
		return NULL;
	}
	Py_ssize_t n = PyList_GET_SIZE(list);
	char **argv = PyMem_Calloc(n + 1, sizeof(char *));
	if (argv == NULL)
		return PyErr_NoMemory();
	PyObject *result = NULL;
	for (Py_ssize_t i = 0; i < n; i++) {
		const char *s = PyUnicode_AsUTF8(PyList_GET_ITEM(list, i));
		if (s == NULL)
			goto out;
		argv[i] = strdup(s); /* never freed: EAL keeps pointers to them (gcc -fanalyzer: "leak of strdup(s)") */
		if (argv[i] == NULL) {
			PyErr_NoMemory();
			goto out;
		}
	}
	int rc = rte_eal_init((int)n, argv);
	fflush(stdout);
	fflush(stderr);
	if (rc < 0) {
		raise_dpdk("EAL initialisation failed", rte_errno);
		goto out;
	}
	eal_ready = 1;
	tsc_hz = rte_get_tsc_hz();
	clock_rebase();
	result = Py_None;
	Py_INCREF(result);
out:
	/* The strings stay allocated, also after a failure: EAL keeps pointers to them, and its option parser
	 * rearranges argv (one string can appear twice), so they cannot be freed safely. */
	PyMem_Free(argv);
	return result;
}

static PyObject *
py_port_count(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(noargs))
{
	if (!eal_ready) {
		PyErr_SetString(DpdkError, "the DPDK EAL is not initialised");
		return NULL;
	}
	return PyLong_FromUnsignedLong(rte_eth_dev_count_avail());
}

static PyObject *
py_port_info(PyObject *Py_UNUSED(self), PyObject *args)
{
	unsigned int port;
	if (parse_port(args, &port) < 0)
		return NULL;
	struct rte_eth_dev_info info;
	int rc = rte_eth_dev_info_get(port, &info);
	if (rc != 0)
		return raise_dpdk("cannot read the device information", rc);
	char name[RTE_ETH_NAME_MAX_LEN] = "";
	rte_eth_dev_get_name_by_port(port, name);
	return Py_BuildValue("{s:s,s:s,s:I,s:K,s:I}", "name", name, "driver", info.driver_name ? info.driver_name : "",
			     "max_rx_queues", (unsigned int)info.max_rx_queues, "rss_offloads",
			     (unsigned long long)info.flow_type_rss_offloads, "socket",
			     (unsigned int)(rte_eth_dev_socket_id(port) < 0 ? 0 : rte_eth_dev_socket_id(port)));
}

static PyObject *
py_port_setup(PyObject *Py_UNUSED(self), PyObject *args)
{
	unsigned int port, queues, ring_size, mempool_size, mbuf_size;
	int promiscuous;
	if (!PyArg_ParseTuple(args, "IIIIIp", &port, &queues, &ring_size, &mempool_size, &mbuf_size, &promiscuous))
		return NULL;
	if (check_port(port) < 0)
		return NULL;
	if (queues < 1 || queues > MAX_QUEUES) {
		PyErr_Format(DpdkError, "%u RX queues: between 1 and %d are supported", queues, MAX_QUEUES);
		return NULL;
	}
	struct rte_eth_dev_info info;
	int rc = rte_eth_dev_info_get(port, &info);
	if (rc != 0)
		return raise_dpdk("cannot read the device information", rc);
	if (queues > info.max_rx_queues) {
		PyErr_Format(DpdkError, "port %u (%s) has at most %u RX queue(s), %u were asked for (one per worker)",
			     port, info.driver_name, (unsigned int)info.max_rx_queues, queues);
		return NULL;
	}
	/* DPDK takes these as 16-bit numbers: a larger one would be cut, not refused. */
	if (ring_size < 1 || ring_size > UINT16_MAX) {
		PyErr_Format(DpdkError, "dpdk.ring_size %u: between 1 and %u RX descriptors", ring_size, UINT16_MAX);
		return NULL;
	}
	if (mbuf_size < 1 || mbuf_size > UINT16_MAX - RTE_PKTMBUF_HEADROOM) {
		PyErr_Format(DpdkError, "dpdk.mbuf_size %u: between 1 and %u bytes (%u of the 16-bit mbuf data room go to"
			     " its headroom)", mbuf_size, UINT16_MAX - RTE_PKTMBUF_HEADROOM, RTE_PKTMBUF_HEADROOM);
		return NULL;
	}
	struct rte_eth_conf conf;
	memset(&conf, 0, sizeof(conf));
	/* Symmetric Toeplitz: a key of repeated 0x6d5a hashes (a, b) and (b, a) alike, so both directions of a
	 * flow reach the same queue (Woo and Park, "Scalable TCP Session Monitoring with Symmetric RSS"). */
	static uint8_t key[64];
	uint64_t rss_hf = 0;
	if (queues > 1) {
		rss_hf = (RTE_ETH_RSS_IP | RTE_ETH_RSS_UDP | RTE_ETH_RSS_TCP) & info.flow_type_rss_offloads;
		/* rss_hf 0: the device has no RSS on IP/UDP/TCP; its driver spreads the frames its own way
		 * (net_af_packet: the kernel's symmetric fanout hash), or queue 0 gets them all. */
		for (size_t k = 0; k < sizeof(key); k += 2) {
			key[k] = 0x6d;
			key[k + 1] = 0x5a;
		}
		if (rss_hf)
			conf.rxmode.mq_mode = RTE_ETH_MQ_RX_RSS;
		conf.rx_adv_conf.rss_conf.rss_hf = rss_hf;
		if (info.hash_key_size && info.hash_key_size <= sizeof(key)) {
			conf.rx_adv_conf.rss_conf.rss_key = key;
			conf.rx_adv_conf.rss_conf.rss_key_len = info.hash_key_size;
		}
	}
	rc = rte_eth_dev_configure(port, queues, 0, &conf);
	if (rc != 0)
		return raise_dpdk("cannot configure the port", rc);
	uint16_t nb_rxd = ring_size, nb_txd = 0;
	rc = rte_eth_dev_adjust_nb_rx_tx_desc(port, &nb_rxd, &nb_txd);
	if (rc != 0)
		return raise_dpdk("cannot set the RX ring size", rc);
	int socket = rte_eth_dev_socket_id(port);
	if (socket < 0)
		socket = (int)rte_socket_id();
	if (pools[port] == NULL) {
		char pool_name[RTE_MEMPOOL_NAMESIZE];
		snprintf(pool_name, sizeof(pool_name), "dnsprobe_p%u", port);
		pools[port] = rte_pktmbuf_pool_create(pool_name, mempool_size, 256, 0,
						     (uint16_t)(mbuf_size + RTE_PKTMBUF_HEADROOM), socket);
		if (pools[port] == NULL)
			return raise_dpdk("cannot create the mbuf pool (dpdk.mempool_size; hugepages?)", rte_errno);
	}
	for (unsigned int q = 0; q < queues; q++) {
		rc = rte_eth_rx_queue_setup(port, q, nb_rxd, socket, NULL, pools[port]);
		if (rc != 0)
			return raise_dpdk("cannot set up an RX queue", rc);
	}
	rc = rte_eth_dev_start(port);
	if (rc != 0)
		return raise_dpdk("cannot start the port", rc);
	rx_queues[port] = queues;
	if (promiscuous) {
		rc = rte_eth_promiscuous_enable(port);
		if (rc != 0 && rc != -ENOTSUP)
			return raise_dpdk("cannot enable promiscuous mode", rc);
	}
	rte_eth_stats_reset(port);
	fflush(stdout);
	fflush(stderr);
	return PyLong_FromUnsignedLongLong(rss_hf);
}

/* Poll the queue, GIL released, until it has `max` frames, or has had frames for HOLD_US and is empty, or
 * timeout_us passed without any: rx_burst's loop, for both of its forms. Holding on to a few frames for a moment
 * (sleeping while the queue is empty) makes batches of tens or hundreds of frames at moderate rates instead of a
 * handful: the work per batch (a Python call, the pipeline's steps) is then spread over many frames. The caller
 * frees the mbufs[0..*got). -1 with an exception. */
static int
poll_queue(unsigned int port, unsigned int queue, unsigned int max, unsigned long long timeout_us,
	   struct rte_mbuf **mbufs, uint64_t *stamps, unsigned int *got_out, uint64_t *b_tsc, uint64_t *b_ns)
{
	if (check_port(port) < 0)
		return -1;
	if (queue >= rx_queues[port]) { /* DPDK itself does not check (only in its debug builds) */
		PyErr_Format(DpdkError, "RX queue %u of port %u is not set up (%u queue(s) are)", queue, port,
			     rx_queues[port]);
		return -1;
	}
	uint64_t now = rte_get_tsc_cycles();
	if (now - base_tsc > tsc_hz)
		clock_rebase();
	*b_tsc = base_tsc;
	*b_ns = base_ns;
	unsigned int got = 0;

	Py_BEGIN_ALLOW_THREADS;
	uint64_t deadline = now + (uint64_t)((unsigned __int128)timeout_us * tsc_hz / 1000000ULL);
	uint64_t hold = (uint64_t)((unsigned __int128)HOLD_US * tsc_hz / 1000000ULL), first = 0;
	unsigned int idle = 0;
	while (got < max) {
		unsigned int want = max - got < RX_CHUNK ? max - got : RX_CHUNK;
		uint16_t n = rte_eth_rx_burst(port, queue, mbufs + got, want);
		if (n) {
			uint64_t t = rte_get_tsc_cycles();
			for (uint16_t k = 0; k < n; k++)
				stamps[got + k] = t;
			if (!got)
				first = t;
			got += n;
			idle = 0;
			continue;
		}
		if (got) {
			/* the queue is empty again: hand over what we have once it has waited HOLD_US */
			if (rte_get_tsc_cycles() - first >= hold)
				break;
			struct timespec ts = {0, IDLE_SLEEP_NS};
			nanosleep(&ts, NULL);
			continue;
		}
		if (rte_get_tsc_cycles() >= deadline)
			break;
		if (++idle < IDLE_SPINS) {
			rte_pause();
		} else {
			struct timespec ts = {0, IDLE_SLEEP_NS};
			nanosleep(&ts, NULL);
		}
	}
	Py_END_ALLOW_THREADS;
	*got_out = got;
	return 0;
}

/* A burst: the mbufs a poll took (the caller frees them, then burst_free), their receive times and the clock pair
 * that converts those to ns. */
typedef struct {
	struct rte_mbuf **mbufs;
	uint64_t *stamps, b_tsc, b_ns;
	unsigned int got;
} Burst;

static void
burst_free(Burst *b)
{
	PyMem_Free(b->mbufs);
	PyMem_Free(b->stamps);
}

/* poll_queue into a new Burst of room `max` (at least 1). -1 with an exception (nothing to free). */
static int
poll_burst(unsigned int port, unsigned int queue, unsigned int max, unsigned long long timeout_us, Burst *b)
{
	if (max == 0)
		max = 1;
	b->mbufs = PyMem_Malloc(sizeof(*b->mbufs) * max);
	b->stamps = PyMem_Malloc(sizeof(*b->stamps) * max);
	b->got = 0;
	if (b->mbufs == NULL || b->stamps == NULL) {
		burst_free(b);
		PyErr_NoMemory();
		return -1;
	}
	if (poll_queue(port, queue, max, timeout_us, b->mbufs, b->stamps, &b->got, &b->b_tsc, &b->b_ns) < 0) {
		burst_free(b);
		return -1;
	}
	return 0;
}

static PyObject *
py_rx_burst(PyObject *Py_UNUSED(self), PyObject *args)
{
	unsigned int port, queue, max;
	unsigned long long timeout_us;
	if (!PyArg_ParseTuple(args, "IIIK", &port, &queue, &max, &timeout_us))
		return NULL;
	Burst burst;
	if (poll_burst(port, queue, max, timeout_us, &burst) < 0)
		return NULL;
	struct rte_mbuf **mbufs = burst.mbufs;
	uint64_t *stamps = burst.stamps, b_tsc = burst.b_tsc, b_ns = burst.b_ns;
	unsigned int got = burst.got;

	PyObject *data = PyList_New(got);
	PyObject *ts = PyList_New(got);
	PyObject *wirelen = PyList_New(got);
	int failed = data == NULL || ts == NULL || wirelen == NULL;
	for (unsigned int k = 0; k < got; k++) {
		struct rte_mbuf *m = mbufs[k];
		if (!failed) {
			uint32_t len = rte_pktmbuf_pkt_len(m);
			PyObject *b = PyBytes_FromStringAndSize(NULL, len);
			PyObject *t = PyLong_FromUnsignedLongLong(tsc_to_ns(stamps[k], b_tsc, b_ns));
			PyObject *w = PyLong_FromUnsignedLong(len);
			if (b == NULL || t == NULL || w == NULL) {
				Py_XDECREF(b);
				Py_XDECREF(t);
				Py_XDECREF(w);
				failed = 1;
			} else {
				/* The one copy: mbuf (all its segments) → bytes. It fails only for an mbuf whose
				 * segments hold less than its packet length: then no bytes are captured (a frame
				 * of length 0, counted as truncated), never the uninitialised ones of b. */
				const void *p = rte_pktmbuf_read(m, 0, len, PyBytes_AS_STRING(b));
				if (p == NULL) {
					Py_SET_SIZE(b, 0); /* (a new bytes object: shrinking it in place is safe) */
					PyBytes_AS_STRING(b)[0] = 0;
				} else if (p != PyBytes_AS_STRING(b)) {
					memcpy(PyBytes_AS_STRING(b), p, len);
				}
				PyList_SET_ITEM(data, k, b);
				PyList_SET_ITEM(ts, k, t);
				PyList_SET_ITEM(wirelen, k, w);
			}
		}
		rte_pktmbuf_free(m);
	}
	burst_free(&burst);
	if (failed) {
		Py_XDECREF(data);
		Py_XDECREF(ts);
		Py_XDECREF(wirelen);
		if (!PyErr_Occurred())
			PyErr_NoMemory();
		return NULL;
	}
	return Py_BuildValue("(NNN)", data, ts, wirelen);
}

/* rx_burst_packed(port, queue, max, timeout_us, frames) -> n: rx_burst into a probe._records.Frames
 * (FrameBatch.packed): the frames are copied once, one after the other, into one bytes object the Frames keeps,
 * and every mbuf is freed before the call returns; no object per frame. A VLAN tag the device took off
 * (RTE_MBUF_F_RX_VLAN_STRIPPED) is given beside its frame, as the ring reader gives the kernel's. */
static PyObject *
py_rx_burst_packed(PyObject *Py_UNUSED(self), PyObject *args)
{
	unsigned int port, queue, max;
	unsigned long long timeout_us;
	Frames *frames;
	if (records == NULL) {
		PyErr_SetString(PyExc_RuntimeError, "rx_burst_packed needs probe._records, which is not built");
		return NULL;
	}
	if (!PyArg_ParseTuple(args, "IIIKO!", &port, &queue, &max, &timeout_us, records->frames_type, &frames))
		return NULL;
	Burst burst;
	if (poll_burst(port, queue, max, timeout_us, &burst) < 0)
		return NULL;
	struct rte_mbuf **mbufs = burst.mbufs;
	uint64_t *stamps = burst.stamps, b_tsc = burst.b_tsc, b_ns = burst.b_ns;
	unsigned int got = burst.got;
	size_t total = 0;
	for (unsigned int k = 0; k < got; k++)
		total += rte_pktmbuf_pkt_len(mbufs[k]);
	PyObject *buf = got ? PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total) : NULL;
	int failed = got && (buf == NULL || records->frames_own(frames, buf) < 0);
	size_t off = 0;
	for (unsigned int k = 0; k < got; k++) {
		struct rte_mbuf *m = mbufs[k];
		if (!failed) {
			uint32_t len = rte_pktmbuf_pkt_len(m);
			unsigned char *d = (unsigned char *)PyBytes_AS_STRING(buf) + off;
			/* As rx_burst: an mbuf whose segments hold less than its length gives a frame of no bytes. */
			const void *p = rte_pktmbuf_read(m, 0, len, d);
			uint32_t caplen = p == NULL ? 0 : len;
			if (p != NULL && p != d)
				memcpy(d, p, len);
			uint32_t tag = m->ol_flags & RTE_MBUF_F_RX_VLAN_STRIPPED ? (0x8100u << 16) | m->vlan_tci : 0;
			if (records->frames_add(frames, d, caplen, len, (int64_t)tsc_to_ns(stamps[k], b_tsc, b_ns), tag) < 0)
				failed = 1;
			off += len;
		}
		rte_pktmbuf_free(m);
	}
	Py_XDECREF(buf);
	burst_free(&burst);
	if (failed) {
		if (!PyErr_Occurred())
			PyErr_NoMemory();
		return NULL;
	}
	return PyLong_FromUnsignedLong(got);
}

static PyObject *
py_port_stats(PyObject *Py_UNUSED(self), PyObject *args)
{
	unsigned int port;
	if (parse_port(args, &port) < 0)
		return NULL;
	struct rte_eth_stats st;
	int rc = rte_eth_stats_get(port, &st);
	if (rc != 0)
		return raise_dpdk("cannot read the port statistics", rc);
	return Py_BuildValue("{s:K,s:K,s:K,s:K}", "ipackets", (unsigned long long)st.ipackets, "imissed",
			     (unsigned long long)st.imissed, "ierrors", (unsigned long long)st.ierrors, "rx_nombuf",
			     (unsigned long long)st.rx_nombuf);
}

static PyObject *
py_port_stop(PyObject *Py_UNUSED(self), PyObject *args)
{
	unsigned int port;
	if (parse_port(args, &port) < 0)
		return NULL;
	int rc = rte_eth_dev_stop(port);
	if (rc != 0)
		return raise_dpdk("cannot stop the port", rc);
	rx_queues[port] = 0;
	Py_RETURN_NONE;
}

static PyObject *
py_port_close(PyObject *Py_UNUSED(self), PyObject *args)
{
	unsigned int port;
	if (parse_port(args, &port) < 0)
		return NULL;
	rx_queues[port] = 0;
	int rc = rte_eth_dev_close(port);
	if (rc != 0)
		return raise_dpdk("cannot close the port", rc);
	if (pools[port] != NULL) {
		rte_mempool_free(pools[port]);
		pools[port] = NULL;
	}
	Py_RETURN_NONE;
}

static PyObject *
py_eal_cleanup(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(noargs))
{
	if (!eal_ready)
		Py_RETURN_NONE;
	int rc = rte_eal_cleanup();
	if (rc != 0)
		return raise_dpdk("EAL cleanup failed", rc);
	eal_ready = 0; /* DPDK cannot be initialised again in this process */
	Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
	{"eal_init", py_eal_init, METH_VARARGS, "eal_init(args): rte_eal_init with argv = args (list of str)"},
	{"port_count", py_port_count, METH_NOARGS, "port_count(): ports available"},
	{"port_info", py_port_info, METH_VARARGS, "port_info(port): dict name, driver, max_rx_queues, rss_offloads"},
	{"port_setup", py_port_setup, METH_VARARGS,
	 "port_setup(port, queues, ring_size, mempool_size, mbuf_size, promiscuous): configure and start; returns the RSS hash "
	 "functions in use"},
	{"rx_burst_packed", py_rx_burst_packed, METH_VARARGS,
	 "rx_burst_packed(port, queue, max, timeout_us, frames) -> n: rx_burst into a probe._records.Frames"},
	{"rx_burst", py_rx_burst, METH_VARARGS,
	 "rx_burst(port, queue, max, timeout_us): (data, ts_ns, wirelen) lists; polls with the GIL released"},
	{"port_stats", py_port_stats, METH_VARARGS, "port_stats(port): dict ipackets, imissed, ierrors, rx_nombuf"},
	{"port_stop", py_port_stop, METH_VARARGS, "port_stop(port)"},
	{"port_close", py_port_close, METH_VARARGS, "port_close(port)"},
	{"eal_cleanup", py_eal_cleanup, METH_NOARGS, "eal_cleanup(): release EAL resources (once, at exit)"},
	{NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
	PyModuleDef_HEAD_INIT, "_dpdk", "DPDK capture for dnsprobe (see probe/capture/dpdk.py)", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__dpdk(void)
{
	/* rx_burst_packed needs probe._records; rx_burst does not. */
	if (records_import() < 0)
		PyErr_Clear();
	PyObject *m = PyModule_Create(&module);
	if (m == NULL)
		return NULL;
	DpdkError = PyErr_NewException("probe.capture._dpdk.DpdkError", PyExc_RuntimeError, NULL);
	if (DpdkError == NULL || PyModule_AddObject(m, "DpdkError", DpdkError) < 0) {
		Py_XDECREF(DpdkError);
		Py_DECREF(m);
		return NULL;
	}
	Py_INCREF(DpdkError);
	PyModule_AddStringConstant(m, "RTE_VERSION", rte_version());
	return m;
}
