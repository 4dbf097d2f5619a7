/* Posting receives and sends, taking completions, and pacing the waits between looks at the
 * completion queues (fabric.h: WHY A COMPLETION PROVES THE DATA, FLOW CONTROL). */
#include "fabric.h"

#include <sched.h>
#include <string.h>
#include <time.h>

#include "../../include/cpu_relax.h"

INTERNAL double verbs_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

INTERNAL void verbs_lose(Peer *p, const char *why)
{
    if (!p->lost[0])
        snprintf(p->lost, sizeof p->lost, "%s", why);
}

INTERNAL int verbs_post_stream_recv(Fabric *f, int k, int index)
{
    Peer *p = &f->peer[k];
    Device *d = &f->dev[p->device];
    struct ibv_sge sge = {.addr = (uintptr_t)(p->recv_chunks + (size_t)index * STREAM_CHUNK),
                          .length = STREAM_CHUNK, .lkey = d->mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = WR_ID(k, WR_STREAM_RECV, index), .sg_list = &sge,
                             .num_sge = 1}, *bad;
    int rc = ibv_post_recv(p->qp[QP_STREAM], &wr, &bad);
    if (rc)
        verbs_lose(p, "posting a receive failed");
    return rc;
}

INTERNAL int verbs_post_coll_recv(Fabric *f, int k, int parity)
{
    Peer *p = &f->peer[k];
    Device *d = &f->dev[p->device];
    char *slot = d->coll + ((size_t)parity * f->size + k) * COLL_SLOT;
    struct ibv_sge sge = {.addr = (uintptr_t)slot, .length = COLL_SLOT, .lkey = d->mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = WR_ID(k, WR_COLL_RECV, parity), .sg_list = &sge,
                             .num_sge = 1}, *bad;
    int rc = ibv_post_recv(p->qp[QP_COLL], &wr, &bad);
    if (rc)
        verbs_lose(p, "posting a receive failed");
    return rc;
}

/* Send slot `slot` of peer k holding `bytes` (header included) on its stream queue pair. */
INTERNAL int verbs_post_stream_send(Fabric *f, int k, int slot, uint32_t bytes)
{
    Peer *p = &f->peer[k];
    Device *d = &f->dev[p->device];
    struct ibv_sge sge = {.addr = (uintptr_t)(p->send_slots + (size_t)slot * STREAM_CHUNK),
                          .length = bytes, .lkey = d->mr->lkey};
    struct ibv_send_wr wr = {.wr_id = WR_ID(k, WR_STREAM_SEND, slot), .sg_list = &sge,
                             .num_sge = 1, .opcode = IBV_WR_SEND,
                             .send_flags = IBV_SEND_SIGNALED}, *bad;
    int rc = ibv_post_send(p->qp[QP_STREAM], &wr, &bad);
    if (rc)
        verbs_lose(p, "posting a send failed");
    return rc;
}

/* A header-only message giving back the buffers read, when half of them wait to be told
 * and a credit is left (see FLOW CONTROL). */
INTERNAL void verbs_return_credits(Fabric *f, int k)
{
    Peer *p = &f->peer[k];
    if (p->unreturned < STREAM_RECVS / 2 || p->credits < 1 || p->nfree < 1 || p->lost[0])
        return;
    int slot = p->free_slots[--p->nfree];
    uint32_t header[2] = {p->unreturned, 0};
    memcpy(p->send_slots + (size_t)slot * STREAM_CHUNK, header, sizeof header);
    p->unreturned = 0;
    p->credits--;
    verbs_post_stream_send(f, k, slot, STREAM_HEADER);
}

INTERNAL void verbs_completed(Fabric *f, struct ibv_wc *wc)
{
    int k = (int)(wc->wr_id >> 32), kind = (int)((wc->wr_id >> 24) & 0xff);
    int index = (int)(wc->wr_id & 0xffffff);
    if (k < 0 || k >= f->size || f->peer[k].device < 0)
        return;
    Peer *p = &f->peer[k];
    if (wc->status != IBV_WC_SUCCESS) {
        char why[160], status[32];
        snprintf(why, sizeof why, "%s failed on the RDMA device: %s",
                 kind == WR_STREAM_SEND || kind == WR_COLL_SEND ? "a send" : "a receive",
                 verbs_wc_status_text(wc->status, status, sizeof status));
        verbs_lose(p, why);
        return;
    }
    switch (kind) {
    case WR_STREAM_RECV: {
        /* The completion proves the message is in the buffer (see the top of this file). */
        const char *chunk = p->recv_chunks + (size_t)index * STREAM_CHUNK;
        uint32_t header[2];
        if (wc->byte_len < STREAM_HEADER) {
            verbs_lose(p, "a stream message shorter than its header arrived");
            return;
        }
        memcpy(header, chunk, sizeof header);
        p->credits += (int)header[0];
        if (wc->byte_len == STREAM_HEADER) { /* credits only: the buffer is free again */
            p->unreturned++;
            verbs_post_stream_recv(f, k, index);
        } else {
            int at = (p->fifo_head + p->fifo_count) % STREAM_RECVS;
            p->fifo[at] = (uint16_t)index;
            p->fifo_bytes[at] = wc->byte_len - STREAM_HEADER;
            p->fifo_count++;
        }
        break;
    }
    case WR_STREAM_SEND:
        p->free_slots[p->nfree++] = (uint16_t)index;
        break;
    case WR_COLL_RECV:
        p->coll_arrived[index] = 1;
        p->coll_bytes[index] = wc->byte_len;
        break;
    case WR_COLL_SEND:
        p->coll_sending[index]--;
        break;
    }
}

/* Take every completion there is; then give back credits where due. Returns how many. */
INTERNAL int verbs_progress(Fabric *f)
{
    struct ibv_wc wc[32];
    int total = 0;
    for (int d = 0; d < f->ndev; d++) {
        int n = 0;
        if (!f->dev[d].cq)
            continue; /* released: every pair on it moved (moves.c) */
        while ((n = ibv_poll_cq(f->dev[d].cq, 32, wc)) > 0) {
            __atomic_thread_fence(__ATOMIC_ACQUIRE); /* data after its CQE, on any provider */
            for (int i = 0; i < n; i++)
                verbs_completed(f, &wc[i]);
            total += n;
        }
        if (n < 0) { /* the device itself failed: every peer on it is lost */
            for (int k = 0; k < f->size; k++)
                if (f->peer[k].device == d)
                    verbs_lose(&f->peer[k], "polling the RDMA device's completion queue failed");
        }
    }
    if (total)
        for (int k = 0; k < f->size; k++)
            if (f->peer[k].device >= 0)
                verbs_return_credits(f, k);
    return total;
}

/* Nap between polls once spinning and yielding did not find anything: short at first. */
static void pause_after(double waited, double spin, double *nap)
{
    if (waited < spin) {
        CPU_RELAX();
    } else if (waited < spin + 2e-3) {
        sched_yield();
    } else {
        *nap = *nap < 1e-6 ? 1e-6 : (*nap * 2 > 1e-4 ? 1e-4 : *nap * 2);
        struct timespec t = {0, (long)(*nap * 1e9)};
        nanosleep(&t, NULL);
    }
}

/* After a look that found nothing to stop for: 1 once budget seconds have passed since start,
 * else 0 after the pause that fits how long the wait has gone on (pause_after). */
INTERNAL int verbs_budget_spent(Fabric *f, double start, double budget, double *nap)
{
    double waited = verbs_now() - start;
    if (waited >= budget)
        return 1;
    pause_after(waited, f->spin, nap);
    return 0;
}
