/* The Fabric type's set-up: the devices, one registered arena on each, the queue pairs and
 * their connection; its methods table (the stream's in stream.c, the mesh's in mesh.c). */
#include "fabric.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../include/buffers.h" /* every_keyword */

/* --- the Python type ---------------------------------------------------------------------- */

static void fabric_free(Fabric *f)
{
    if (f->peer) {
        for (int k = 0; k < f->size; k++)
            for (int q = 0; q < 2; q++)
                if (f->peer[k].qp[q])
                    V.destroy_qp(f->peer[k].qp[q]);
        free(f->peer);
        f->peer = NULL;
    }
    if (f->dev) {
        for (int d = 0; d < f->ndev; d++) {
            Device *dv = &f->dev[d];
            if (dv->mr)
                V.dereg_mr(dv->mr);
            if (dv->arena)
                free(dv->arena);
            if (dv->cq)
                V.destroy_cq(dv->cq);
            if (dv->pd)
                V.dealloc_pd(dv->pd);
            if (dv->ctx)
                V.close_device(dv->ctx);
        }
        free(f->dev);
        f->dev = NULL;
    }
    free(f->outside);
    f->outside = NULL;
    f->ndev = 0;
}

static void Fabric_dealloc(Fabric *f)
{
    fabric_free(f);
    Py_TYPE(f)->tp_free((PyObject *)f);
}

static int is_ipv4_mapped(const union ibv_gid *g)
{
    static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return memcmp(g->raw, prefix, 12) == 0;
}

/* Open device `name`: context, port, GID, protection domain. 0, or -1 with an exception. */
static int open_device(Device *d, const char *name, int gid_index)
{
    int n = 0;
    struct ibv_device **list = V.get_device_list(&n);
    struct ibv_device *found = NULL;
    for (int i = 0; list && i < n; i++)
        if (strcmp(V.get_device_name(list[i]), name) == 0)
            found = list[i];
    if (!found) {
        if (list)
            V.free_device_list(list);
        PyErr_Format(DeviceError, "%s", name);
        return -1;
    }
    snprintf(d->name, sizeof d->name, "%s", name);
    d->ctx = V.open_device(found);
    V.free_device_list(list);
    if (!d->ctx) {
        int err = errno;
        PyErr_Format(PyExc_OSError, "cannot open RDMA device %s: %s%s", name, strerror(err),
                     err == EBUSY ? " (Apple's driver allows one context per device on a host, "
                     "shared by every process: tbcoll opens it in each host's first rank only, "
                     "unless TBCOLL_HIERARCHY=0; end other RDMA jobs on this host)" : "");
        return -1;
    }
    struct ibv_port_attr port;
    memset(&port, 0, sizeof port);
    if (V.query_port(d->ctx, PORT, &port)) {
        PyErr_Format(PyExc_OSError, "cannot query port %d of RDMA device %s", PORT, name);
        return -1;
    }
    if (port.state != IBV_PORT_ACTIVE) {
        PyErr_Format(PyExc_OSError, "port %d of RDMA device %s is not active (state %d): is "
                     "its cable in and its link up?", PORT, name, (int)port.state);
        return -1;
    }
    d->lid = port.lid;
    d->mtu = port.active_mtu < IBV_MTU_1024 ? port.active_mtu : IBV_MTU_1024;
    if (gid_index >= 0) {
        if (V.query_gid(d->ctx, PORT, gid_index, &d->gid)) {
            PyErr_Format(GidError, "%s: GID index %d cannot be read", name, gid_index);
            return -1;
        }
        d->gid_index = gid_index;
    } else { /* the IPv4-mapped GID (::ffff:a.b.c.d): index 1 on Macs, anywhere on rxe */
        d->gid_index = -1;
        for (int i = 0; i < port.gid_tbl_len && d->gid_index < 0; i++) {
            union ibv_gid g;
            if (V.query_gid(d->ctx, PORT, i, &g) == 0 && is_ipv4_mapped(&g)) {
                d->gid = g;
                d->gid_index = i;
            }
        }
        if (d->gid_index < 0) {
            PyErr_Format(GidError, "%s", name);
            return -1;
        }
    }
    d->pd = V.alloc_pd(d->ctx);
    if (!d->pd) {
        PyErr_Format(PyExc_OSError, "cannot allocate a protection domain on %s", name);
        return -1;
    }
    return 0;
}

