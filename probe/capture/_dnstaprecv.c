/* probe.capture._dnstaprecv: read dnstap producers' connections on a C thread that never takes the interpreter lock.
 *
 * Why: a producer such as Knot DNS (libfstrm) writes a burst every 50 ms into its send buffer (about 200 KB: a
 * Unix stream socket has no receive buffer of its own) and drops, silently, what does not fit. A Python reader
 * thread waited 80 to 130 ms for the interpreter lock on a loaded machine (held by the worker's C calls over a
 * whole batch, by conversion threads) and lost bursts. This thread only moves bytes from the sockets into
 * per-connection buffers; the worker takes them and does everything else in Python (Frame Streams, the
 * handshake and its replies: probe/capture/dnstap_socket.py). Its Python twin, PythonReceiver in
 * probe/capture/dnstap_receive.py, reads the sockets itself when asked, on the worker's thread.
 *
 * Receiver(max_bytes): starts the thread. add(fd) / remove(fd): a connection (non-blocking or not: reads use
 * MSG_DONTWAIT) read from / no longer, its buffer freed; remove before closing the fd. ready() -> [fd]: the
 * connections holding bytes, or whose end was not yet taken. take(fd) -> (bytes, eof, errno): what arrived
 * from it since the last take; eof once it ended (errno 0: closed by the producer, else the error that ended
 * it), after which nothing more comes. fileno(): an eventfd readable when something arrived since the last
 * ready(). stalls(): how many times it stopped reading because max_bytes were held, all connections together
 * (it reads again once take() made room: the producers drop what they cannot send meanwhile, so the worker
 * logs it). realtime(): whether the thread got its real-time priority (PRIORITY). stop(): the thread stops;
 * take() and remove() still work (the rest is read by the caller).
 * close(): stop() and free everything.
 *
 * Pace: after a read the thread sleeps LINGER_NS before it waits for the sockets again, so that what the producers
 * write meanwhile is read in one go. The kernel's cost for the reader is per wake (the thread preempting the worker
 * on its CPU, epoll_wait, recv, the eventfd that wakes the worker), not per byte: Knot DNS writes 50 frames (8 KB)
 * a sendmsg(), and a thread woken by each one cost about 0.3 us of CPU per frame (docs/performance.md, dnstap).
 * What may queue meanwhile is a millisecond of the producers' writes: at most one burst of Knot DNS at 10,000 queries
 * per second (130 KB every 50 ms, docs/dnstap.md) within its socket buffer of about 200 KB; a producer that finds it
 * full waits that millisecond at most, far less than its queues hold. A read shorter than asked emptied the socket (a
 * stream socket's recv() copies from every queued write until it has what was asked for), so it is the last one:
 * no recv() that would only say EAGAIN.
 *
 * Locking: one mutex over the connections and their buffers, held by the thread around its reads and by the
 * calls above; the thread waits without it (epoll_wait, or the condition variable while full). Events are
 * looked up by fd under the mutex, so an event of a connection removed meanwhile finds nothing (or the new
 * connection that got the same fd, which is then read, as it should be).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define GROW 65536         /* buffer room made at least before a read */
#define EVENTS 64
#define PRIORITY 30        /* the thread's SCHED_FIFO priority, where allowed (CAP_SYS_NICE) */
#define LINGER_NS 1000000L /* the sleep after a read (see Pace above) */

typedef struct {
    int fd;
    int ended;     /* recv gave 0 or an error: no longer read */
    int error;     /* the errno that ended it, 0 at a clean end */
    int end_taken; /* take() returned the end */
    char *buf;
    size_t len, cap;
} Conn;

typedef struct {
    PyObject_HEAD
    pthread_mutex_t lock;
    pthread_cond_t room; /* take(), remove() or stop(): the thread may read again */
    Conn *conns;
    size_t n, cap;
    size_t held, max_bytes;
    unsigned long long stalls;
    int epfd, ready_fd, wake_fd;
    int stopping, running, closed;
    int realtime; /* the thread runs at SCHED_FIFO priority PRIORITY */
    pthread_t thread;
} Receiver;

static Conn *find(Receiver *r, int fd)
{
    for (size_t i = 0; i < r->n; i++)
        if (r->conns[i].fd == fd)
            return &r->conns[i];
    return NULL;
}

/* A file descriptor number from Python, or -1 with an exception set. */
static int fd_of(PyObject *arg)
{
    long fd = PyLong_AsLong(arg);
    if (fd == -1 && PyErr_Occurred())
        return -1;
    if (fd < 0 || fd > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "not a file descriptor: %ld", fd);
        return -1;
    }
    return (int)fd;
}

