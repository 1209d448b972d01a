/*
 * probe.capture._dpdk: the small part of DPDK that dnsprobe needs, as a CPython extension (no Python reference:
 * probe/capture/dpdk.py drives it).
 *
 * Built by setup.py only when `pkg-config --exists libdpdk` succeeds (Debian: libdpdk-dev).
 * Python side: probe/capture/dpdk.py. Functions:
 *
 *   eal_init(args)                        rte_eal_init with argv = args (a list of str); once per process
 *   proc_type()                           "primary" or "secondary" (DPDK multi-process: --proc-type)
 *   port_count()                          ports EAL found (PCI devices bound to DPDK, --vdev devices)
 *   port_info(port)                       dict: name, driver, max_rx_queues, rss_offloads
 *   port_setup(port, queues, ring_size, mempool_size, mbuf_size, promiscuous)
 *                                         configure `queues` RX queues (no TX), symmetric RSS on the IP addresses
 *                                         where the device hashes, one mbuf pool, start; returns the RSS hash
 *                                         functions in use (0: no RSS)
 *   make_rings(workers, size)             primary: a ring per other worker, for port_poller(..., distribute=True)
 *   port_poller(port, queues, capacity, distribute) -> Poller
 *                                         reads RX queues; distributing, it passes the frames of workers 1..n-1 to
 *                                         their rings by the flow hash of their IP address pair and keeps worker 0's
 *   ring_poller(worker) -> Poller         secondary: reads the ring the primary fills for `worker`
 *   Poller.read(max, timeout_us, frames)  poll with the GIL released (see poll_source) and add the frames to a
 *                                         probe._records.Frames (FrameBatch.packed) pointing into their mbufs, which
 *                                         are freed when the Frames lets go of them (Frames.clear()); one thread at
 *                                         a time reads a poller, or a queue (claim_source)
 *   frames_from_mbufs(mbufs, frames)      test hook (no EAL): mbuf chains made of bytes through the code that
 *                                         Poller.read runs on what it receives (add_frames); fuzz/fuzz_dpdk.py
 *   ring_stats()                          primary: (passed, dropped as the ring was full, waiting) per worker ring
 *   rx_burst(port, queue, max, timeout_us)
 *                                         one poll of a queue as (data, ts_ns, wirelen) lists (copies; mbufs freed)
 *   port_stats(port)                      dict: ipackets, imissed, ierrors, rx_nombuf (rte_eth_stats)
 *   pool_size(port)                       mbufs in the port's pool (0: none made yet)
 *   pool_bytes(port)                      bytes of memory they take
 *   port_stop(port), port_close(port), eal_cleanup()
 *                                         refused while a poll reads the port; a port closed while frames point
 *                                         into its mbufs keeps its pool until they let go of them; eal_cleanup is
 *                                         refused while any do
 *   af_packet_map(fd, addr, rx_bytes, total_bytes)
 *                                         put the RX ring of a packet socket where the net_af_packet PMD reads its
 *                                         ring (probe/capture/dpdk_af_packet.py)
 *
 * Timestamps: DPDK gives no per-packet time by default, so a frame is stamped with the TSC read right after
 * the rte_eth_rx_burst() call that returned it (all frames of one hardware burst share it). Cycles become
 * nanoseconds since the epoch through a base pair (TSC, CLOCK_REALTIME) taken at eal_init and re-taken at
 * most once a second, so the stamps follow NTP adjustments of the system clock. A frame passed to another
 * worker's ring carries its time in the mbuf (the receive-time dynamic field).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <sys/mman.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_bus.h>
#include <rte_mbuf_dyn.h>
#include <rte_mbuf_pool_ops.h>
#include <rte_mempool.h>
#include <rte_ring.h>
#include <rte_version.h>

#include "records.h"
#include "wire.h"

#define MAX_QUEUES 128
#define RX_CHUNK 64 /* frames asked of one rte_eth_rx_burst call */
#define MAX_WORKERS 128
#define HOLD_US 1000 /* how long frames already received wait for more, unless the poller says otherwise */

static PyObject *DpdkError;
static int eal_ready = 0;
static struct rte_mempool *pools[RTE_MAX_ETHPORTS];
static unsigned int rx_queues[RTE_MAX_ETHPORTS]; /* RX queues set up by port_setup (0: none, or stopped) */

/* Batches of frames (MbufHold) still pointing into mbufs, per port (ring pollers' holds under RTE_MAX_ETHPORTS:
 * their mbufs are the primary's), and the pool of a port closed while some were: freed with the last of them, so
 * that no frame ever points into a freed pool (see port_close). Changed with the GIL held. */
static unsigned long held[RTE_MAX_ETHPORTS + 1];
static struct rte_mempool *closed_pools[RTE_MAX_ETHPORTS];

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

static int
need_eal(void)
{
	if (!eal_ready) {
		PyErr_SetString(DpdkError, "the DPDK EAL is not initialised");
		return -1;
	}
	return 0;
}

