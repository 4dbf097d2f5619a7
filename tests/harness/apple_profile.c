/*
 * The Apple profile: the known rules of Apple's Thunderbolt RDMA driver (librdma.dylib,
 * macOS 26.2+), enforced over rdma-core's libibverbs.so.1, so that the RDMA lab's Soft-RoCE
 * fails where a Mac would. Loaded through TBCOLL_RDMA_LIBRARY; see
 * tests/harness/apple_profile.py.
 *
 * It exports only the 16 functions MLX's jaccl resolves from librdma.dylib (a program that
 * wants any other symbol, ibv_wc_status_str for one, fails to find it here as on a Mac), and
 * opens libibverbs.so.1 itself with RTLD_LOCAL: it is not linked against it, so dlsym on this
 * library's handle cannot reach rdma-core's other symbols through a dependency.
 *
 * The rules (sources in FACTS.md, "Apple's Thunderbolt RDMA driver"):
 * - UC queue pairs only: creating any other type fails (EINVAL; Apple's errno is unreported).
 * - One device context per device (several on one device deadlock Apple's driver: MLX PR #3245
 *   fell back to TCP for it): a second ibv_open_device fails with EBUSY.
 * - At most 10 queue pairs per device (MLX#3162, mlx PR 4209: the eleventh fails with EBUSY).
 * - Queue depth: ibv_create_qp accepts any depth and reports it back, as Apple's does
 *   (hellas-ai/thunderbolt-ibverbs#41), but a post that would leave more than 32 work requests
 *   outstanding on a queue fails with -ENOMEM (#35: "ibv_post_recv[63/256] ret=-12"; 32 is
 *   the depth known to be safe). post_send, post_recv and poll_cq are inline functions of
 *   verbs.h that call through the context's ops table, so ibv_open_device replaces those
 *   three entries of the context it returns with counting wrappers: a work request counts from
 *   its post until its completion is polled (an unsignaled send until a later signaled send of
 *   its queue pair completes, as hardware frees it).
 * - About 100 memory regions per device (MLX#3162): the 101st ibv_reg_mr fails with ENOMEM.
 * - Contexts, queue pairs and memory regions count per (device, host) across every process of
 *   the host, as Apple's driver counts them (see "Counted per host" below); each refusal says
 *   on stderr what was refused and which processes hold the rest ("apple-profile: refused ...").
 * - Path MTU 1024: ports report at most 1024, and an RTR transition asking more fails (EINVAL).
 * - The RTR transition fails with EINVAL (errno 22, MLX#3467) for a source GID index whose GID
 *   is not IPv4-mapped; each failure is written to stderr ("apple-profile: RTR refused ..."),
 *   since on a Mac repeated failed RTR transitions can wedge the port until reboot: a test can
 *   count them.
 * - A SEND that arrives before its RECV is posted is dropped without a completion: Soft-RoCE
 *   already does that on UC (rxe's responder drops the message, class D), nothing to add.
 *
 * Counted per host: the lab's VM is one machine with one rxe0, on which a test declares several
 * hosts, so "host" is what the job says: APPLE_PROFILE_HOST, else TBCOLL_JOB and
 * TBCOLL_NODE_RANK (two jobs at once in the lab are two clusters), else "host". The counts of a
 * (device, host) live in a small text file, APPLE_PROFILE_STATE/<host>.<device> (default folder
 * /tmp/tbcoll-apple-profile), locked with flock around each change: a line "peak C Q M" (the
 * most ever held at once, for a test to read) and a line "pid start C Q M" per process holding
 * any. A process that died holding some (start: its start time in /proc, against pid reuse) is
 * dropped by the next look, as the driver frees a dead process's resources.
 * APPLE_PROFILE_COUNT=process counts per process instead (this profile's first design: ranks
 * sharing rxe0 each got the whole allowance), for a test to show what that let through.
 *
 * What it cannot show: the driver's timing, credit flow control and wedged ports; anything of
 * Apple's not reported in public.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <infiniband/verbs.h>

#undef ibv_query_port /* verbs.h makes these inline wrappers; the exported functions are */
#undef ibv_reg_mr     /* what librdma.dylib and libibverbs.so.1 have */

#define EXPORT __attribute__((visibility("default")))
#define MAX_DEPTH 32
#define MAX_CONTEXTS 1
#define MAX_MRS 100
#define MAX_QPS_PER_DEVICE 10
#define MAX_MTU IBV_MTU_1024
#define TABLE 256 /* contexts, devices, queue pairs this process may hold at once */