static struct ibv_qp *create_qp(Fabric *f, Device *d, int send_wr, int recv_wr)
{
    struct ibv_qp_init_attr init;
    memset(&init, 0, sizeof init);
    init.send_cq = init.recv_cq = d->cq;
    init.qp_type = f->rc ? IBV_QPT_RC : IBV_QPT_UC;
    init.cap.max_send_wr = (uint32_t)send_wr;
    init.cap.max_recv_wr = (uint32_t)recv_wr;
    init.cap.max_send_sge = init.cap.max_recv_sge = 1;
    init.cap.max_inline_data = 0; /* no inline data: Apple's driver takes none */
    struct ibv_qp *qp = V.create_qp(d->pd, &init);
    if (!qp) {
        int err = errno;
        PyErr_Format(PyExc_OSError, "cannot create a %s queue pair on %s: %s%s",
                     f->rc ? "RC" : "UC", d->name, strerror(err),
                     f->rc ? " (Apple's driver takes UC queue pairs only: TBCOLL_RDMA_QP=uc)"
                     : err == EBUSY ? " (Apple's driver allows about 10 queue pairs per device, "
                     "shared by every process; tbcoll takes 2 per other host on its cable: end "
                     "other RDMA jobs on this host)" : "");
        return NULL;
    }
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = PORT;
    a.qp_access_flags = 0; /* SEND/RECV only: nobody writes into our memory uninvited */
    if (V.modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                    IBV_QP_ACCESS_FLAGS)) {
        PyErr_Format(PyExc_OSError, "cannot bring a queue pair on %s to INIT", d->name);
        V.destroy_qp(qp);
        return NULL;
    }
    return qp;
}

/*
 * Fabric(*, rank, size, devices, rc, gid_index, library, spin)
 * devices: per rank, the name of the device that reaches it (None for this rank).
 * Opens the devices, registers one arena on each, creates the queue pairs (INIT) and posts
 * every receive; connect() then takes each to RTS with the peer's info().
 */