static void notify(int fd)
{
    uint64_t one = 1;
    ssize_t w = write(fd, &one, sizeof one); /* an eventfd: fails only when its counter would overflow */
    (void)w;
}

static void end_conn(Receiver *r, Conn *c, int error)
{
    c->ended = 1;
    c->error = error;
    epoll_ctl(r->epfd, EPOLL_CTL_DEL, c->fd, NULL);
}

/* Read what the connection has, until it is empty (a short read), it ends, or max_bytes are held (locked). Returns
 * whether anything changed. */
static int read_conn(Receiver *r, Conn *c)
{
    int changed = 0;
    while (!c->ended && r->held < r->max_bytes) {
        if (c->cap - c->len < GROW) {
            size_t cap = c->cap ? c->cap * 2 : GROW;
            while (cap - c->len < GROW)
                cap *= 2;
            char *buf = realloc(c->buf, cap);
            /* gcc -fanalyzer: not a leak, the buffer is the connection's (c->buf, freed by take, remove, close) */
            if (buf == NULL) {
                end_conn(r, c, ENOMEM);
                return 1;
            }
            c->buf = buf;
            c->cap = cap;
        }
        size_t want = c->cap - c->len;
        if (want > r->max_bytes - r->held)
            want = r->max_bytes - r->held;
        ssize_t got = recv(c->fd, c->buf + c->len, want, MSG_DONTWAIT);
        if (got > 0) {
            c->len += (size_t)got;
            r->held += (size_t)got;
            changed = 1;
            if ((size_t)got < want)
                break; /* the socket is empty: an EAGAIN saved (its end, if it came, is read on the next wake) */
        } else if (got == 0) {
            end_conn(r, c, 0);
            return 1;
        } else if (errno == EINTR) {
            continue;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            break;
        } else {
            end_conn(r, c, errno);
            return 1;
        }
    }
    return changed;
}

static void *run(void *arg)
{
    Receiver *r = arg;
    struct epoll_event events[EVENTS];
    for (;;) {
        pthread_mutex_lock(&r->lock);
        if (r->held >= r->max_bytes && !r->stopping) {
            r->stalls++;
            while (r->held >= r->max_bytes && !r->stopping)
                pthread_cond_wait(&r->room, &r->lock);
        }
        int stopping = r->stopping;
        pthread_mutex_unlock(&r->lock);
        if (stopping)
            return NULL;
        int n = epoll_wait(r->epfd, events, EVENTS, -1);
        if (n < 0 && errno == EINTR)
            continue; /* signals are blocked here, but a debugger may interrupt */
        if (n < 0)
            return NULL; /* cannot happen while the epoll is open; never spin at a real-time priority */
        int changed = 0;
        pthread_mutex_lock(&r->lock);
        for (int i = 0; i < n; i++) {
            int fd = events[i].data.fd;
            if (fd == r->wake_fd) {
                uint64_t count;
                ssize_t got = read(fd, &count, sizeof count);
                (void)got;
                continue;
            }
            Conn *c = find(r, fd);
            /* gcc -fanalyzer: no leak here either, read_conn's buffer stays the connection's (c->buf). */
            if (c != NULL)
                changed |= read_conn(r, c);
        }
        pthread_mutex_unlock(&r->lock);
        if (changed) {
            notify(r->ready_fd);
            struct timespec linger = {.tv_sec = 0, .tv_nsec = LINGER_NS};
            nanosleep(&linger, NULL); /* signals are blocked here: it sleeps the whole time */
        }
    }
}

static void stop_thread(Receiver *r)
{
    if (!r->running)
        return;
    pthread_mutex_lock(&r->lock);
    r->stopping = 1;
    pthread_cond_broadcast(&r->room);
    pthread_mutex_unlock(&r->lock);
    notify(r->wake_fd);
    Py_BEGIN_ALLOW_THREADS
    pthread_join(r->thread, NULL);
    Py_END_ALLOW_THREADS
    r->running = 0;
}

static void free_all(Receiver *r)
{
    stop_thread(r);
    for (size_t i = 0; i < r->n; i++)
        free(r->conns[i].buf);
    free(r->conns);
    r->conns = NULL;
    r->n = r->cap = r->held = 0;
    if (r->epfd >= 0)
        close(r->epfd);
    if (r->ready_fd >= 0)
        close(r->ready_fd);
    if (r->wake_fd >= 0)
        close(r->wake_fd);
    r->epfd = r->ready_fd = r->wake_fd = -1;
    r->closed = 1;
}

static int check_open(Receiver *r)
{
    if (r->closed) {
        PyErr_SetString(PyExc_ValueError, "the receiver is closed");
        return -1;
    }
    return 0;
}