/* A port number as Python gave it (not yet cut to DPDK's 16 bits, which would make 65536 port 0). */
static int
check_port(unsigned int port)
{
	if (need_eal() < 0)
		return -1;
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
	if (need_eal() < 0)
		return NULL;
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

/* May the pool's mbufs span pages? Only where nothing needs them contiguous in IO addresses: a software
 * device (bus vdev: net_af_packet, net_pcap copy frames in with the CPU), or IOVA as VA (virtual contiguity is
 * IO contiguity). Without hugepages the pages are 4 KiB, and an mbuf that may not span one takes a page of its
 * own: the pool's memory would be 1.7 times its mbufs'. With hugepages the loss is negligible either way. */
static int
scattered_ok(const struct rte_eth_dev_info *info)
{
	if (rte_eal_has_hugepages())
		return 0;
	if (rte_eal_iova_mode() == RTE_IOVA_VA)
		return 1;
	const struct rte_bus *bus = info->device ? rte_dev_bus(info->device) : NULL;
	return bus != NULL && strcmp(rte_bus_name(bus), "vdev") == 0;
}

/* rte_pktmbuf_pool_create, with RTE_MEMPOOL_F_NO_IOVA_CONTIG when scattered_ok. */
static struct rte_mempool *
mbuf_pool(const char *name, unsigned int n, uint16_t data_room, int socket, int scattered)
{
	if (!scattered)
		return rte_pktmbuf_pool_create(name, n, 256, 0, data_room, socket);
	struct rte_pktmbuf_pool_private priv = {.mbuf_data_room_size = data_room, .mbuf_priv_size = 0};
	struct rte_mempool *mp = rte_mempool_create_empty(name, n, sizeof(struct rte_mbuf) + data_room, 256,
							  sizeof(priv), socket, RTE_MEMPOOL_F_NO_IOVA_CONTIG);
	if (mp == NULL)
		return NULL;
	int rc = rte_mempool_set_ops_byname(mp, rte_mbuf_best_mempool_ops(), NULL);
	if (rc == 0) {
		rte_pktmbuf_pool_init(mp, &priv);
		rc = rte_mempool_populate_default(mp);
		rc = rc < 0 ? rc : 0;
	}
	if (rc != 0) {
		rte_mempool_free(mp);
		rte_errno = -rc;
		return NULL;
	}
	rte_mempool_obj_iter(mp, rte_pktmbuf_init, NULL);
	return mp;
}

/* RSS of several queues in conf: the hash functions in use (0: none). Symmetric Toeplitz: a key of repeated
 * 0x6d5a hashes (a, b) and (b, a) alike, so both directions of a flow reach the same queue (Woo and Park,
 * "Scalable TCP Session Monitoring with Symmetric RSS"). The IP addresses only (no ports): what every packet of
 * a flow has in common, its fragments included, as the AF_PACKET fanout program and `read --workers` split.
 * rss_hf 0: the device has no RSS on IP; its driver spreads the frames its own way (net_af_packet: its sockets'
 * fanout), or queue 0 gets them all. */
static uint64_t
rss_setup(struct rte_eth_conf *conf, const struct rte_eth_dev_info *info)
{
	static uint8_t key[64];
	uint64_t rss_hf = RTE_ETH_RSS_IP & info->flow_type_rss_offloads;
	for (size_t k = 0; k < sizeof(key); k += 2) {
		key[k] = 0x6d;
		key[k + 1] = 0x5a;
	}
	if (rss_hf)
		conf->rxmode.mq_mode = RTE_ETH_MQ_RX_RSS;
	conf->rx_adv_conf.rss_conf.rss_hf = rss_hf;
	if (info->hash_key_size && info->hash_key_size <= sizeof(key)) {
		conf->rx_adv_conf.rss_conf.rss_key = key;
		conf->rx_adv_conf.rss_conf.rss_key_len = info->hash_key_size;
	}
	return rss_hf;
}

/* The port's mbuf pool, made by its first setup. NULL with an exception. */
static struct rte_mempool *
port_pool(unsigned int port, unsigned int size, unsigned int mbuf_size, int socket, const struct rte_eth_dev_info *info)
{
	if (closed_pools[port] != NULL) {
		PyErr_Format(DpdkError, "frames still point into the mbufs of port %u's last pool (it was closed)", port);
		return NULL;
	}
	if (pools[port] == NULL) {
		char pool_name[RTE_MEMPOOL_NAMESIZE];
		snprintf(pool_name, sizeof(pool_name), "dnsprobe_p%u", port);
		pools[port] = mbuf_pool(pool_name, size, (uint16_t)(mbuf_size + RTE_PKTMBUF_HEADROOM), socket,
					scattered_ok(info));
		if (pools[port] == NULL)
			raise_dpdk("cannot create the mbuf pool (dpdk.mempool_size; hugepages?)", rte_errno);
	}
	return pools[port];
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
	uint64_t rss_hf = queues > 1 ? rss_setup(&conf, &info) : 0;
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
	if (port_pool(port, mempool_size, mbuf_size, socket, &info) == NULL)
		return NULL;
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

/* ---------------------------------------------------------------------------------------------
 * Polling a source (a port's RX queues, or a worker's ring) until a batch is ready
 *
 * A poll takes frames until it has `max`, or has had frames for hold_us and finds the source empty, or
 * timeout_us passed without any. Holding on to the frames for a while (dpdk.batch_timeout_ms, as AF_PACKET's
 * block timeout) makes batches of thousands of frames at moderate rates instead of a handful: the work per batch
 * (a Python call, the pipeline's steps) is then spread over many frames. While the source is empty the poller
 * sleeps, for a time its controller keeps between MIN_SLEEP_NS and the source's max_sleep: doubled when the frames
 * found after a sleep fill less than an eighth of the source's capacity, halved when they fill more than half of
 * it. max_sleep is the time half the capacity takes to fill at ASSUMED_PPS (at most MAX_SLEEP_NS): a source that
 * was idle overflows during the first sleep only above that rate. A busy source is never slept on (the poller
 * only sleeps when it finds it empty); wake-ups, each a context switch, are a large part of the cost of a
 * moderate rate, hence the long sleeps where the capacity allows them. */

#define MIN_SLEEP_NS 10000ULL
#define MAX_SLEEP_NS 8000000ULL
#define ASSUMED_PPS 1000000ULL

/* The receive time of an mbuf passed from the process that received it to another (ns since the epoch). */
static int ts_offset = -1;
static uint64_t ts_flag = 0;

static inline uint64_t *
mbuf_ts(struct rte_mbuf *m)
{
	return RTE_MBUF_DYNFIELD(m, ts_offset, uint64_t *);
}

/* The workers' rings of a distributing primary (rings[k] for worker k, 1 <= k < workers), or a secondary's own
 * ring (rings[0]); what was passed to each and what was dropped because it was full. */
static struct rte_ring *rings[MAX_WORKERS];
static unsigned int workers = 1;
static uint64_t ring_passed[MAX_WORKERS], ring_full[MAX_WORKERS];

/* The RX queues being read (by poll_source, GIL released): a queue is read by one thread at a time (DPDK's
 * rte_eth_rx_burst is not thread-safe on one queue), and a port is not stopped or closed while one of its queues
 * is being read. Claimed and released with the GIL held. */
static unsigned char queue_reading[RTE_MAX_ETHPORTS][MAX_QUEUES];
static unsigned int port_reading[RTE_MAX_ETHPORTS];

typedef struct {
	PyObject_HEAD
	unsigned int port;
	uint16_t queues[MAX_QUEUES];
	unsigned int nq;
	struct rte_ring *ring; /* read this ring instead of the port's queues */
	unsigned int worker; /* whose ring that is */
	int distribute; /* pass the frames of the other workers to their rings */
	unsigned int capacity; /* frames the source holds (RX descriptors, ring slots): the sleep controller's unit */
	uint64_t sleep_ns, max_sleep_ns;
	unsigned long long hold_us; /* how long frames already received wait for more (see poll_source) */
	unsigned long long frames; /* frames this poller gave (this process's share) */
	int reading; /* a poll_source of this poller is running (GIL released): a second one is refused */
	/* one poll's frames and their receive times (ns): room for `room` */
	struct rte_mbuf **mbufs;
	uint64_t *ns;
	unsigned int room;
	struct rte_mbuf **stage; /* distributing: RX_CHUNK per worker */
	unsigned int *staged;
} Poller;

static PyTypeObject Poller_Type;

/* The worker of a frame: its IP address pair's flow hash (include/wire.h, as `read --workers` and the AF_PACKET
 * fanout program split) modulo the workers; a VLAN tag the device took off is put back first, as select_share
 * does, so that the tags are counted alike. */
static inline unsigned int
worker_of(struct rte_mbuf *m)
{
	const unsigned char *f = rte_pktmbuf_mtod(m, const unsigned char *);
	Py_ssize_t len = rte_pktmbuf_data_len(m);
	uint32_t h;
	if (m->ol_flags & RTE_MBUF_F_RX_VLAN_STRIPPED && len >= 12) {
		unsigned char tmp[128];
		Py_ssize_t keep = len - 12 < (Py_ssize_t)sizeof(tmp) - 16 ? len - 12 : (Py_ssize_t)sizeof(tmp) - 16;
		memcpy(tmp, f, 12);
		tmp[12] = 0x81, tmp[13] = 0x00, tmp[14] = (unsigned char)(m->vlan_tci >> 8), tmp[15] = (unsigned char)m->vlan_tci;
		memcpy(tmp + 16, f + 12, keep);
		h = flow_hash(tmp, keep + 16, 1);
	} else {
		h = flow_hash(f, len, 1);
	}
	return h % workers;
}

/* Take up to `want` frames of this process's share from the source into p->mbufs + at (with their times in
 * p->ns); *seen: how many frames the source gave in all (the others' included). GIL released. */
static unsigned int
fetch(Poller *p, unsigned int at, unsigned int want, uint64_t b_tsc, uint64_t b_ns, unsigned int *seen)
{
	struct rte_mbuf **out = p->mbufs + at;
	uint64_t *ns = p->ns + at;
	if (p->ring != NULL) {
		unsigned int n = rte_ring_dequeue_burst(p->ring, (void **)out, want, NULL);
		for (unsigned int k = 0; k < n; k++)
			ns[k] = *mbuf_ts(out[k]);
		*seen = n;
		return n;
	}
	unsigned int own = 0, total = 0;
	for (unsigned int qi = 0; qi < p->nq && own < want; qi++) {
		struct rte_mbuf *burst[RX_CHUNK];
		unsigned int chunk = want - own < RX_CHUNK ? want - own : RX_CHUNK;
		uint16_t n = rte_eth_rx_burst(p->port, p->queues[qi], p->distribute ? burst : out + own, (uint16_t)chunk);
		if (!n)
			continue;
		uint64_t t = tsc_to_ns(rte_get_tsc_cycles(), b_tsc, b_ns);
		total += n;
		if (!p->distribute) {
			for (uint16_t k = 0; k < n; k++)
				ns[own + k] = t;
			own += n;
			continue;
		}
		for (unsigned int w = 1; w < workers; w++)
			p->staged[w] = 0;
		/* burst[0..n) is what rte_eth_rx_burst wrote (gcc -fanalyzer: "uninitialized value", it cannot see that) */
		for (uint16_t k = 0; k < n; k++) {
			unsigned int w = worker_of(burst[k]);
			if (w == 0) {
				out[own] = burst[k]; /* (gcc -fanalyzer: as above) */
				ns[own++] = t;
			} else {
				*mbuf_ts(burst[k]) = t; /* (gcc -fanalyzer: as above) */
				p->stage[w * RX_CHUNK + p->staged[w]++] = burst[k];
			}
		}
		for (unsigned int w = 1; w < workers; w++) {
			unsigned int c = p->staged[w];
			if (!c)
				continue;
			struct rte_mbuf **s = p->stage + w * RX_CHUNK;
			unsigned int done = rte_ring_enqueue_burst(rings[w], (void *const *)s, c, NULL);
			ring_passed[w] += done;
			if (done < c) {
				ring_full[w] += c - done;
				rte_pktmbuf_free_bulk(s + done, c - done);
			}
		}
	}
	*seen = total;
	return own;
}

static void
sleep_ns(uint64_t ns)
{
	struct timespec ts = {(time_t)(ns / 1000000000ULL), (long)(ns % 1000000000ULL)};
	nanosleep(&ts, NULL);
}

static int poll_claimed(Poller *p, unsigned int max, unsigned long long timeout_us, unsigned int *got_out);

/* What is being read (GIL released) besides the port queues (queue_reading): each worker's ring (single
 * consumer), and the port by a distributing poller (the single producer of the workers' rings). */
static unsigned char ring_reading[MAX_WORKERS];
static int distributing;

/* Claim what a poll of p reads, with the GIL held: the poller itself (its mbufs and ns arrays, its controller),
 * its RX queues or its ring, and the workers' rings it fills. A Poller may be shared between threads, but a
 * second read while one runs (the GIL released) is refused, as is a read of a queue or a ring another poller is
 * reading, or a second distributing read: two rte_eth_rx_burst calls on one queue, two consumers or producers of
 * a single-consumer or single-producer ring, or two polls filling one p->mbufs, would hand mbufs out twice. */
static int
claim_source(Poller *p)
{
	const char *busy = NULL;
	if (p->reading)
		busy = "this poller is being read by another thread (a poller is read by one thread at a time)";
	else if (p->ring != NULL && ring_reading[p->worker])
		busy = "the ring of this worker is being read by another thread";
	else if (p->distribute && distributing)
		busy = "another thread is distributing frames to the workers' rings";
	for (unsigned int qi = 0; busy == NULL && p->ring == NULL && qi < p->nq; qi++)
		if (queue_reading[p->port][p->queues[qi]])
			busy = "an RX queue of this poller is being read by another thread";
	if (busy != NULL) {
		PyErr_SetString(DpdkError, busy);
		return -1;
	}
	if (p->ring != NULL) {
		ring_reading[p->worker] = 1;
	} else {
		for (unsigned int qi = 0; qi < p->nq; qi++)
			queue_reading[p->port][p->queues[qi]] = 1;
		port_reading[p->port]++;
	}
	distributing |= p->distribute;
	p->reading = 1;
	return 0;
}

static void
release_source(Poller *p)
{
	if (p->ring != NULL) {
		ring_reading[p->worker] = 0;
	} else {
		for (unsigned int qi = 0; qi < p->nq; qi++)
			queue_reading[p->port][p->queues[qi]] = 0;
		port_reading[p->port]--;
	}
	if (p->distribute)
		distributing = 0;
	p->reading = 0;
}

/* One poll (see above) into p->mbufs[0..*got). GIL released inside; -1 with an exception. On success p stays
 * claimed until the caller, done with p->mbufs and p->ns, calls release_source (Python code that may run
 * meanwhile, a collection's finaliser, must not start another poll into them). */
static int
poll_source(Poller *p, unsigned int max, unsigned long long timeout_us, unsigned int *got_out)
{
	if (p->ring == NULL) {
		if (check_port(p->port) < 0)
			return -1;
		for (unsigned int qi = 0; qi < p->nq; qi++) {
			if (p->queues[qi] >= rx_queues[p->port]) { /* DPDK itself does not check (only in its debug builds) */
				PyErr_Format(DpdkError, "RX queue %u of port %u is not set up (%u queue(s) are)", p->queues[qi],
					     p->port, rx_queues[p->port]);
				return -1;
			}
		}
	}
	if (claim_source(p) < 0)
		return -1;
	if (poll_claimed(p, max, timeout_us, got_out) < 0) {
		release_source(p);
		return -1;
	}
	return 0;
}

/* poll_source once p is claimed. */
static int
poll_claimed(Poller *p, unsigned int max, unsigned long long timeout_us, unsigned int *got_out)
{
	if (max == 0)
		max = 1;
	if (max > p->room) {
		struct rte_mbuf **m = PyMem_Realloc(p->mbufs, sizeof(*m) * max);
		if (m == NULL) {
			PyErr_NoMemory();
			return -1;
		}
		p->mbufs = m;
		uint64_t *ns = PyMem_Realloc(p->ns, sizeof(*ns) * max);
		if (ns == NULL) {
			PyErr_NoMemory();
			return -1;
		}
		p->ns = ns;
		p->room = max;
	}
	uint64_t now = rte_get_tsc_cycles();
	if (now - base_tsc > tsc_hz)
		clock_rebase();
	uint64_t b_tsc = base_tsc, b_ns = base_ns;
	unsigned int got = 0;

	/* (hold_us read with the GIL held: another thread may set it meanwhile) */
	uint64_t hold = (uint64_t)((unsigned __int128)p->hold_us * tsc_hz / 1000000ULL), first = 0;
	Py_BEGIN_ALLOW_THREADS;
	uint64_t deadline = now + (uint64_t)((unsigned __int128)timeout_us * tsc_hz / 1000000ULL);
	unsigned long long refill = 0; /* frames the source gave since the poller last slept */
	int slept = 0;
	while (got < max) {
		unsigned int seen;
		unsigned int n = fetch(p, got, max - got, b_tsc, b_ns, &seen);
		if (n && !got)
			first = rte_get_tsc_cycles();
		got += n;
		refill += seen;
		if (seen)
			continue;
		/* the source is empty: judge the last sleep by what came meanwhile, then hand over or sleep */
		if (slept) {
			if (refill * 2 > p->capacity)
				p->sleep_ns = p->sleep_ns / 2 < MIN_SLEEP_NS ? MIN_SLEEP_NS : p->sleep_ns / 2;
			else if (refill * 8 < p->capacity)
				p->sleep_ns = p->sleep_ns * 2 > p->max_sleep_ns ? p->max_sleep_ns : p->sleep_ns * 2;
		}
		uint64_t t = rte_get_tsc_cycles(), until;
		if (got) {
			if (t - first >= hold)
				break;
			until = first + hold;
		} else {
			if (t >= deadline)
				break;
			until = deadline;
		}
		uint64_t left = (uint64_t)((unsigned __int128)(until - t) * 1000000000ULL / tsc_hz);
		sleep_ns(left < p->sleep_ns ? left : p->sleep_ns);
		slept = 1;
		refill = 0;
	}
	Py_END_ALLOW_THREADS;
	*got_out = got;
	return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Frames straight from the mbufs */

/* The bytes of an mbuf's frame: its pkt_len, but never more than its segments hold (data_len each, along the chain
 * to its end or nb_segs): a device that says more (pkt_len above the data_len of a single segment, or a chain
 * shorter than pkt_len) gives a frame of what its segments hold, counted as truncated, and nothing past them is
 * read. rte_pktmbuf_read is not used for this: it trusts pkt_len, and follows `next` past the chain's end. */
static uint32_t
mbuf_caplen(const struct rte_mbuf *m)
{
	uint32_t len = rte_pktmbuf_pkt_len(m), got = 0;
	const struct rte_mbuf *s = m;
	for (unsigned int k = 0; s != NULL && k < m->nb_segs && got < len; k++, s = s->next)
		got += rte_pktmbuf_data_len(s) < len - got ? rte_pktmbuf_data_len(s) : len - got;
	return got;
}

/* Is the frame (caplen bytes) in its first segment, where a frame may point? Else it is copied (mbuf_copy). An
 * indirect or external-buffer mbuf is copied too, unless there is nothing to copy (no copy buffer is made for
 * frames of no bytes: fuzz_dpdk's first finding). */
static inline int
mbuf_contiguous(const struct rte_mbuf *m, uint32_t caplen)
{
	return caplen == 0 || (RTE_MBUF_DIRECT(m) && caplen <= rte_pktmbuf_data_len(m));
}

/* The first caplen bytes (mbuf_caplen) of m's segments to `to`. */
static void
mbuf_copy(const struct rte_mbuf *m, uint32_t caplen, unsigned char *to)
{
	for (const struct rte_mbuf *s = m; caplen > 0; s = s->next) {
		uint32_t n = rte_pktmbuf_data_len(s) < caplen ? rte_pktmbuf_data_len(s) : caplen;
		memcpy(to, rte_pktmbuf_mtod(s, const unsigned char *), n);
		to += n;
		caplen -= n;
	}
}

/* mbufs[0..n) (received at ns[k]) added to frames: a frame in the first segment of its mbuf points into it (the
 * caller makes the frames hold the mbufs, or their memory), the others are copied into one bytes object the
 * frames hold. A VLAN tag the device took off is the frame's tag (put back when the frame is read). The code of
 * Poller.read, and of frames_from_mbufs, the test hook that runs it on mbufs made of bytes. -1 with an exception. */
static int
add_frames(struct rte_mbuf *const *mbufs, const uint64_t *ns, unsigned int n, Frames *frames)
{
	size_t copied = 0;
	for (unsigned int k = 0; k < n; k++) {
		uint32_t caplen = mbuf_caplen(mbufs[k]);
		if (!mbuf_contiguous(mbufs[k], caplen))
			copied += caplen;
	}
	PyObject *buf = NULL;
	if (copied) {
		buf = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)copied);
		if (buf == NULL || records->frames_own(frames, buf) < 0) {
			Py_XDECREF(buf);
			return -1;
		}
	}
	size_t off = 0;
	int rc = 0;
	for (unsigned int k = 0; k < n && rc == 0; k++) {
		struct rte_mbuf *m = mbufs[k];
		uint32_t caplen = mbuf_caplen(m);
		const unsigned char *d = rte_pktmbuf_mtod(m, const unsigned char *);
		if (!mbuf_contiguous(m, caplen)) {
			unsigned char *to = (unsigned char *)PyBytes_AS_STRING(buf) + off;
			mbuf_copy(m, caplen, to);
			d = to;
			off += caplen;
		}
		uint32_t tag = m->ol_flags & RTE_MBUF_F_RX_VLAN_STRIPPED ? (0x8100u << 16) | m->vlan_tci : 0;
		rc = records->frames_add(frames, d, caplen, rte_pktmbuf_pkt_len(m), (int64_t)ns[k], tag);
	}
	Py_XDECREF(buf); /* (held by the frames) */
	return rc;
}

/* The mbufs a Frames points into; freed when the Frames lets go of them (Frames.clear(), or its end). Counted in
 * held[slot] (slot: the port of a port poller, RTE_MAX_ETHPORTS for a ring poller) while it lives. */
typedef struct {
	PyObject_HEAD
	struct rte_mbuf **mbufs;
	unsigned int n;
	unsigned int slot;
} MbufHold;

static void
mbufhold_dealloc(PyObject *self)
{
	MbufHold *h = (MbufHold *)self;
	if (h->n) {
		rte_pktmbuf_free_bulk(h->mbufs, h->n);
		if (--held[h->slot] == 0 && h->slot < RTE_MAX_ETHPORTS && closed_pools[h->slot] != NULL) {
			rte_mempool_free(closed_pools[h->slot]); /* its port was closed while these frames lived */
			closed_pools[h->slot] = NULL;
		}
	}
	PyMem_Free(h->mbufs);
	Py_TYPE(self)->tp_free(self);
}

static PyTypeObject MbufHold_Type = EXT_TYPE(MbufHold, "probe.capture._dpdk.MbufHold", 0,
	"mbufs a probe._records.Frames points into, freed with it", .tp_dealloc = mbufhold_dealloc);

/* p->mbufs[0..got) into frames (add_frames), which hold the mbufs (an MbufHold) until they let go of them. Every
 * mbuf is taken over (freed) also on failure. -1 with an exception. */
static int
hold_frames(Poller *p, unsigned int got, Frames *frames)
{
	if (!got)
		return 0;
	MbufHold *h = PyObject_New(MbufHold, &MbufHold_Type);
	struct rte_mbuf **copy = PyMem_Malloc(sizeof(*copy) * got);
	if (h == NULL || copy == NULL) {
		if (h != NULL) {
			h->mbufs = NULL;
			h->n = 0;
			Py_DECREF(h);
		}
		PyMem_Free(copy);
		rte_pktmbuf_free_bulk(p->mbufs, got);
		PyErr_NoMemory();
		return -1;
	}
	memcpy(copy, p->mbufs, sizeof(*copy) * got);
	h->mbufs = copy;
	h->n = got;
	h->slot = p->ring != NULL ? RTE_MAX_ETHPORTS : p->port;
	held[h->slot]++;
	int rc = records->frames_own(frames, (PyObject *)h);
	Py_DECREF(h); /* the frames hold it now (or nothing does, and it freed the mbufs) */
	if (rc < 0 || add_frames(copy, p->ns, got, frames) < 0)
		return -1;
	p->frames += got;
	return 0;
}

/* frames_from_mbufs(mbufs, frames) -> n: the test hook of add_frames, without the EAL: each item of `mbufs`,
 * (segments, pkt_len, ts_ns, vlan_tci or -1, indirect), is made an mbuf chain of those segments (bytes objects,
 * which the frames then hold) whose first says pkt_len, nb_segs the number of segments, its VLAN tag taken off
 * (vlan_tci >= 0) and an indirect mbuf (indirect true), as a device would give it. fuzz/fuzz_dpdk.py and
 * tests/run/test_dpdk_safety.py run it. */
static PyObject *
py_frames_from_mbufs(PyObject *Py_UNUSED(self), PyObject *args)
{
	PyObject *items;
	Frames *frames;
	if (records == NULL) {
		PyErr_SetString(PyExc_RuntimeError, "frames_from_mbufs needs probe._records, which is not built");
		return NULL;
	}
	if (!PyArg_ParseTuple(args, "O!O!:frames_from_mbufs", &PyList_Type, &items, records->frames_type, &frames))
		return NULL;
	Py_ssize_t n = PyList_GET_SIZE(items), segs = 0;
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *it = PyList_GET_ITEM(items, i);
		if (!PyTuple_Check(it) || PyTuple_GET_SIZE(it) != 5 || !PyTuple_Check(PyTuple_GET_ITEM(it, 0)) ||
		    PyTuple_GET_SIZE(PyTuple_GET_ITEM(it, 0)) < 1 || PyTuple_GET_SIZE(PyTuple_GET_ITEM(it, 0)) > UINT16_MAX) {
			PyErr_SetString(PyExc_TypeError, "frames_from_mbufs: (segments: tuple of 1 to 65535 bytes, pkt_len, ts_ns,"
					" vlan_tci, indirect) items");
			return NULL;
		}
		segs += PyTuple_GET_SIZE(PyTuple_GET_ITEM(it, 0));
	}
	struct rte_mbuf *pool = PyMem_Calloc(segs ? (size_t)segs : 1, sizeof(*pool));
	struct rte_mbuf **heads = PyMem_Calloc(n ? (size_t)n : 1, sizeof(*heads));
	uint64_t *ns = PyMem_Calloc(n ? (size_t)n : 1, sizeof(*ns));
	PyObject *result = NULL;
	if (pool == NULL || heads == NULL || ns == NULL) {
		PyErr_NoMemory();
		goto out;
	}
	struct rte_mbuf *m = pool;
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *it = PyList_GET_ITEM(items, i), *sg = PyTuple_GET_ITEM(it, 0);
		unsigned long pkt_len = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(it, 1));
		long long ts = PyLong_AsLongLong(PyTuple_GET_ITEM(it, 2));
		long vlan = PyLong_AsLong(PyTuple_GET_ITEM(it, 3));
		int indirect = PyObject_IsTrue(PyTuple_GET_ITEM(it, 4));
		if (PyErr_Occurred() || indirect < 0 || pkt_len > UINT32_MAX || vlan > UINT16_MAX) {
			if (!PyErr_Occurred())
				PyErr_SetString(PyExc_ValueError, "frames_from_mbufs: pkt_len in 32 bits, vlan_tci in 16");
			goto out;
		}
		heads[i] = m;
		ns[i] = (uint64_t)ts;
		for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(sg); k++, m++) {
			PyObject *b = PyTuple_GET_ITEM(sg, k);
			if (!PyBytes_Check(b) || PyBytes_GET_SIZE(b) > UINT16_MAX) {
				PyErr_SetString(PyExc_TypeError, "frames_from_mbufs: segments are bytes of at most 65535");
				goto out;
			}
			if (records->frames_own(frames, b) < 0)
				goto out;
			m->buf_addr = PyBytes_AS_STRING(b);
			m->buf_len = m->data_len = (uint16_t)PyBytes_GET_SIZE(b);
			m->next = k + 1 < PyTuple_GET_SIZE(sg) ? m + 1 : NULL;
		}
		heads[i]->nb_segs = (uint16_t)PyTuple_GET_SIZE(sg);
		heads[i]->pkt_len = (uint32_t)pkt_len;
		heads[i]->ol_flags = (vlan >= 0 ? RTE_MBUF_F_RX_VLAN_STRIPPED : 0) | (indirect ? RTE_MBUF_F_INDIRECT : 0);
		heads[i]->vlan_tci = vlan >= 0 ? (uint16_t)vlan : 0;
	}
	if (add_frames(heads, ns, (unsigned int)n, frames) == 0)
		result = PyLong_FromSsize_t(n);