static PyObject *Fabric_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"rank", "size", "devices", "rc", "gid_index", "library", "spin",
                               NULL};
    int rank, size, rc, gid_index;
    PyObject *names;
    const char *library = NULL;
    double spin;
    if (!every_keyword("Fabric", kwargs, keywords) ||
        !PyArg_ParseTupleAndKeywords(args, kwargs, "|$iiOpizd:Fabric", keywords, &rank, &size,
                                     &names, &rc, &gid_index, &library, &spin))
        return NULL;
    if (size < 1 || size > MAX_PEERS || rank < 0 || rank >= size) {
        PyErr_SetString(PyExc_ValueError, "bad rank or size");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(names, "devices must be a sequence");
    if (!seq)
        return NULL;
    if (PySequence_Fast_GET_SIZE(seq) != size) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "devices must name one device per rank");
        return NULL;
    }
    if (verbs_load_library(library) < 0) {
        Py_DECREF(seq);
        return NULL;
    }
    Fabric *f = (Fabric *)type->tp_alloc(type, 0);
    if (!f) {
        Py_DECREF(seq);
        return NULL;
    }
    f->rank = rank, f->size = size, f->rc = rc, f->spin = spin;
    f->dev = calloc((size_t)size, sizeof(Device));
    f->peer = calloc((size_t)size, sizeof(Peer));
    if (!f->dev || !f->peer) {
        PyErr_NoMemory();
        goto fail;
    }
    srand48((long)(verbs_now() * 1e6) ^ (long)getpid() << 16);
    /* which device each peer uses, opening each name once */
    for (int k = 0; k < size; k++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, k);
        f->peer[k].device = -1;
        if (item == Py_None || k == rank)
            continue;
        const char *name = PyUnicode_AsUTF8(item);
        if (!name)
            goto fail;
        int d = 0;
        while (d < f->ndev && strcmp(f->dev[d].name, name) != 0)
            d++;
        if (d == f->ndev) {
            f->ndev++;
            if (open_device(&f->dev[d], name, gid_index) < 0)
                goto fail;
        }
        f->peer[k].device = d;
        f->dev[d].peers++;
    }
    /* one arena per device: per peer its stream buffers, then the coll slots */
    for (int d = 0; d < f->ndev; d++) {
        Device *dv = &f->dev[d];
        size_t per_peer = (size_t)(STREAM_RECVS + STREAM_SENDS) * STREAM_CHUNK;
        size_t coll = 2 * (size_t)size * COLL_SLOT;
        dv->arena_bytes = (size_t)dv->peers * per_peer + coll;
        if (posix_memalign((void **)&dv->arena, 4096, dv->arena_bytes)) {
            dv->arena = NULL;
            PyErr_NoMemory();
            goto fail;
        }
        memset(dv->arena, 0, dv->arena_bytes);
        dv->mr = V.reg_mr(dv->pd, dv->arena, dv->arena_bytes, IBV_ACCESS_LOCAL_WRITE);
        if (!dv->mr) {
            PyErr_Format(RegistrationError, "%s|%zu|%s", dv->name, dv->arena_bytes,
                         strerror(errno));
            goto fail;
        }
        int cqe = dv->peers * (STREAM_RECVS + STREAM_SENDS + 1 + 2 + 3) + 16;
        dv->cq = V.create_cq(dv->ctx, cqe, NULL, NULL, 0);
        if (!dv->cq) {
            PyErr_Format(PyExc_OSError, "cannot create a completion queue on %s: %s",
                         dv->name, strerror(errno));
            goto fail;
        }
        dv->coll = dv->arena + (size_t)dv->peers * per_peer;
        int next = 0;
        for (int k = 0; k < size; k++) {
            Peer *p = &f->peer[k];
            if (p->device != d)
                continue;
            p->recv_chunks = dv->arena + (size_t)next++ * per_peer;
            p->send_slots = p->recv_chunks + (size_t)STREAM_RECVS * STREAM_CHUNK;
            p->qp[QP_STREAM] = create_qp(f, dv, STREAM_SENDS + 1, STREAM_RECVS);
            p->qp[QP_COLL] = p->qp[QP_STREAM] ? create_qp(f, dv, 3, 2) : NULL;
            if (!p->qp[QP_COLL])
                goto fail;
            p->psn[0] = (uint32_t)lrand48() & 0xffffff;
            p->psn[1] = (uint32_t)lrand48() & 0xffffff;
            p->credits = STREAM_RECVS;
            p->nfree = STREAM_SENDS;
            for (int s = 0; s < STREAM_SENDS; s++)
                p->free_slots[s] = (uint16_t)(STREAM_SENDS - 1 - s);
            /* every receive is posted before any peer can send (see connect) */
            for (int i = 0; i < STREAM_RECVS; i++)
                if (verbs_post_stream_recv(f, k, i))
                    goto posting;
            if (verbs_post_coll_recv(f, k, 0) || verbs_post_coll_recv(f, k, 1))
                goto posting;
        }
    }
    Py_DECREF(seq);
    return (PyObject *)f;
posting:
    PyErr_SetString(PyExc_OSError, "cannot post receive buffers on the RDMA device");
fail:
    Py_DECREF(seq);
    Py_DECREF(f);
    return NULL;
}

#define INFO_BYTES 36 /* u32 qpn x2, u32 psn x2, gid[16], u16 lid, u8 mtu, 1 pad, u32 pad */

static void put32(unsigned char *at, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        at[i] = (unsigned char)(v >> (24 - 8 * i));
}

static uint32_t get32(const unsigned char *at)
{
    return (uint32_t)at[0] << 24 | (uint32_t)at[1] << 16 | (uint32_t)at[2] << 8 | at[3];
}