/* The connection of the fd `arg` with the lock held, or NULL with an exception set (and the lock not held). */
static Conn *locked_conn(Receiver *r, PyObject *arg, int *fd)
{
    *fd = fd_of(arg);
    if (*fd < 0 || check_open(r) < 0)
        return NULL;
    pthread_mutex_lock(&r->lock);
    Conn *c = find(r, *fd);
    if (c == NULL) {
        pthread_mutex_unlock(&r->lock);
        PyErr_Format(PyExc_KeyError, "fd %d is not added", *fd);
    }
    return c;
}

static int Receiver_init(Receiver *r, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"max_bytes", NULL};
    Py_ssize_t max_bytes;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n", kwlist, &max_bytes))
        return -1;
    if (max_bytes <= 0) {
        PyErr_SetString(PyExc_ValueError, "max_bytes must be positive");
        return -1;
    }
    if (r->running || r->epfd >= 0) {
        PyErr_SetString(PyExc_RuntimeError, "a receiver is set up once");
        return -1;
    }
    r->max_bytes = (size_t)max_bytes;
    r->epfd = epoll_create1(EPOLL_CLOEXEC);
    r->ready_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    r->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = r->wake_fd};
    if (r->epfd < 0 || r->ready_fd < 0 || r->wake_fd < 0 || epoll_ctl(r->epfd, EPOLL_CTL_ADD, r->wake_fd, &ev) < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        free_all(r);
        return -1;
    }
    /* The thread takes no signal: the interpreter handles them on its own threads. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int err = pthread_create(&r->thread, NULL, run, r);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (err) {
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        free_all(r);
        return -1;
    }
    r->running = 1;
    r->closed = 0;
    /* Real-time: on a loaded machine a reader waiting tens of ms for a CPU lets the producer's buffer fill
     * (measured: docs/dnstap.md). Above the producers too, when they run at a real-time priority themselves
     * (the test runs Knot DNS at 20): a reader below them waits while they write. It sleeps unless bytes
     * arrive, and reads them at once. */
    struct sched_param sp = {.sched_priority = PRIORITY};
    r->realtime = pthread_setschedparam(r->thread, SCHED_FIFO, &sp) == 0;
    return 0;
}

static PyObject *Receiver_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    (void)args;
    (void)kwds;
    Receiver *r = (Receiver *)type->tp_alloc(type, 0);
    if (r == NULL)
        return NULL;
    /* Priority inheritance: a worker holding the lock runs at the thread's priority until it lets go. */
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_setprotocol(&attr, PTHREAD_PRIO_INHERIT);
    pthread_mutex_init(&r->lock, &attr);
    pthread_mutexattr_destroy(&attr);
    pthread_cond_init(&r->room, NULL);
    r->epfd = r->ready_fd = r->wake_fd = -1;
    r->closed = 1; /* until __init__ */
    return (PyObject *)r;
}