out:
	PyMem_Free(pool);
	PyMem_Free(heads);
	PyMem_Free(ns);
	return result;
}

/* ---------------------------------------------------------------------------------------------
 * Poller objects */

static void
poller_dealloc(PyObject *self)
{
	Poller *p = (Poller *)self;
	PyMem_Free(p->mbufs);
	PyMem_Free(p->ns);
	PyMem_Free(p->stage);
	PyMem_Free(p->staged);
	Py_TYPE(self)->tp_free(self);
}

static Poller *
poller_new(unsigned int capacity)
{
	/* zeroed: no queue, ring, frame or buffer yet */
	Poller *p = (Poller *)PyType_GenericAlloc(&Poller_Type, 0);
	if (p == NULL)
		return NULL;
	p->capacity = capacity ? capacity : 1;
	p->sleep_ns = MIN_SLEEP_NS;
	p->max_sleep_ns = p->capacity * 1000000000ULL / 2 / ASSUMED_PPS;
	if (p->max_sleep_ns > MAX_SLEEP_NS)
		p->max_sleep_ns = MAX_SLEEP_NS;
	if (p->max_sleep_ns < MIN_SLEEP_NS)
		p->max_sleep_ns = MIN_SLEEP_NS;
	p->hold_us = HOLD_US;
	return p;
}