INTERNAL Peer *verbs_peer_arg(Fabric *f, int k)
{
    if (k < 0 || k >= f->size || f->peer[k].device < 0) {
        PyErr_Format(PyExc_ValueError, "rank %d has no queue pair to rank %d", f->rank, k);
        return NULL;
    }
    return &f->peer[k];
}

/* The peer of a method whose one argument is a peer's rank (METH_O). */
INTERNAL Peer *verbs_peer_of(Fabric *f, PyObject *rank)
{
    long k = PyLong_AsLong(rank);
    if (k == -1 && PyErr_Occurred())
        return NULL;
    return verbs_peer_arg(f, k < 0 || k > MAX_PEERS ? -1 : (int)k); /* no int overflow */
}

/* info(peer) -> bytes: what peer needs to connect its queue pairs to ours */
static PyObject *Fabric_info(Fabric *f, PyObject *rank)
{
    Peer *p = verbs_peer_of(f, rank);
    if (!p)
        return NULL;
    Device *d = &f->dev[p->device];
    unsigned char out[INFO_BYTES] = {0};
    put32(out, p->qp[0]->qp_num);
    put32(out + 4, p->qp[1]->qp_num);
    put32(out + 8, p->psn[0]);
    put32(out + 12, p->psn[1]);
    memcpy(out + 16, d->gid.raw, 16);
    out[32] = (unsigned char)(d->lid >> 8), out[33] = (unsigned char)d->lid;
    out[34] = (unsigned char)d->mtu;
    return PyBytes_FromStringAndSize((const char *)out, INFO_BYTES);
}

/* OSError(errno, text) for a refused transition: ibv_modify_qp returns the errno (positive in
 * rdma-core, negative from some providers), and errno itself may be stale. Returns -1. */
static int transition_failed(int err, int k, Device *d, const char *state)
{
    err = err < 0 ? -err : err;
    PyObject *text = PyUnicode_FromFormat("cannot bring the queue pair to rank %d on %s to %s: "
                                          "%s (errno %d)", k, d->name, state, strerror(err), err);
    PyObject *e = text ? PyObject_CallFunction(PyExc_OSError, "iN", err, text) : NULL;
    if (e) {
        PyErr_SetObject(PyExc_OSError, e);
        Py_DECREF(e);
    }
    return -1;
}

/* Our two queue pairs to rank k's, INIT -> RTR -> RTS, from its info `in` (INFO_BYTES): 0, or
 * -1 with OSError. */
static int bring_up(Fabric *f, int k, Peer *p, const unsigned char *in)
{
    Device *d = &f->dev[p->device];
    enum ibv_mtu mtu = in[34] < d->mtu ? (enum ibv_mtu)in[34] : d->mtu;
    for (int q = 0; q < 2; q++) {
        struct ibv_qp_attr a;
        memset(&a, 0, sizeof a);
        a.qp_state = IBV_QPS_RTR;
        a.path_mtu = mtu;
        a.dest_qp_num = get32(in + 4 * q);
        a.rq_psn = get32(in + 8 + 4 * q);
        a.ah_attr.is_global = 1;
        memcpy(a.ah_attr.grh.dgid.raw, in + 16, 16);
        a.ah_attr.grh.sgid_index = (uint8_t)d->gid_index;
        a.ah_attr.grh.hop_limit = 64;
        a.ah_attr.dlid = (uint16_t)(in[32] << 8 | in[33]);
        a.ah_attr.port_num = PORT;
        int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                   IBV_QP_RQ_PSN;
        if (f->rc) {
            a.max_dest_rd_atomic = 1;
            a.min_rnr_timer = 12;
            mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
        }
        /* tried once: on Apple's driver repeated failed RTR transitions can wedge the port
         * until reboot, so the caller gives up and says why (tbcoll.transports.rdma.transport) */
        int err = V.modify_qp(p->qp[q], &a, mask);
        if (err)
            return transition_failed(err, k, d, "RTR (ready to receive)");
        memset(&a, 0, sizeof a);
        a.qp_state = IBV_QPS_RTS;
        a.sq_psn = p->psn[q];
        mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
        if (f->rc) {
            a.timeout = 14;   /* ~67 ms per try */
            a.retry_cnt = 7;
            a.rnr_retry = 7;  /* never happens: a receive is always posted (FLOW CONTROL) */
            a.max_rd_atomic = 1;
            mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                    IBV_QP_MAX_QP_RD_ATOMIC;
        }
        err = V.modify_qp(p->qp[q], &a, mask);
        if (err)
            return transition_failed(err, k, d, "RTS (ready to send)");
    }
    return 0;
}

