/*
 * The watcher (docs/failover.md, "Detection"): one thread per process, in C and without the
 * GIL, that looks at each watched connection every LOOK_EVERY_NS and finds a dead path while
 * its rank computes, or waits in C, or in Python. A Python thread could not: it would starve
 * behind the GIL while the rank computes.
 *
 * Dead: bytes in flight that the peer's kernel has not acknowledged, not one, for DEAD_AFTER
 * (a pulled cable; a live peer's kernel acknowledges within a round trip even while its
 * process is stopped or computing, and a peer slow to read closes its window, which leaves
 * nothing unacknowledged), or a connection that has ended by itself (keepalive, for an idle
 * one: socket_mesh.notice_dead_links; a reset). Not TCP_USER_TIMEOUT: it also ends a
 * connection whose peer is alive but slow to read.
 *
 * On a dead path it shuts the socket down both ways: the next read there is the end of the
 * stream and the next send EPIPE, which every path meets (the engine's poll wakes on it, a C
 * lane returns to the engine), and keeps why, which `watched(fd)` returns for the engine's
 * message. Only a socket still the one watched (same inode) is shut: an fd closed and
 * reused without unwatch is dropped, never touched.
 *
 * Linux: TCP_INFO's tcpi_unacked, tcpi_notsent_bytes and tcpi_snd_wnd (in flight), and
 * tcpi_bytes_acked (progress). macOS: TCP_CONNECTION_INFO (XNU's struct
 * tcp_connection_info): bytes in the send buffer under an open window, packets received,
 * and packets retransmitted (two needed as well: macOS counts no timeouts in a row, and a
 * packet may be lost on a live path). Elsewhere: keepalive's end only.
 *
 * Cost: one getsockopt and one fstat per connection per look, 0.7 us here: at 100 ms, a
 * rank with 16 peers spends ~0.01% of a core; a job without failover starts no thread.
 *
 * Its state is behind one mutex, taken by the thread and by the module's functions (which
 * hold the GIL: the thread never takes it, so they cannot deadlock); the mutex orders every
 * access on any CPU, ARM64 included.
 */
#include "watch.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#if defined(__APPLE__)
#include <netinet/tcp_fsm.h> /* TCPS_CLOSED, tcp_connection_info's states */
#endif

#define LOOK_EVERY_NS 100000000L /* 100 ms */
#define DEAD_AFTER 1.0           /* seconds with bytes in flight and none acknowledged */
#define WATCH_MAX 4096           /* connections of one process */

enum why { ALIVE = 0, STALLED = 1, ENDED = 2 };