static void Receiver_dealloc(Receiver *r)
{
    free_all(r);
    pthread_cond_destroy(&r->room);
    pthread_mutex_destroy(&r->lock);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyObject *Receiver_add(Receiver *r, PyObject *arg)
{
    int fd = fd_of(arg);
    if (fd < 0)
        return NULL;
    if (check_open(r) < 0)
        return NULL;
    PyObject *result = NULL;
    pthread_mutex_lock(&r->lock);
    if (find(r, fd) != NULL) {
        PyErr_Format(PyExc_ValueError, "fd %d is added already", fd);
        goto done;
    }
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 16;
        Conn *conns = realloc(r->conns, cap * sizeof *conns);
        if (conns == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        r->conns = conns;
        r->cap = cap;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
    if (epoll_ctl(r->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    r->conns[r->n++] = (Conn){.fd = fd};
    result = Py_NewRef(Py_None);
done:
    pthread_mutex_unlock(&r->lock);
    return result;
}

static PyObject *Receiver_remove(Receiver *r, PyObject *arg)
{
    int fd;
    Conn *c = locked_conn(r, arg, &fd);
    if (c == NULL)
        return NULL;
    if (!c->ended)
        epoll_ctl(r->epfd, EPOLL_CTL_DEL, fd, NULL);
    r->held -= c->len;
    free(c->buf);
    *c = r->conns[--r->n];
    pthread_cond_signal(&r->room);
    pthread_mutex_unlock(&r->lock);
    Py_RETURN_NONE;
}

static PyObject *Receiver_take(Receiver *r, PyObject *arg)
{
    int fd;
    Conn *c = locked_conn(r, arg, &fd);
    if (c == NULL)
        return NULL;
    /* The buffer is taken away whole and copied out unlocked: the thread never waits for a copy (nor for a
     * worker preempted in the middle of one). */
    char *buf = c->buf;
    size_t len = c->len;
    c->buf = NULL;
    c->len = c->cap = 0;
    r->held -= len;
    int ended = c->ended, error = c->error;
    if (ended)
        c->end_taken = 1;
    pthread_cond_signal(&r->room);
    pthread_mutex_unlock(&r->lock);
    PyObject *data = PyBytes_FromStringAndSize(buf, (Py_ssize_t)len);
    free(buf);
    if (data == NULL)
        return NULL;
    return Py_BuildValue("(NOi)", data, ended ? Py_True : Py_False, error);
}

static PyObject *Receiver_ready(Receiver *r, PyObject *Py_UNUSED(ignored))
{
    if (check_open(r) < 0)
        return NULL;
    uint64_t count;
    ssize_t got = read(r->ready_fd, &count, sizeof count); /* before the look: what arrives after it notifies again */
    (void)got;
    int ready[64];
    size_t n = 0;
    PyObject *fds = PyList_New(0);
    if (fds == NULL)
        return NULL;
    pthread_mutex_lock(&r->lock); /* no allocation while the thread may wait for it */
    int more = 0;
    for (size_t i = 0; i < r->n; i++) {
        Conn *c = &r->conns[i];
        if (!c->len && !(c->ended && !c->end_taken))
            continue;
        if (n == sizeof ready / sizeof *ready) {
            more = 1; /* the rest on the next call, which the eventfd calls for */
            break;
        }
        ready[n++] = c->fd;
    }
    pthread_mutex_unlock(&r->lock);
    if (more)
        notify(r->ready_fd);
    for (size_t i = 0; i < n; i++) {
        PyObject *fd = PyLong_FromLong(ready[i]);
        if (fd == NULL || PyList_Append(fds, fd) < 0) {
            Py_XDECREF(fd);
            Py_DECREF(fds);
            return NULL;
        }
        Py_DECREF(fd);
    }
    return fds;
}

static PyObject *Receiver_fileno(Receiver *r, PyObject *Py_UNUSED(ignored))
{
    if (check_open(r) < 0)
        return NULL;
    return PyLong_FromLong(r->ready_fd);
}

static PyObject *Receiver_stalls(Receiver *r, PyObject *Py_UNUSED(ignored))
{
    pthread_mutex_lock(&r->lock);
    unsigned long long stalls = r->stalls;
    pthread_mutex_unlock(&r->lock);
    return PyLong_FromUnsignedLongLong(stalls);
}

static PyObject *Receiver_realtime(Receiver *r, PyObject *Py_UNUSED(ignored))
{
    return PyBool_FromLong(r->realtime);
}

static PyObject *Receiver_stop(Receiver *r, PyObject *Py_UNUSED(ignored))
{
    stop_thread(r);
    Py_RETURN_NONE;
}

static PyObject *Receiver_close(Receiver *r, PyObject *Py_UNUSED(ignored))
{
    free_all(r);
    Py_RETURN_NONE;
}

static PyMethodDef Receiver_methods[] = {
    {"add", (PyCFunction)Receiver_add, METH_O, "add(fd): read this connection from now on"},
    {"remove", (PyCFunction)Receiver_remove, METH_O, "remove(fd): no longer (before the fd is closed)"},
    {"take", (PyCFunction)Receiver_take, METH_O, "take(fd) -> (bytes, eof, errno): what arrived since the last take"},
    {"ready", (PyCFunction)Receiver_ready, METH_NOARGS, "ready() -> [fd]: connections with bytes or an end to take"},
    {"fileno", (PyCFunction)Receiver_fileno, METH_NOARGS, "an eventfd, readable when something arrived"},
    {"stalls", (PyCFunction)Receiver_stalls, METH_NOARGS, "times reading stopped because max_bytes were held"},
    {"realtime", (PyCFunction)Receiver_realtime, METH_NOARGS, "whether the thread got real-time priority"},
    {"stop", (PyCFunction)Receiver_stop, METH_NOARGS, "stop reading; take() and remove() still work"},
    {"close", (PyCFunction)Receiver_close, METH_NOARGS, "stop and free everything"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ReceiverType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "probe.capture._dnstaprecv.Receiver",
    .tp_basicsize = sizeof(Receiver),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Reads registered connections on a thread without the interpreter lock (see the module's source).",
    .tp_new = Receiver_new,
    .tp_init = (initproc)Receiver_init,
    .tp_dealloc = (destructor)Receiver_dealloc,
    .tp_methods = Receiver_methods,
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT, .m_name = "probe.capture._dnstaprecv", .m_size = -1,
};

PyMODINIT_FUNC PyInit__dnstaprecv(void)
{
    if (PyType_Ready(&ReceiverType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Receiver", (PyObject *)&ReceiverType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