/* connect(peer, their_info): our two queue pairs to theirs, INIT -> RTR -> RTS */
static PyObject *Fabric_connect(Fabric *f, PyObject *args)
{
    int k;
    Py_buffer info;
    if (!PyArg_ParseTuple(args, "iy*", &k, &info))
        return NULL;
    Peer *p = verbs_peer_arg(f, k);
    if (p && info.len != INFO_BYTES)
        PyErr_Format(PyExc_ValueError, "rank %d sent %zd bytes of queue-pair info, not %d", k,
                     info.len, INFO_BYTES);
    int up = p && info.len == INFO_BYTES && bring_up(f, k, p, info.buf) == 0;
    PyBuffer_Release(&info);
    if (!up)
        return NULL;
    Py_RETURN_NONE;
}


/* describe(peer) -> (device, gid index, "UC"/"RC") */
static PyObject *Fabric_describe(Fabric *f, PyObject *rank)
{
    Peer *p = verbs_peer_of(f, rank);
    if (!p)
        return NULL;
    Device *d = &f->dev[p->device];
    return Py_BuildValue("(sis)", d->name, d->gid_index, f->rc ? "RC" : "UC");
}

static PyObject *Fabric_close(Fabric *f, PyObject *unused)
{
    fabric_free(f);
    Py_RETURN_NONE;
}

static PyMethodDef Fabric_methods[] = {
    {"info", (PyCFunction)Fabric_info, METH_O, "Our queue pairs' info for peer."},
    {"connect", (PyCFunction)Fabric_connect, METH_VARARGS, "Connect to peer's queue pairs."},
    {"send", (PyCFunction)Fabric_send, METH_VARARGS, "Send leading bytes of buffers."},
    {"recv_into", (PyCFunction)Fabric_recv_into, METH_VARARGS, "Read what has arrived."},
    {"wait", (PyCFunction)Fabric_wait, METH_VARARGS, "Wait for ready peers."},
    {"lost", (PyCFunction)Fabric_lost, METH_O, "Why a peer is lost, or None."},
    {"mesh", (PyCFunction)Fabric_mesh, METH_VARARGS, "One native mesh call."},
    {"differing_call", (PyCFunction)Fabric_differing_call, METH_NOARGS,
     "The header of the block whose call differed."},
    {"_probe", (PyCFunction)Fabric_probe, METH_VARARGS, "A latency test hook (rdma_probe)."},
    {"describe", (PyCFunction)Fabric_describe, METH_O, "Device and GID of a peer."},
    {"move", (PyCFunction)Fabric_move, METH_O, "Release a peer's queue pairs: it moved."},
    {"put", (PyCFunction)Fabric_put, METH_VARARGS, "A moved peer's mesh block."},
    {"own_block", (PyCFunction)Fabric_own_block, METH_O, "This rank's block of a parity."},
    {"mesh_state", (PyCFunction)Fabric_mesh_state, METH_NOARGS, "The mesh's call and waits."},
    {"down", (PyCFunction)Fabric_down, METH_NOARGS, "Peers whose port is down."},
    {"close", (PyCFunction)Fabric_close, METH_NOARGS, "Release every verbs object."},
    {NULL, NULL, 0, NULL},
};

INTERNAL PyTypeObject FabricType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tbcoll.transports.rdma._verbs.Fabric",
    .tp_basicsize = sizeof(Fabric),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = Fabric_new,
    .tp_dealloc = (destructor)Fabric_dealloc,
    .tp_methods = Fabric_methods,
    .tp_doc = "Queue pairs to every peer of a job over ibverbs (see the module source).",
};