/* read(max, timeout_us, frames) -> n */
static PyObject *
poller_read(PyObject *self, PyObject *args)
{
	Poller *p = (Poller *)self;
	unsigned int max;
	unsigned long long timeout_us;
	Frames *frames;
	if (records == NULL) {
		PyErr_SetString(PyExc_RuntimeError, "a DPDK poller needs probe._records, which is not built");
		return NULL;
	}
	if (!PyArg_ParseTuple(args, "IKO!:read", &max, &timeout_us, records->frames_type, &frames))
		return NULL;
	unsigned int got;
	if (poll_source(p, max, timeout_us, &got) < 0)
		return NULL;
	int rc = hold_frames(p, got, frames);
	release_source(p);
	return rc < 0 ? NULL : PyLong_FromUnsignedLong(got);
}

static PyObject *
poller_get_frames(PyObject *self, void *Py_UNUSED(closure))
{
	return PyLong_FromUnsignedLongLong(((Poller *)self)->frames);
}

static PyObject *
poller_get_sleep(PyObject *self, void *Py_UNUSED(closure))
{
	return PyLong_FromUnsignedLongLong(((Poller *)self)->sleep_ns);
}

static PyMethodDef poller_methods[] = {
	{"read", poller_read, METH_VARARGS,
	 "read(max, timeout_us, frames) -> n: poll (GIL released) and add this process's frames to a probe._records.Frames;"
	 " they point into their mbufs, which are freed when the Frames lets go of them (clear())"},
	{NULL, NULL, 0, NULL},
};