struct watched {
    int fd;
    dev_t dev; /* the socket's identity when watched: an fd reused is another socket */
    ino_t ino;
    enum why why;
    int error;       /* ENDED: the socket's error */
    double since;    /* STALLED: since when nothing was acknowledged (0: not stalled) */
    uint64_t mark;   /* the progress counter then (bytes acknowledged; macOS: packets in) */
    uint64_t resent; /* macOS: packets retransmitted then */
    uint64_t flight; /* bytes in flight at the last look */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work = PTHREAD_COND_INITIALIZER;
static struct watched watched_set[WATCH_MAX];
static int watched_count;
static int thread_started;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A look's findings: whether bytes are in flight, the counter that moves when the peer
 * answers, and (macOS) packets retransmitted; 0 where the socket has ended (then *error). */
struct look {
    int ended;
    int error;
    uint64_t flight;
    uint64_t progress;
    uint64_t resent;
};

#if defined(__linux__)
/* struct tcp_info's offsets (linux/tcp.h, a stable ABI): glibc's copy lacks the later fields */
#define TI_STATE 0
#define TI_UNACKED 24
#define TI_BYTES_ACKED 120 /* Linux 4.1 */
#define TI_NOTSENT 144     /* Linux 4.6 */
#define TI_SND_WND 228     /* Linux 5.4 */
#define TI_LEN 232
#define TI_CLOSE 7 /* TCP_CLOSE */

static uint32_t u32_at(const unsigned char *info, size_t at)
{
    uint32_t value;
    memcpy(&value, info + at, sizeof value);
    return value;
}

/* In flight: bytes sent and not acknowledged, and bytes not sent though the peer's window is
 * open (measured in the cluster: a host whose own end of the cable went down keeps them
 * unsent, counting no retransmission, tcpi_unacked 0). A peer that is slow to read closes
 * its window: its unsent bytes are not counted. */
static int look_at(int fd, struct look *out)
{
    unsigned char info[TI_LEN];
    socklen_t len = sizeof info;
    memset(info, 0, sizeof info);
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, info, &len) < 0)
        return -1;
    out->ended = info[TI_STATE] == TI_CLOSE;
    out->flight = u32_at(info, TI_UNACKED);
    if (len >= TI_LEN && u32_at(info, TI_SND_WND))
        out->flight += u32_at(info, TI_NOTSENT);
    if (len < TI_BYTES_ACKED + 8) /* no progress counter: nothing counts as stalled */
        out->flight = 0;
    memcpy(&out->progress, info + TI_BYTES_ACKED, sizeof out->progress);
    out->resent = 0;
    return 0;
}
#elif defined(__APPLE__) && defined(TCP_CONNECTION_INFO)
static int look_at(int fd, struct look *out)
{
    struct tcp_connection_info info;
    socklen_t len = sizeof info;
    memset(&info, 0, sizeof info);
    if (getsockopt(fd, IPPROTO_TCP, TCP_CONNECTION_INFO, &info, &len) < 0)
        return -1;
    out->ended = info.tcpi_state == TCPS_CLOSED;
    /* the send buffer's bytes (sent or not), unless the peer closed its window (slow to read) */
    out->flight = info.tcpi_snd_wnd ? info.tcpi_snd_sbbytes : 0;
    out->progress = info.tcpi_rxpackets;
    out->resent = info.tcpi_txretransmitpackets;
    return 0;
}
#else
static int look_at(int fd, struct look *out)
{
    (void)fd;
    memset(out, 0, sizeof *out); /* keepalive's end comes through poll() as an error */
    return 0;
}
#endif

/* How many retransmissions a stall needs besides its time (macOS: see the top). */
#if defined(__APPLE__)
#define STALL_RESENT 2
#else
#define STALL_RESENT 0
#endif

static int still_the_socket(const struct watched *w)
{
    struct stat st;
    return fstat(w->fd, &st) == 0 && st.st_dev == w->dev && st.st_ino == w->ino;
}

static enum why judge(struct watched *w, double now)
{
    struct look seen;
    if (look_at(w->fd, &seen) < 0)
        return ALIVE;
    if (seen.ended) {
        int error = 0;
        socklen_t len = sizeof error;
        getsockopt(w->fd, SOL_SOCKET, SO_ERROR, &error, &len);
        w->error = error;
        return ENDED;
    }
    if (!seen.flight || !w->since || seen.progress != w->mark) {
        /* nothing in flight, or the peer answered since: a new stall starts (or none) */
        w->since = seen.flight ? now : 0;
        w->mark = seen.progress;
        w->resent = seen.resent;
        return ALIVE;
    }
    w->flight = seen.flight;
    if (now - w->since >= DEAD_AFTER && (int64_t)(seen.resent - w->resent) >= STALL_RESENT)
        return STALLED;
    return ALIVE;
}

static void look_at_all(void)
{
    double now = now_s();
    for (int i = 0; i < watched_count; i++) {
        struct watched *w = &watched_set[i];
        if (w->why != ALIVE)
            continue;
        if (!still_the_socket(w)) { /* closed without unwatch: forget it */
            watched_set[i--] = watched_set[--watched_count];
            continue;
        }
        w->why = judge(w, now);
        if (w->why != ALIVE)
            shutdown(w->fd, SHUT_RDWR);
    }
}