static struct {
    struct ibv_device **(*get_device_list)(int *);
    void (*free_device_list)(struct ibv_device **);
    const char *(*get_device_name)(struct ibv_device *);
    struct ibv_context *(*open_device)(struct ibv_device *);
    int (*close_device)(struct ibv_context *);
    struct ibv_pd *(*alloc_pd)(struct ibv_context *);
    int (*dealloc_pd)(struct ibv_pd *);
    struct ibv_mr *(*reg_mr)(struct ibv_pd *, void *, size_t, int);
    int (*dereg_mr)(struct ibv_mr *);
    struct ibv_cq *(*create_cq)(struct ibv_context *, int, void *, struct ibv_comp_channel *,
                                int);
    int (*destroy_cq)(struct ibv_cq *);
    struct ibv_qp *(*create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
    int (*destroy_qp)(struct ibv_qp *);
    int (*modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
    int (*query_port)(struct ibv_context *, uint8_t, struct _compat_ibv_port_attr *);
    int (*query_gid)(struct ibv_context *, uint8_t, int, union ibv_gid *);
} R;

static int loaded; /* 1: R filled; -1: libibverbs.so.1 missing */
static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void load(void)
{
    void *lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
    loaded = -1;
    if (!lib) {
        fprintf(stderr, "apple-profile: cannot open libibverbs.so.1 (%s)\n", dlerror());
        return;
    }
#define REAL(field) \
    if (!(*(void **)&R.field = dlsym(lib, "ibv_" #field))) return
    REAL(get_device_list); REAL(free_device_list); REAL(get_device_name); REAL(open_device);
    REAL(close_device); REAL(alloc_pd); REAL(dealloc_pd); REAL(reg_mr); REAL(dereg_mr);
    REAL(create_cq); REAL(destroy_cq); REAL(create_qp); REAL(destroy_qp); REAL(modify_qp);
    REAL(query_port); REAL(query_gid);
#undef REAL
    loaded = 1;
}

static int ready(void)
{
    pthread_once(&once, load);
    if (loaded < 0)
        errno = ENOSYS;
    return loaded > 0;
}

/* --- what is counted ---------------------------------------------------------------------- */

enum { CONTEXTS, QPS, MRS, KINDS }; /* what is counted per (device, host) */

static const struct {
    const char *what;
    int limit, error;
    const char *why;
} KIND[KINDS] = {
    {"device context", MAX_CONTEXTS, EBUSY,
     "Apple's driver deadlocks with several contexts on one device: MLX PR #3245"},
    {"queue pair", MAX_QPS_PER_DEVICE, EBUSY,
     "Apple's driver allows about 10 per device across the host's processes: MLX #3162"},
    {"memory region", MAX_MRS, ENOMEM,
     "Apple's driver allows about 100 per device across the host's processes: MLX #3162"},
};

typedef struct { /* per device name: Apple's limits are per device */
    char name[64];
    int held[KINDS]; /* this process's: all that is counted under APPLE_PROFILE_COUNT=process */
    int failed_rtr;
} Device;

typedef struct { /* an opened context and the ops the provider gave it */
    struct ibv_context *ctx;
    int (*post_send)(struct ibv_qp *, struct ibv_send_wr *, struct ibv_send_wr **);
    int (*post_recv)(struct ibv_qp *, struct ibv_recv_wr *, struct ibv_recv_wr **);
    int (*poll_cq)(struct ibv_cq *, int, struct ibv_wc *);
} Context;

typedef struct { /* a queue pair's outstanding work requests, oldest first */
    struct ibv_qp *qp;
    int sig_all;
    int sends, send_head; /* ring of MAX_DEPTH: wr_id and whether signaled */
    uint64_t send_id[MAX_DEPTH];
    unsigned char send_signaled[MAX_DEPTH];
    int recvs, recv_head;
    uint64_t recv_id[MAX_DEPTH];
} Queue;

static Device devices[TABLE];
static Context contexts[TABLE];
static Queue queues[TABLE];

static Device *device_named(const char *name)
{
    Device *free_slot = NULL;
    for (int i = 0; i < TABLE; i++) {
        if (devices[i].name[0] && strcmp(devices[i].name, name) == 0)
            return &devices[i];
        if (!devices[i].name[0] && !free_slot)
            free_slot = &devices[i];
    }
    if (free_slot)
        snprintf(free_slot->name, sizeof free_slot->name, "%s", name);
    return free_slot;
}

static Device *device_of(struct ibv_context *ctx)
{
    return device_named(R.get_device_name(ctx->device));
}

static Context *context_of(struct ibv_context *ctx)
{
    for (int i = 0; i < TABLE; i++)
        if (contexts[i].ctx == ctx)
            return &contexts[i];
    return NULL;
}

static Queue *queue_of(struct ibv_qp *qp)
{
    for (int i = 0; i < TABLE; i++)
        if (queues[i].qp == qp)
            return &queues[i];
    return NULL;
}

static Queue *queue_by_number(struct ibv_context *ctx, uint32_t qp_num)
{
    for (int i = 0; i < TABLE; i++)
        if (queues[i].qp && queues[i].qp->context == ctx && queues[i].qp->qp_num == qp_num)
            return &queues[i];
    return NULL;
}

/* --- counted per (device, host), across processes (see "Counted per host" above) ----------- */

#define HOLDERS 256

typedef struct {
    long pid;
    unsigned long long start;
    int held[KINDS];
} Holder;

typedef struct {
    int peak[KINDS];
    int n;
    Holder holder[HOLDERS];
} Ledger;

/* The start time of process pid (/proc/PID/stat's 22nd field), or 0 where it is gone, a
 * zombie, or unreadable. */
static unsigned long long start_of(long pid)
{
    char path[64], text[1024];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t got = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[got] = 0;
    char *after = strrchr(text, ')'); /* the command name may hold spaces and parentheses */
    char state = 0;
    unsigned long long start = 0;
    /* after ") ": state, then 18 fields, then starttime */
    if (!after || sscanf(after + 1, " %c %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s "
                         "%*s %*s %*s %*s %*s %llu", &state, &start) != 2 || state == 'Z')
        return 0;
    return start;
}

static int holder_alive(const Holder *h)
{
    if (kill((pid_t)h->pid, 0) != 0 && errno == ESRCH)
        return 0;
    return start_of(h->pid) == h->start;
}

static void ledger_read(FILE *f, Ledger *l)
{
    memset(l, 0, sizeof *l);
    if (fscanf(f, "peak %d %d %d\n", &l->peak[0], &l->peak[1], &l->peak[2]) != KINDS)
        return;
    Holder h;
    while (l->n < HOLDERS && fscanf(f, "%ld %llu %d %d %d\n", &h.pid, &h.start, &h.held[0],
                                    &h.held[1], &h.held[2]) == 2 + KINDS)
        if (holder_alive(&h)) /* a dead process holds nothing */
            l->holder[l->n++] = h;
}

static void ledger_write(int fd, const Ledger *l)
{
    char text[64 + HOLDERS * 64];
    int at = snprintf(text, sizeof text, "peak %d %d %d\n", l->peak[0], l->peak[1], l->peak[2]);
    for (int i = 0; i < l->n; i++) {
        const Holder *h = &l->holder[i];
        if (h->held[0] || h->held[1] || h->held[2])
            at += snprintf(text + at, sizeof text - (size_t)at, "%ld %llu %d %d %d\n", h->pid,
                           h->start, h->held[0], h->held[1], h->held[2]);
    }
    if (ftruncate(fd, 0) == 0 && pwrite(fd, text, (size_t)at, 0) != at)
        fprintf(stderr, "apple-profile: cannot write its counts\n");
}

/* The host this process counts under: see "Counted per host". */
static void host_name(char *out, size_t size)
{
    const char *host = getenv("APPLE_PROFILE_HOST"), *node = getenv("TBCOLL_NODE_RANK");
    const char *job = getenv("TBCOLL_JOB");
    if (host && *host)
        snprintf(out, size, "%s", host);
    else if (node && *node)
        snprintf(out, size, "%s-node%s", job && *job ? job : "job", node);
    else
        snprintf(out, size, "host");
    for (char *c = out; *c; c++) /* a file name */
        if (!(*c == '-' || *c == '_' || (*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'z') ||
              (*c >= 'A' && *c <= 'Z')))
            *c = '_';
}

static int per_process(void)
{
    const char *count = getenv("APPLE_PROFILE_COUNT");
    return count && strcmp(count, "process") == 0;
}

/* Say what was refused and who holds the rest, as one line on stderr. */
static void tell_refused(const Device *d, const char *host, int kind, const Ledger *l)
{
    char holders[512] = "";
    int at = 0;
    for (int i = 0; l && i < l->n && at < (int)sizeof holders - 40; i++)
        if (l->holder[i].held[kind])
            at += snprintf(holders + at, sizeof holders - (size_t)at, "%s pid %ld: %d",
                           at ? "," : "", l->holder[i].pid, l->holder[i].held[kind]);
    fprintf(stderr, "apple-profile: refused %s number %d on %s of host %s (held:%s; at most %d): "
            "%s\n", KIND[kind].what, KIND[kind].limit + 1, d->name, host,
            l ? holders : " this process alone counted", KIND[kind].limit, KIND[kind].why);
}

/* Count delta more of kind on device d: 0, or -1 with errno set (and a line on stderr) where
 * that would pass Apple's limit on this host. Called with `lock` held. */
static int count(Device *d, int kind, int delta)
{
    char host[128], path[512];
    host_name(host, sizeof host);
    if (per_process()) {
        if (delta > 0 && d->held[kind] + delta > KIND[kind].limit) {
            tell_refused(d, host, kind, NULL);
            errno = KIND[kind].error;
            return -1;
        }
        d->held[kind] += delta;
        return 0;
    }
    const char *folder = getenv("APPLE_PROFILE_STATE");
    folder = folder && *folder ? folder : "/tmp/tbcoll-apple-profile";
    mkdir(folder, 0700);
    snprintf(path, sizeof path, "%s/%s.%s", folder, host, d->name);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    FILE *f = fd < 0 ? NULL : fdopen(dup(fd), "r");
    if (!f || flock(fd, LOCK_EX) != 0) {
        fprintf(stderr, "apple-profile: cannot count in %s: %s\n", path, strerror(errno));
        if (f)
            fclose(f);
        if (fd >= 0)
            close(fd);
        errno = EIO;
        return -1;
    }
    static Ledger l; /* `lock` is held: one at a time */
    ledger_read(f, &l);
    fclose(f);
    long me = (long)getpid();
    int mine = 0, total = 0;
    while (mine < l.n && l.holder[mine].pid != me)
        mine++;
    for (int i = 0; i < l.n; i++)
        total += l.holder[i].held[kind];
    int rc = 0;
    if (delta > 0 && total + delta > KIND[kind].limit) {
        tell_refused(d, host, kind, &l);
        rc = -1;
    } else if (mine == l.n && l.n == HOLDERS) {
        fprintf(stderr, "apple-profile: more than %d processes on %s\n", HOLDERS, path);
        rc = -1;
    } else if (mine < l.n || delta > 0) {
        if (mine == l.n)
            l.holder[l.n++] = (Holder){.pid = me, .start = start_of(me)};
        l.holder[mine].held[kind] += delta;
        if (l.peak[kind] < total + delta)
            l.peak[kind] = total + delta;
        ledger_write(fd, &l);
    }
    flock(fd, LOCK_UN);
    close(fd);
    if (rc)
        errno = KIND[kind].error;
    else
        d->held[kind] += delta;
    return rc;
}

/* --- the ops table's three entries -------------------------------------------------------- */

static int post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    pthread_mutex_lock(&lock);
    Queue *q = queue_of(qp);
    Context *c = context_of(qp->context);
    /* the work requests that fit; the first that does not is refused, as Apple's is */
    struct ibv_send_wr *last = NULL, *over = wr;
    int fit = 0;
    while (over && q->sends + fit < MAX_DEPTH)
        last = over, over = over->next, fit++;
    int rc = 0;
    *bad = NULL;
    if (last) {
        last->next = NULL;
        rc = c->post_send(qp, wr, bad);
        last->next = over;
    }
    for (struct ibv_send_wr *w = wr; w && w != over && w != *bad; w = w->next) {
        int at = (q->send_head + q->sends++) % MAX_DEPTH;
        q->send_id[at] = w->wr_id;
        q->send_signaled[at] = q->sig_all || (w->send_flags & IBV_SEND_SIGNALED);
    }
    if (!rc && over) {
        *bad = over;
        errno = ENOMEM;
        rc = -ENOMEM;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

static int post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
    pthread_mutex_lock(&lock);
    Queue *q = queue_of(qp);
    Context *c = context_of(qp->context);
    struct ibv_recv_wr *last = NULL, *over = wr;
    int fit = 0;
    while (over && q->recvs + fit < MAX_DEPTH)
        last = over, over = over->next, fit++;
    int rc = 0;
    *bad = NULL;
    if (last) {
        last->next = NULL;
        rc = c->post_recv(qp, wr, bad);
        last->next = over;
    }
    for (struct ibv_recv_wr *w = wr; w && w != over && w != *bad; w = w->next)
        q->recv_id[(q->recv_head + q->recvs++) % MAX_DEPTH] = w->wr_id;
    if (!rc && over) {
        *bad = over;
        errno = ENOMEM;
        rc = -ENOMEM;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

/* A polled completion frees its work request (a send's also frees the unsignaled sends
 * before it). Without an error the opcode says which queue; with one, the wr_id does. */
static void account(struct ibv_context *ctx, const struct ibv_wc *wc)
{
    Queue *q = queue_by_number(ctx, wc->qp_num);
    if (!q)
        return;
    int recv = wc->status == IBV_WC_SUCCESS ? (wc->opcode & IBV_WC_RECV) != 0
                                            : q->recvs && q->recv_id[q->recv_head] == wc->wr_id;
    if (recv && q->recvs) {
        q->recv_head = (q->recv_head + 1) % MAX_DEPTH;
        q->recvs--;
        return;
    }
    while (!recv && q->sends) {
        int signaled = q->send_signaled[q->send_head];
        q->send_head = (q->send_head + 1) % MAX_DEPTH;
        q->sends--;
        if (signaled)
            break;
    }
}

static int poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
    pthread_mutex_lock(&lock);
    int got = context_of(cq->context)->poll_cq(cq, n, wc);
    for (int i = 0; i < got; i++)
        account(cq->context, &wc[i]);
    pthread_mutex_unlock(&lock);
    return got;
}

/* --- the exported functions --------------------------------------------------------------- */

EXPORT struct ibv_device **ibv_get_device_list(int *n)
{
    return ready() ? R.get_device_list(n) : NULL;
}

EXPORT void ibv_free_device_list(struct ibv_device **list)
{
    if (ready())
        R.free_device_list(list);
}

EXPORT const char *ibv_get_device_name(struct ibv_device *device)
{
    return ready() ? R.get_device_name(device) : NULL;
}

EXPORT struct ibv_context *ibv_open_device(struct ibv_device *device)
{
    if (!ready())
        return NULL;
    pthread_mutex_lock(&lock);
    Device *d = device_named(R.get_device_name(device));
    int counted = d && count(d, CONTEXTS, 1) == 0; /* before opening: a second one deadlocks */
    pthread_mutex_unlock(&lock);
    if (!counted) {
        errno = d ? EBUSY : ENOMEM;
        return NULL;
    }
    struct ibv_context *ctx = R.open_device(device);
    pthread_mutex_lock(&lock);
    Context *c = ctx ? context_of(NULL) : NULL;
    if (!c) {
        int error = ctx ? ENOMEM : errno;
        count(d, CONTEXTS, -1);
        errno = error;
    } else {
        *c = (Context){ctx, ctx->ops.post_send, ctx->ops.post_recv, ctx->ops.poll_cq};
        ctx->ops.post_send = post_send;
        ctx->ops.post_recv = post_recv;
        ctx->ops.poll_cq = poll_cq;
    }
    pthread_mutex_unlock(&lock);
    if (!c) {
        if (ctx)
            R.close_device(ctx);
        errno = ENOMEM;
        return NULL;
    }
    return ctx;
}

EXPORT int ibv_close_device(struct ibv_context *ctx)
{
    pthread_mutex_lock(&lock);
    Context *c = context_of(ctx);
    Device *d = device_of(ctx);
    if (c)
        c->ctx = NULL;
    pthread_mutex_unlock(&lock);
    int rc = R.close_device(ctx);
    pthread_mutex_lock(&lock);
    if (!rc && c && d)
        count(d, CONTEXTS, -1);
    pthread_mutex_unlock(&lock);
    return rc;
}

EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *ctx)
{
    return R.alloc_pd(ctx);
}

EXPORT int ibv_dealloc_pd(struct ibv_pd *pd)
{
    return R.dealloc_pd(pd);
}

EXPORT struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
    pthread_mutex_lock(&lock);
    Device *d = device_of(pd->context);
    struct ibv_mr *mr = NULL;
    if (!d)
        errno = ENOMEM;
    else if (count(d, MRS, 1) == 0 && !(mr = R.reg_mr(pd, addr, length, access))) {
        int error = errno;
        count(d, MRS, -1);
        errno = error;
    }
    pthread_mutex_unlock(&lock);
    return mr;
}

EXPORT int ibv_dereg_mr(struct ibv_mr *mr)
{
    pthread_mutex_lock(&lock);
    Device *d = device_of(mr->context);
    int rc = R.dereg_mr(mr);
    if (!rc && d)
        count(d, MRS, -1);
    pthread_mutex_unlock(&lock);
    return rc;
}

EXPORT struct ibv_cq *ibv_create_cq(struct ibv_context *ctx, int cqe, void *user,
                                    struct ibv_comp_channel *channel, int vector)
{
    return R.create_cq(ctx, cqe, user, channel, vector);
}

EXPORT int ibv_destroy_cq(struct ibv_cq *cq)
{
    return R.destroy_cq(cq);
}

EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
    if (attr->qp_type != IBV_QPT_UC) {
        errno = EINVAL;
        return NULL;
    }
    struct ibv_qp_cap asked = attr->cap;
    pthread_mutex_lock(&lock);
    Device *d = device_of(pd->context);
    Queue *q = queue_of(NULL);
    struct ibv_qp *qp = NULL;
    if (!d || !q)
        errno = EBUSY;
    else if (count(d, QPS, 1) == 0 && !(qp = R.create_qp(pd, attr))) {
        int error = errno;
        count(d, QPS, -1);
        errno = error;
    } else if (qp) {
        *q = (Queue){.qp = qp, .sig_all = attr->sq_sig_all};
        attr->cap.max_send_wr = asked.max_send_wr; /* what was asked, not what is safe */
        attr->cap.max_recv_wr = asked.max_recv_wr;
    }
    pthread_mutex_unlock(&lock);
    return qp;
}

EXPORT int ibv_destroy_qp(struct ibv_qp *qp)
{
    pthread_mutex_lock(&lock);
    Queue *q = queue_of(qp);
    Device *d = device_of(qp->context);
    int rc = R.destroy_qp(qp);
    if (!rc) {
        if (q)
            q->qp = NULL;
        if (d)
            count(d, QPS, -1);
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

static int is_ipv4_mapped(const union ibv_gid *g)
{
    static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return memcmp(g->raw, prefix, sizeof prefix) == 0;
}

/* EINVAL, told on stderr and counted per device, for an RTR transition a Mac would refuse. */
static int refuse_rtr(struct ibv_qp *qp, const char *why)
{
    pthread_mutex_lock(&lock);
    Device *d = device_of(qp->context);
    int n = d ? ++d->failed_rtr : 0;
    pthread_mutex_unlock(&lock);
    fprintf(stderr, "apple-profile: RTR refused on %s (failed RTR number %d on this device; on a "
            "Mac repeated ones can wedge the port): %s\n", d ? d->name : "?", n, why);
    errno = EINVAL;
    return EINVAL;
}

EXPORT int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask)
{
    if ((mask & IBV_QP_STATE) && attr->qp_state == IBV_QPS_RTR && (mask & IBV_QP_AV)) {
        char why[160];
        if ((mask & IBV_QP_PATH_MTU) && attr->path_mtu > MAX_MTU)
            return refuse_rtr(qp, "a path MTU above 1024");
        int index = attr->ah_attr.is_global ? attr->ah_attr.grh.sgid_index : 0;
        union ibv_gid gid;
        if (R.query_gid(qp->context, attr->ah_attr.port_num, index, &gid) != 0) {
            snprintf(why, sizeof why, "GID index %d cannot be read", index);
            return refuse_rtr(qp, why);
        }
        if (!is_ipv4_mapped(&gid)) {
            char text[INET6_ADDRSTRLEN];
            inet_ntop(AF_INET6, gid.raw, text, sizeof text);
            snprintf(why, sizeof why, "GID index %d (%s) is not IPv4-mapped", index, text);
            return refuse_rtr(qp, why);
        }
    }
    return R.modify_qp(qp, attr, mask);
}

EXPORT int ibv_query_port(struct ibv_context *ctx, uint8_t port,
                          struct _compat_ibv_port_attr *attr)
{
    /* the old attributes are a prefix of struct ibv_port_attr: state, max_mtu, active_mtu */
    struct ibv_port_attr *a = (struct ibv_port_attr *)attr;
    int rc = R.query_port(ctx, port, attr);
    if (!rc) {
        if (a->max_mtu > MAX_MTU)
            a->max_mtu = MAX_MTU;
        if (a->active_mtu > MAX_MTU)
            a->active_mtu = MAX_MTU;
    }
    return rc;
}

EXPORT int ibv_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid)
{
    return R.query_gid(ctx, port, index, gid);
}