static PyObject *
poller_get_hold(PyObject *self, void *Py_UNUSED(closure))
{
	return PyLong_FromUnsignedLongLong(((Poller *)self)->hold_us);
}

static int
poller_set_hold(PyObject *self, PyObject *value, void *Py_UNUSED(closure))
{
	unsigned long long us = value == NULL ? (unsigned long long)-1 : PyLong_AsUnsignedLongLong(value);
	if (us == (unsigned long long)-1) {
		if (!PyErr_Occurred())
			PyErr_SetString(PyExc_TypeError, "hold_us: microseconds, an int");
		return -1;
	}
	((Poller *)self)->hold_us = us;
	return 0;
}

static PyGetSetDef poller_getset[] = {
	{"hold_us", poller_get_hold, poller_set_hold, "how long frames already received wait for more (microseconds)",
	 NULL},
	{"frames", poller_get_frames, NULL, "frames this poller gave", NULL},
	{"sleep_ns", poller_get_sleep, NULL, "the current sleep of its controller while the source is empty", NULL},
	{NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject Poller_Type = EXT_TYPE(Poller, "probe.capture._dpdk.Poller", 0,
	"a source of frames: RX queues of a port (port_poller) or a worker's ring (ring_poller)",
	.tp_dealloc = poller_dealloc, .tp_methods = poller_methods, .tp_getset = poller_getset);

/* port_poller(port, queues, capacity, distribute) -> Poller */
static PyObject *
py_port_poller(PyObject *Py_UNUSED(self), PyObject *args)
{
	unsigned int port, capacity;
	PyObject *queues;
	int distribute;
	if (!PyArg_ParseTuple(args, "IO!Ip:port_poller", &port, &PyTuple_Type, &queues, &capacity, &distribute))
		return NULL;
	if (check_port(port) < 0)
		return NULL;
	Py_ssize_t nq = PyTuple_GET_SIZE(queues);
	if (nq < 1 || nq > MAX_QUEUES) {
		PyErr_Format(DpdkError, "a poller reads 1 to %d queues", MAX_QUEUES);
		return NULL;
	}
	if (distribute && workers < 2) {
		PyErr_SetString(DpdkError, "nothing to distribute to: make_rings() first");
		return NULL;
	}
	if (rte_eal_process_type() != RTE_PROC_PRIMARY) { /* a secondary reads the queues its primary set up */
		struct rte_eth_dev_info info;
		int rc = rte_eth_dev_info_get(port, &info);
		if (rc != 0)
			return raise_dpdk("cannot read the device information", rc);
		rx_queues[port] = info.nb_rx_queues;
	}
	Poller *p = poller_new(capacity);
	if (p == NULL)
		return NULL;
	p->port = port;
	for (Py_ssize_t i = 0; i < nq; i++) {
		unsigned long q = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(queues, i));
		if (q == (unsigned long)-1 && PyErr_Occurred()) {
			Py_DECREF(p);
			return NULL;
		}
		if (q >= MAX_QUEUES) {
			PyErr_Format(DpdkError, "RX queue %lu: at most %d queues", q, MAX_QUEUES);
			Py_DECREF(p);
			return NULL;
		}
		p->queues[p->nq++] = (uint16_t)q;
	}
	if (distribute) {
		p->distribute = 1;
		p->stage = PyMem_Calloc((size_t)workers * RX_CHUNK, sizeof(*p->stage));
		p->staged = PyMem_Calloc(workers, sizeof(*p->staged));
		if (p->stage == NULL || p->staged == NULL) {
			Py_DECREF(p);
			return PyErr_NoMemory();
		}
	}
	return (PyObject *)p;
}

static void
ring_name(char *out, size_t size, unsigned int worker)
{
	snprintf(out, size, "dnsprobe_w%u", worker);
}

/* make_rings(workers, size): the primary's rings, one per other worker (1..workers-1), of `size` slots (a power
 * of 2), and the receive-time field of the mbufs passed through them. */
static PyObject *
py_make_rings(PyObject *Py_UNUSED(self), PyObject *args)
{
	unsigned int n, size;
	if (!PyArg_ParseTuple(args, "II:make_rings", &n, &size))
		return NULL;
	if (need_eal() < 0)
		return NULL;
	if (rte_eal_process_type() != RTE_PROC_PRIMARY) {
		PyErr_SetString(DpdkError, "the workers' rings are the primary process's to make");
		return NULL;
	}
	if (n < 2 || n > MAX_WORKERS || workers > 1) {
		PyErr_Format(DpdkError, "make_rings: 2 to %d workers, once", MAX_WORKERS);
		return NULL;
	}
	if (rte_mbuf_dyn_rx_timestamp_register(&ts_offset, &ts_flag) < 0)
		return raise_dpdk("cannot register the mbufs' receive-time field", rte_errno);
	for (unsigned int w = 1; w < n; w++) {
		char name[RTE_RING_NAMESIZE];
		ring_name(name, sizeof(name), w);
		rings[w] = rte_ring_create(name, size, (int)rte_socket_id(), RING_F_SP_ENQ | RING_F_SC_DEQ);
		if (rings[w] == NULL) {
			PyErr_Format(DpdkError, "cannot make the ring of worker %u (%u slots): %s", w, size,
				     rte_strerror(rte_errno));
			for (unsigned int k = 1; k < w; k++) {
				rte_ring_free(rings[k]);
				rings[k] = NULL;
			}
			return NULL;
		}
	}
	memset(ring_passed, 0, sizeof(ring_passed));
	memset(ring_full, 0, sizeof(ring_full));
	workers = n;
	Py_RETURN_NONE;
}

/* ring_poller(worker) -> Poller: a secondary's poller of the ring the primary fills for it. */
static PyObject *
py_ring_poller(PyObject *Py_UNUSED(self), PyObject *args)
{
	unsigned int worker;
	if (!PyArg_ParseTuple(args, "I:ring_poller", &worker))
		return NULL;
	if (need_eal() < 0)
		return NULL;
	if (worker >= MAX_WORKERS) {
		PyErr_Format(DpdkError, "worker %u: at most %d workers", worker, MAX_WORKERS);
		return NULL;
	}
	char name[RTE_RING_NAMESIZE];
	ring_name(name, sizeof(name), worker);
	struct rte_ring *r = rte_ring_lookup(name);
	if (r == NULL) {
		PyErr_Format(DpdkError, "the primary process has no ring for worker %u", worker);
		return NULL;
	}
	if (ts_offset < 0) {
		ts_offset = rte_mbuf_dynfield_lookup(RTE_MBUF_DYNFIELD_TIMESTAMP_NAME, NULL);
		if (ts_offset < 0)
			return raise_dpdk("the primary process registered no receive-time field", rte_errno);
	}
	Poller *p = poller_new(rte_ring_get_capacity(r));
	if (p != NULL) {
		p->ring = r;
		p->worker = worker;
		rings[0] = r;
	}
	return (PyObject *)p;
}

/* ring_stats() -> [(passed, full, waiting)] per worker 1..n-1 (the primary's view of its rings). */
static PyObject *
py_ring_stats(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(noargs))
{
	PyObject *out = PyList_New(0);
	for (unsigned int w = 1; out != NULL && w < workers; w++) {
		PyObject *t = Py_BuildValue("(KKI)", (unsigned long long)ring_passed[w], (unsigned long long)ring_full[w],
					    rte_ring_count(rings[w]));
		if (t == NULL || PyList_Append(out, t) < 0)
			Py_CLEAR(out);
		Py_XDECREF(t);
	}
	return out;
}

static PyObject *
py_proc_type(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(noargs))
{
	if (need_eal() < 0)
		return NULL;
	return PyUnicode_FromString(rte_eal_process_type() == RTE_PROC_PRIMARY ? "primary" : "secondary");
}

/* af_packet_map(fd, addr, rx_bytes, total_bytes): map the RX ring of packet socket fd at addr (where the
 * net_af_packet PMD's ring of total_bytes is), replacing that mapping, and reserve the rest of it (the PMD's
 * TX ring, never used here) as inaccessible memory, so that nothing else is mapped where the PMD will unmap. */
static PyObject *
py_af_packet_map(PyObject *Py_UNUSED(self), PyObject *args)
{
	int fd;
	unsigned long long addr, rx_bytes, total;
	if (!PyArg_ParseTuple(args, "iKKK:af_packet_map", &fd, &addr, &rx_bytes, &total))
		return NULL;
	if (rx_bytes == 0 || rx_bytes > total || addr % 4096) {
		PyErr_SetString(PyExc_ValueError, "af_packet_map: a page-aligned mapping that holds the RX ring");
		return NULL;
	}
	void *at = (void *)(uintptr_t)addr;
	void *m = mmap(at, rx_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_LOCKED, fd, 0);
	if (m == MAP_FAILED)
		return PyErr_SetFromErrno(PyExc_OSError);
	if (total > rx_bytes) {
		m = mmap((char *)at + rx_bytes, total - rx_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
			 -1, 0);
		if (m == MAP_FAILED)
			return PyErr_SetFromErrno(PyExc_OSError);
	}
	Py_RETURN_NONE;
}

static PyObject *
py_rx_burst(PyObject *Py_UNUSED(self), PyObject *args)
{
	unsigned int port, queue, max;
	unsigned long long timeout_us;
	if (!PyArg_ParseTuple(args, "IIIK", &port, &queue, &max, &timeout_us))
		return NULL;
	if (check_port(port) < 0)
		return NULL;
	Poller *p = poller_new(1024);
	if (p == NULL)
		return NULL;
	p->port = port;
	p->queues[0] = queue < MAX_QUEUES ? (uint16_t)queue : MAX_QUEUES;
	p->nq = 1;
	unsigned int got;
	if (queue >= MAX_QUEUES) {
		PyErr_Format(DpdkError, "RX queue %u of port %u is not set up (%u queue(s) are)", queue, port, rx_queues[port]);
		Py_DECREF(p);
		return NULL;
	}
	if (poll_source(p, max, timeout_us, &got) < 0) {
		Py_DECREF(p);
		return NULL;
	}
	PyObject *data = PyList_New(got), *ts = PyList_New(got), *wirelen = PyList_New(got);
	int failed = data == NULL || ts == NULL || wirelen == NULL;
	for (unsigned int k = 0; k < got && !failed; k++) {
		struct rte_mbuf *m = p->mbufs[k];
		uint32_t caplen = mbuf_caplen(m);
		PyObject *b = PyBytes_FromStringAndSize(NULL, caplen);
		PyObject *t = PyLong_FromUnsignedLongLong(p->ns[k]);
		PyObject *w = PyLong_FromUnsignedLong(rte_pktmbuf_pkt_len(m));
		if (b == NULL || t == NULL || w == NULL) {
			Py_XDECREF(b);
			Py_XDECREF(t);
			Py_XDECREF(w);
			failed = 1;
			break;
		}
		mbuf_copy(m, caplen, (unsigned char *)PyBytes_AS_STRING(b));
		PyList_SET_ITEM(data, k, b);
		PyList_SET_ITEM(ts, k, t);
		PyList_SET_ITEM(wirelen, k, w);
	}
	if (got)
		rte_pktmbuf_free_bulk(p->mbufs, got);
	release_source(p);
	Py_DECREF(p);
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
py_pool_size(PyObject *Py_UNUSED(self), PyObject *args)
{
	unsigned int port;
	if (parse_port(args, &port) < 0)
		return NULL;
	return PyLong_FromUnsignedLong(pools[port] ? pools[port]->size : 0);
}

/* Bytes of memory the port's pool holds its mbufs in (the sum of its memory chunks): the test of scattered_ok. */
static PyObject *
py_pool_bytes(PyObject *Py_UNUSED(self), PyObject *args)
{
	unsigned int port;
	if (parse_port(args, &port) < 0)
		return NULL;
	unsigned long long bytes = 0;
	if (pools[port]) {
		struct rte_mempool_memhdr *hdr;
		STAILQ_FOREACH(hdr, &pools[port]->mem_list, next)
			bytes += hdr->len;
	}
	return PyLong_FromUnsignedLongLong(bytes);
}

/* A port is stopped or closed only while no poll reads it (a poll in another thread, the GIL released). */
static int
not_reading(unsigned int port)
{
	if (port_reading[port]) {
		PyErr_Format(DpdkError, "port %u is being read by a poller in another thread", port);
		return -1;
	}
	return 0;
}

static PyObject *
py_port_stop(PyObject *Py_UNUSED(self), PyObject *args)
{
	unsigned int port;
	if (parse_port(args, &port) < 0 || not_reading(port) < 0)
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
	if (parse_port(args, &port) < 0 || not_reading(port) < 0)
		return NULL;
	rx_queues[port] = 0;
	int rc = rte_eth_dev_close(port);
	if (rc != 0)
		return raise_dpdk("cannot close the port", rc);
	if (pools[port] != NULL) {
		/* Frames that still point into the pool's mbufs keep it: it is freed with the last of them. */
		if (held[port])
			closed_pools[port] = pools[port];
		else
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
	/* The EAL's memory is unmapped: frames pointing into mbufs would point nowhere, and their mbufs be freed into
	 * pools that are gone. */
	unsigned long batches = 0;
	for (unsigned int k = 0; k <= RTE_MAX_ETHPORTS; k++)
		batches += held[k];
	if (batches) {
		PyErr_Format(DpdkError, "%lu batch(es) of frames still point into mbufs: let go of them (Frames.clear())"
			     " before the EAL is cleaned up", batches);
		return NULL;
	}
	for (unsigned int k = 0; k < RTE_MAX_ETHPORTS; k++)
		if (port_reading[k]) {
			PyErr_SetString(DpdkError, "a poller is reading a port (in another thread)");
			return NULL;
		}
	for (unsigned int w = 0; w < MAX_WORKERS; w++)
		rings[w] = NULL;
	workers = 1;
	int rc = rte_eal_cleanup();
	if (rc != 0)
		return raise_dpdk("EAL cleanup failed", rc);
	eal_ready = 0; /* DPDK cannot be initialised again in this process */
	Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
	{"eal_init", py_eal_init, METH_VARARGS, "eal_init(args): rte_eal_init with argv = args (list of str)"},
	{"proc_type", py_proc_type, METH_NOARGS, "proc_type(): 'primary' or 'secondary'"},
	{"port_count", py_port_count, METH_NOARGS, "port_count(): ports available"},
	{"port_info", py_port_info, METH_VARARGS, "port_info(port): dict name, driver, max_rx_queues, rss_offloads"},
	{"port_setup", py_port_setup, METH_VARARGS,
	 "port_setup(port, queues, ring_size, mempool_size, mbuf_size, promiscuous): configure and start; returns the RSS hash "
	 "functions in use"},
	{"make_rings", py_make_rings, METH_VARARGS, "make_rings(workers, size): the primary's ring for each other worker"},
	{"port_poller", py_port_poller, METH_VARARGS,
	 "port_poller(port, queues, capacity, distribute) -> Poller of those RX queues (distribute: pass the other workers' "
	 "frames to their rings)"},
	{"ring_poller", py_ring_poller, METH_VARARGS, "ring_poller(worker) -> Poller of the ring the primary fills for it"},
	{"ring_stats", py_ring_stats, METH_NOARGS, "ring_stats() -> [(passed, full, waiting)] for workers 1..n-1"},
	{"rx_burst", py_rx_burst, METH_VARARGS,
	 "rx_burst(port, queue, max, timeout_us): (data, ts_ns, wirelen) lists; polls with the GIL released"},
	{"port_stats", py_port_stats, METH_VARARGS, "port_stats(port): dict ipackets, imissed, ierrors, rx_nombuf"},
	{"pool_size", py_pool_size, METH_VARARGS, "pool_size(port): mbufs in the port's pool (0: none made)"},
	{"pool_bytes", py_pool_bytes, METH_VARARGS, "pool_bytes(port): bytes of memory the port's pool's mbufs take"},
	{"port_stop", py_port_stop, METH_VARARGS, "port_stop(port)"},
	{"port_close", py_port_close, METH_VARARGS, "port_close(port)"},
	{"eal_cleanup", py_eal_cleanup, METH_NOARGS, "eal_cleanup(): release EAL resources (once, at exit)"},
	{"frames_from_mbufs", py_frames_from_mbufs, METH_VARARGS,
	 "frames_from_mbufs(mbufs, frames) -> n: test hook: (segments, pkt_len, ts_ns, vlan_tci, indirect) items made mbufs "
	 "and added to frames as Poller.read adds what it receives"},
	{"af_packet_map", py_af_packet_map, METH_VARARGS,
	 "af_packet_map(fd, addr, rx_bytes, total_bytes): map a packet socket's RX ring over the net_af_packet PMD's ring"},
	{NULL, NULL, 0, NULL},
};

PyMODINIT_FUNC
PyInit__dpdk(void)
{
	/* Poller.read needs probe._records; rx_burst does not. */
	if (records_import() < 0)
		PyErr_Clear();
	PyObject *m = ext_module("probe.capture._dpdk", "DPDK capture for dnsprobe (see probe/capture/dpdk.py)",
				 methods, (PyTypeObject *[]){&Poller_Type, &MbufHold_Type, NULL}, NULL, NULL);
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
	PyModule_AddObject(m, "RSS_IP", PyLong_FromUnsignedLongLong(RTE_ETH_RSS_IP));
	PyModule_AddIntConstant(m, "RX_CHUNK", RX_CHUNK);
	return m;
}