static void *watch_loop(void *unused)
{
    (void)unused;
    struct timespec pause = {0, LOOK_EVERY_NS};
    for (;;) {
        pthread_mutex_lock(&lock);
        while (watched_count == 0)
            pthread_cond_wait(&work, &lock);
        look_at_all();
        pthread_mutex_unlock(&lock);
        nanosleep(&pause, NULL);
    }
    return NULL;
}

/* A forked child has no watcher thread: it starts its own if it watches. */
static void forget_in_child(void)
{
    pthread_mutex_init(&lock, NULL);
    pthread_cond_init(&work, NULL);
    watched_count = 0;
    thread_started = 0;
}

static int start_thread(void)
{
    pthread_t thread;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 64 << 10);
    int failed = pthread_create(&thread, &attr, watch_loop, NULL);
    pthread_attr_destroy(&attr);
    return failed;
}

static int find(int fd)
{
    for (int i = 0; i < watched_count; i++)
        if (watched_set[i].fd == fd)
            return i;
    return -1;
}

static int fd_of(PyObject *arg)
{
    long fd = PyLong_AsLong(arg);
    if (fd == -1 && PyErr_Occurred())
        return -1;
    if (fd < 0 || fd > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "watch: a socket's fd is needed");
        return -1;
    }
    return (int)fd;
}

/* watch(fd): look at this connection from now on (again from the start if watched). */
static PyObject *watch(PyObject *self, PyObject *arg)
{
    (void)self;
    int fd = fd_of(arg);
    if (fd < 0)
        return NULL;
    struct stat st;
    if (fstat(fd, &st) < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    pthread_mutex_lock(&lock);
    int at = find(fd);
    if (at < 0 && watched_count == WATCH_MAX) {
        pthread_mutex_unlock(&lock);
        PyErr_SetString(PyExc_RuntimeError, "watch: too many connections in one process");
        return NULL;
    }
    if (at < 0)
        at = watched_count++;
    watched_set[at] = (struct watched){.fd = fd, .dev = st.st_dev, .ino = st.st_ino};
    int failed = 0;
    if (!thread_started && !(failed = start_thread()))
        thread_started = 1;
    if (failed)
        watched_count--;
    pthread_cond_signal(&work);
    pthread_mutex_unlock(&lock);
    if (failed) {
        errno = failed;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

/* unwatch(fd): before the fd is closed or handed to another socket. */
static PyObject *unwatch(PyObject *self, PyObject *arg)
{
    (void)self;
    int fd = fd_of(arg);
    if (fd < 0)
        return NULL;
    pthread_mutex_lock(&lock);
    int at = find(fd);
    if (at >= 0)
        watched_set[at] = watched_set[--watched_count];
    pthread_mutex_unlock(&lock);
    Py_RETURN_NONE;
}

/* watched(fd) -> None while alive (or not watched), else what the watcher found, the socket
 * shut down: ("stalled", seconds, bytes in flight) or ("ended", errno). */
static PyObject *watched(PyObject *self, PyObject *arg)
{
    (void)self;
    int fd = fd_of(arg);
    if (fd < 0)
        return NULL;
    pthread_mutex_lock(&lock);
    int at = find(fd);
    struct watched w = at >= 0 ? watched_set[at] : (struct watched){.why = ALIVE};
    pthread_mutex_unlock(&lock);
    if (w.why == STALLED)
        return Py_BuildValue("(sdK)", "stalled", now_s() - w.since,
                             (unsigned long long)w.flight);
    if (w.why == ENDED)
        return Py_BuildValue("(si)", "ended", w.error);
    Py_RETURN_NONE;
}

static PyMethodDef watch_methods[] = {
    {"watch", watch, METH_O, "Watch a connection for a dead path (from a C thread)."},
    {"unwatch", unwatch, METH_O, "Stop watching a connection (before closing it)."},
    {"watched", watched, METH_O, "What the watcher found of a connection, or None."},
    {NULL, NULL, 0, NULL},
};

INTERNAL int add_watch(PyObject *module)
{
    static int once;
    if (!once && pthread_atfork(NULL, NULL, forget_in_child) != 0)
        return -1;
    once = 1;
    return PyModule_AddFunctions(module, watch_methods);
}
