/*
 * apple_profile_check LIBRARY DEVICE: tries each of Apple's known rules
 * (tests/harness/apple_profile.c) on DEVICE through the verbs library LIBRARY, one process (and
 * two short-lived children for the one context per device), two UC queue pairs connected to
 * each other, and prints one line per rule: "ok NAME" where the
 * library enforced it, "no NAME: what happened" where it did not. Run in the RDMA lab by
 * tests/labs/test_rdma_apple.py, with the Apple profile (every line ok) and with plain
 * libibverbs.so.1 (the profile's rules: no).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/wait.h>
#include <infiniband/verbs.h>

#undef ibv_query_port
#undef ibv_reg_mr

static struct {
    struct ibv_device **(*get_device_list)(int *);
    const char *(*get_device_name)(struct ibv_device *);
    struct ibv_context *(*open_device)(struct ibv_device *);
    struct ibv_pd *(*alloc_pd)(struct ibv_context *);
    struct ibv_mr *(*reg_mr)(struct ibv_pd *, void *, size_t, int);
    int (*dereg_mr)(struct ibv_mr *);
    struct ibv_cq *(*create_cq)(struct ibv_context *, int, void *, struct ibv_comp_channel *,
                                int);
    struct ibv_qp *(*create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
    int (*destroy_qp)(struct ibv_qp *);
    int (*modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
    int (*query_port)(struct ibv_context *, uint8_t, struct ibv_port_attr *);
    int (*query_gid)(struct ibv_context *, uint8_t, int, union ibv_gid *);
} V;

static struct ibv_pd *pd;
static struct ibv_mr *mr;
static char buf[1 << 16];
static int ipv4_index = -1, other_index = -1;
static union ibv_gid ipv4_gid;

static void report(const char *name, int ok, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void report(const char *name, int ok, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("%s %s", ok ? "ok" : "no", name);
    if (!ok) {
        printf(": ");
        vprintf(fmt, ap);
    }
    printf("\n");
    va_end(ap);
    fflush(stdout);
}

static struct ibv_qp *new_qp(struct ibv_cq *cq, enum ibv_qp_type type, int depth)
{
    struct ibv_qp_init_attr a = {.send_cq = cq, .recv_cq = cq, .qp_type = type,
                                 .cap = {.max_send_wr = depth, .max_recv_wr = depth,
                                         .max_send_sge = 1, .max_recv_sge = 1}};
    struct ibv_qp *qp = V.create_qp(pd, &a);
    if (!qp)
        return NULL;
    struct ibv_qp_attr m = {.qp_state = IBV_QPS_INIT, .port_num = 1};
    if (V.modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                    IBV_QP_ACCESS_FLAGS)) {
        fprintf(stderr, "INIT failed\n");
        exit(2);
    }
    return qp;
}

/* In a child process: open `device` and exit without closing it (its exit status: 0 opened,
 * 1 refused with EBUSY, 2 refused otherwise). Its status, or -1 where fork failed. */
static int open_in_a_child(struct ibv_device *device)
{
    pid_t child = fork();
    if (child == 0)
        _exit(V.open_device(device) ? 0 : errno == EBUSY ? 1 : 2);
    int status = 0;
    if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status))
        return -1;
    return WEXITSTATUS(status);
}

/* RTR towards qp number `to` at our own IPv4-mapped GID; returns ibv_modify_qp's result */
static int to_rtr(struct ibv_qp *qp, uint32_t to, int sgid_index, enum ibv_mtu mtu)
{
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR, .path_mtu = mtu, .dest_qp_num = to,
                            .rq_psn = 1};
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = ipv4_gid;
    a.ah_attr.grh.sgid_index = (uint8_t)sgid_index;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.port_num = 1;
    return V.modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                       IBV_QP_RQ_PSN);
}

static void connect_to(struct ibv_qp *qp, uint32_t to)
{
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTS, .sq_psn = 1};
    if (to_rtr(qp, to, ipv4_index, IBV_MTU_1024) || V.modify_qp(qp, &a, IBV_QP_STATE |
                                                                 IBV_QP_SQ_PSN)) {
        fprintf(stderr, "cannot connect the queue pairs\n");
        exit(2);
    }
}

static int post_send(struct ibv_qp *qp, int offset, const char *text)
{
    strcpy(buf + offset, text);
    struct ibv_sge sge = {(uintptr_t)(buf + offset), (uint32_t)strlen(text) + 1, mr->lkey};
    struct ibv_send_wr wr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1,
                             .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED}, *bad;
    return ibv_post_send(qp, &wr, &bad);
}

static int post_recv(struct ibv_qp *qp, int offset)
{
    struct ibv_sge sge = {(uintptr_t)(buf + offset), 256, mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = 2, .sg_list = &sge, .num_sge = 1}, *bad;
    return ibv_post_recv(qp, &wr, &bad);
}

/* completions polled from cq within seconds, up to want */
static int drain(struct ibv_cq *cq, int want, double seconds)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int got = 0;
    for (;;) {
        struct ibv_wc wc[16];
        int n = ibv_poll_cq(cq, 16, wc);
        got += n > 0 ? n : 0;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (got >= want || (t.tv_sec - t0.tv_sec) + 1e-9 * (t.tv_nsec - t0.tv_nsec) > seconds)
            return got;
        usleep(1000);
    }
}

/* how many of up to 40 posts in a row succeed; *err: what the first failure returned */
static int posts_that_fit(int (*post)(struct ibv_qp *, int), struct ibv_qp *qp, int *err)
{
    for (int i = 0; i < 40; i++) {
        int rc = post(qp, 256 * i);
        if (rc) {
            *err = rc;
            return i;
        }
    }
    return 40;
}

static int send_one(struct ibv_qp *qp, int offset)
{
    return post_send(qp, offset, "first");
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: apple_profile_check LIBRARY DEVICE\n");
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "%s\n", dlerror());
        return 2;
    }
#define SYM(f) if (!(*(void **)&V.f = dlsym(lib, "ibv_" #f))) { \
        fprintf(stderr, "no ibv_" #f "\n"); return 2; }
    SYM(get_device_list); SYM(get_device_name); SYM(open_device); SYM(alloc_pd); SYM(reg_mr);
    SYM(dereg_mr); SYM(create_cq); SYM(create_qp); SYM(destroy_qp); SYM(modify_qp);
    SYM(query_port); SYM(query_gid);
#undef SYM
    report("only-jaccls-symbols", !dlsym(lib, "ibv_wc_status_str"), "ibv_wc_status_str found");

    int n = 0;
    struct ibv_device **list = V.get_device_list(&n);
    struct ibv_device *device = NULL;
    for (int i = 0; i < n && !device; i++)
        if (strcmp(V.get_device_name(list[i]), argv[2]) == 0)
            device = list[i];
    /* one context per device on a host, across processes; a dead process's is freed */
    int died_holding = device ? open_in_a_child(device) : -1;
    struct ibv_context *ctx = device ? V.open_device(device) : NULL;
    int second = ctx ? open_in_a_child(device) : -1;
    report("contexts-1-per-host", died_holding == 0 && second == 1,
           "a child that died holding a context: %d (0: opened), a second context in another "
           "process beside ours: %d (1: refused with EBUSY)", died_holding, second);
    if (!ctx || !(pd = V.alloc_pd(ctx)) ||
        !(mr = V.reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE))) {
        fprintf(stderr, "cannot open %s\n", argv[2]);
        return 2;
    }
    struct ibv_port_attr port;
    memset(&port, 0, sizeof port);
    V.query_port(ctx, 1, &port);
    report("mtu-1024", port.max_mtu <= IBV_MTU_1024 && port.active_mtu <= IBV_MTU_1024,
           "the port reports max MTU code %d", port.max_mtu);
    for (int i = 0; i < port.gid_tbl_len && i < 16; i++) {
        union ibv_gid g;
        static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        if (V.query_gid(ctx, 1, i, &g) || !memcmp(g.raw, (uint8_t[16]){0}, 16))
            continue;
        if (!memcmp(g.raw, prefix, 12) && ipv4_index < 0)
            ipv4_index = i, ipv4_gid = g;
        else if (memcmp(g.raw, prefix, 12) && other_index < 0)
            other_index = i;
    }
    if (ipv4_index < 0 || other_index < 0) {
        fprintf(stderr, "%s needs an IPv4-mapped GID and another\n", argv[2]);
        return 2;
    }
    struct ibv_cq *cq_a = V.create_cq(ctx, 256, NULL, NULL, 0);
    struct ibv_cq *cq_b = V.create_cq(ctx, 256, NULL, NULL, 0);

    struct ibv_qp *rc = new_qp(cq_a, IBV_QPT_RC, 4);
    report("rc-refused", !rc, "an RC queue pair was created");
    if (rc)
        V.destroy_qp(rc);

    struct ibv_qp *c = new_qp(cq_a, IBV_QPT_UC, 4);
    int err = to_rtr(c, c->qp_num, other_index, IBV_MTU_1024);
    report("rtr-needs-an-ipv4-mapped-gid", err == EINVAL,
           "RTR at GID index %d (not IPv4-mapped) returned %d", other_index, err);
    struct ibv_qp *d = new_qp(cq_a, IBV_QPT_UC, 4);
    err = to_rtr(d, d->qp_num, ipv4_index, IBV_MTU_2048);
    report("rtr-path-mtu-1024", err == EINVAL, "RTR with path MTU 2048 returned %d", err);

    struct ibv_qp *a = new_qp(cq_a, IBV_QPT_UC, 64), *b = new_qp(cq_b, IBV_QPT_UC, 64);
    int fit = posts_that_fit(post_recv, a, &err);
    report("recv-depth-32", fit == 32 && err == -ENOMEM,
           "%d receives posted in a row (asked for a depth of 64), then %d", fit, err);
    connect_to(a, b->qp_num);
    connect_to(b, a->qp_num);
    /* b has no receive posted: each of a's sends to b is dropped (UC) */
    fit = posts_that_fit(send_one, a, &err);
    report("send-depth-32", fit == 32 && err == -ENOMEM,
           "%d sends posted in a row (asked for a depth of 64), then %d", fit, err);
    int sent = drain(cq_a, fit, 30);
    if (sent != fit) {
        fprintf(stderr, "%d of %d sends completed\n", sent, fit);
        return 2;
    }
    post_recv(b, 40 * 256);
    post_send(a, 0, "second");
    int got = drain(cq_b, 2, 3);
    report("send-before-recv-dropped", got == 1 && strcmp(buf + 40 * 256, "second") == 0,
           "%d completions, the receive holds %.8s", got, buf + 40 * 256);

    struct ibv_mr *mrs[150];
    int regs = 0;
    while (regs < 150 && (mrs[regs] = V.reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE)))
        regs++;
    report("memory-regions-100", regs + 1 == 100 && errno == ENOMEM,
           "%d regions registered besides the first", regs);
    while (regs > 0)
        V.dereg_mr(mrs[--regs]);

    struct ibv_qp *qps[16];
    int qps_made = 0; /* 4 exist: a, b, c, d */
    while (qps_made < 16 && (qps[qps_made] = new_qp(cq_a, IBV_QPT_UC, 4)))
        qps_made++;
    report("queue-pairs-10", qps_made + 4 == 10 && errno == EBUSY,
           "%d queue pairs created", qps_made + 4);
    return 0;
}
