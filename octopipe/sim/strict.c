/* The simulator's strict engine in C: every device runs its row of cells in order.
 *
 * The same algorithm as `run_strict` in engine.py, step for step (that function is its
 * fallback and its test oracle): one heap of (time, event) pairs ordered by time then event id,
 * events c (compute node c ends) and n_c + t (transfer t arrives); a link carries one transfer
 * at a time, first come first served; `advance` runs a device's row until it blocks or starts a
 * compute node; woken devices are advanced last in, first out. Rows are flattened: device d's
 * cells are row_*[row_ptr[d] .. row_ptr[d + 1]), and row_gend holds row-local indices.
 *
 * Semantics: 0 eager, 1 rendezvous, 2 batched. Returns 0 when every cell ran, 1 when the run
 * stalled (the caller reruns the Python engine for the stalled state), -1 on allocation failure.
 * `seq` receives the started compute ids in start order (n_c of them when the run completes).
 */
#include <stdint.h>
#include <stdlib.h>

#define CELL_COMPUTE 0
#define CELL_SEND 1

typedef struct {
    double t;
    int64_t id;
} Ev;

typedef struct {
    Ev *a;
    int64_t n, cap;
} Heap;

static int ev_less(Ev x, Ev y) { return x.t < y.t || (x.t == y.t && x.id < y.id); }

static int heap_push(Heap *h, double t, int64_t id) {
    if (h->n == h->cap) {
        int64_t cap = h->cap ? 2 * h->cap : 1024;
        Ev *a = (Ev *)realloc(h->a, sizeof(Ev) * (size_t)cap);
        if (!a) return -1;
        h->a = a;
        h->cap = cap;
    }
    Ev e = {t, id};
    int64_t i = h->n++;
    while (i > 0) {
        int64_t p = (i - 1) / 2;
        if (!ev_less(e, h->a[p])) break;
        h->a[i] = h->a[p];
        i = p;
    }
    h->a[i] = e;
    return 0;
}

static Ev heap_pop(Heap *h) {
    Ev top = h->a[0];
    Ev last = h->a[--h->n];
    int64_t i = 0;
    for (;;) {
        int64_t l = 2 * i + 1;
        if (l >= h->n) break;
        int64_t c = (l + 1 < h->n && ev_less(h->a[l + 1], h->a[l])) ? l + 1 : l;
        if (!ev_less(h->a[c], last)) break;
        h->a[i] = h->a[c];
        i = c;
    }
    if (h->n > 0) h->a[i] = last;
    return top;
}

typedef struct {
    int64_t n_c, n_d;
    int eager, batched;
    const int64_t *in_t, *lp_ptr, *lp_idx, *t_link, *t_src;
    const int64_t *row_ptr, *row_type, *row_id, *row_gend;
    const double *cdur, *tdur, *alloc;
    double *start, *end, *t_start, *t_end, *link_free, *mem, *peak;
    char *send_posted, *recv_posted, *prod_done, *issued, *arrived, *busy;
    int64_t *pos, *seq, n_seq;
    int64_t *wake, n_wake;
    Heap heap;
    int oom;
} Eng;

static void issue(Eng *g, int64_t t, double now) {
    if (g->issued[t] || !g->prod_done[t] || !g->send_posted[t] || (!g->eager && !g->recv_posted[t]))
        return;
    g->issued[t] = 1;
    int64_t lk = g->t_link[t];
    double s = g->link_free[lk];
    if (now > s) s = now;
    double e = s + g->tdur[t];
    g->link_free[lk] = e;
    g->t_start[t] = s;
    g->t_end[t] = e;
    if (heap_push(&g->heap, e, g->n_c + t)) g->oom = 1;
}

static void advance(Eng *g, int64_t d, double now) {
    if (g->busy[d]) return;
    const int64_t base = g->row_ptr[d];
    const int64_t *types = g->row_type + base, *ids = g->row_id + base, *gend = g->row_gend + base;
    int64_t p = g->pos[d];
    int64_t n = g->row_ptr[d + 1] - base;
    while (p < n) {
        int64_t ty = types[p];
        int64_t x = ids[p];
        if (ty == CELL_COMPUTE) {
            for (int64_t k = g->lp_ptr[x]; k < g->lp_ptr[x + 1]; k++) {
                if (g->end[g->lp_idx[k]] < 0.0) {
                    g->pos[d] = p;
                    return;
                }
            }
            int64_t t = g->in_t[x];
            if (t >= 0 && !(g->recv_posted[t] && g->arrived[t])) {
                g->pos[d] = p;
                return;
            }
            g->start[x] = now;
            if (heap_push(&g->heap, now + g->cdur[x], x)) g->oom = 1;
            g->busy[d] = 1;
            g->seq[g->n_seq++] = x;
            double m = g->mem[d] + g->alloc[x];
            g->mem[d] = m;
            if (m > g->peak[d]) g->peak[d] = m;
            g->pos[d] = p + 1;
            return;
        }
        if (g->batched) {
            int64_t end_g = gend[p];
            int done = 1;
            for (int64_t q = p; q < end_g; q++) {
                int64_t t = ids[q];
                if (types[q] == CELL_SEND) g->send_posted[t] = 1;
                else if (!g->recv_posted[t]) g->recv_posted[t] = 1;
                issue(g, t, now);
                if (!g->arrived[t]) done = 0;
            }
            if (!done) {
                g->pos[d] = p;
                return;
            }
            p = end_g;
            continue;
        }
        if (ty == CELL_SEND) {
            g->send_posted[x] = 1;
            issue(g, x, now);
            if (!g->eager && !g->recv_posted[x]) {
                g->pos[d] = p;
                return;
            }
            p++;
            continue;
        }
        if (!g->recv_posted[x]) {
            g->recv_posted[x] = 1;
            if (!g->eager) {
                issue(g, x, now);
                g->wake[g->n_wake++] = g->t_src[x];
            }
        }
        if (!g->eager && !g->arrived[x]) {
            g->pos[d] = p;
            return;
        }
        p++;
    }
    g->pos[d] = p;
}

static void drain_wake(Eng *g, double now) {
    while (g->n_wake > 0) advance(g, g->wake[--g->n_wake], now);
}

int octo_run_strict(int64_t n_c, int64_t n_t, int64_t n_d, int64_t n_links, int semantics,
                    const int64_t *c_dev, const int64_t *in_t, const int64_t *out_t,
                    const int64_t *lp_ptr, const int64_t *lp_idx, const int64_t *t_src,
                    const int64_t *t_dst, const int64_t *t_link, const int64_t *row_ptr,
                    const int64_t *row_type, const int64_t *row_id, const int64_t *row_gend,
                    const double *cdur, const double *tdur, const double *alloc,
                    const double *free_b, double *start, double *end, double *t_start,
                    double *t_end, double *peak, int64_t *seq) {
    Eng g = {0};
    int64_t n_cells = row_ptr[n_d];
    g.n_c = n_c;
    g.n_d = n_d;
    g.eager = semantics == 0;
    g.batched = semantics == 2;
    g.in_t = in_t; g.lp_ptr = lp_ptr; g.lp_idx = lp_idx; g.t_link = t_link; g.t_src = t_src;
    g.row_ptr = row_ptr; g.row_type = row_type; g.row_id = row_id; g.row_gend = row_gend;
    g.cdur = cdur; g.tdur = tdur; g.alloc = alloc;
    g.start = start; g.end = end; g.t_start = t_start; g.t_end = t_end; g.peak = peak;
    g.seq = seq;
    g.link_free = (double *)calloc((size_t)(n_links > 0 ? n_links : 1), sizeof(double));
    g.mem = (double *)calloc((size_t)(n_d > 0 ? n_d : 1), sizeof(double));
    char *flags = (char *)calloc((size_t)(5 * (n_t > 0 ? n_t : 1) + (n_d > 0 ? n_d : 1)), 1);
    g.pos = (int64_t *)calloc((size_t)(n_d > 0 ? n_d : 1), sizeof(int64_t));
    /* a device is woken at most once per receive cell it posts, within one drain */
    g.wake = (int64_t *)malloc(sizeof(int64_t) * (size_t)(n_cells + n_d + 1));
    if (!g.link_free || !g.mem || !flags || !g.pos || !g.wake) {
        free(g.link_free); free(g.mem); free(flags); free(g.pos); free(g.wake);
        return -1;
    }
    int64_t nt = n_t > 0 ? n_t : 1;
    g.send_posted = flags; g.recv_posted = flags + nt; g.prod_done = flags + 2 * nt;
    g.issued = flags + 3 * nt; g.arrived = flags + 4 * nt; g.busy = flags + 5 * nt;
    for (int64_t x = 0; x < n_c; x++) { start[x] = 0.0; end[x] = -1.0; }
    for (int64_t t = 0; t < n_t; t++) { t_start[t] = 0.0; t_end[t] = 0.0; }
    for (int64_t d = 0; d < n_d; d++) peak[d] = 0.0;

    double now = 0.0;
    for (int64_t d = 0; d < n_d; d++) advance(&g, d, now);
    drain_wake(&g, now);
    while (g.heap.n > 0 && !g.oom) {
        Ev e = heap_pop(&g.heap);
        now = e.t;
        if (e.id < n_c) {
            int64_t c = e.id, d = c_dev[c];
            end[c] = now;
            g.busy[d] = 0;
            g.mem[d] -= free_b[c];
            int64_t t = out_t[c];
            if (t >= 0) {
                g.prod_done[t] = 1;
                issue(&g, t, now);
            }
            advance(&g, d, now);
        } else {
            int64_t t = e.id - n_c;
            g.arrived[t] = 1;
            int64_t dd = t_dst[t];
            if (!g.busy[dd]) advance(&g, dd, now);
            if (g.batched && !g.busy[t_src[t]]) advance(&g, t_src[t], now);
        }
        drain_wake(&g, now);
    }
    int status = g.oom ? -1 : 0;
    if (!status) {
        for (int64_t d = 0; d < n_d && !status; d++)
            if (g.pos[d] < row_ptr[d + 1] - row_ptr[d]) status = 1;
        for (int64_t x = 0; x < n_c && !status; x++)
            if (end[x] < 0.0) status = 1;
    }
    free(g.link_free); free(g.mem); free(flags); free(g.pos); free(g.wake); free(g.heap.a);
    return status;
}
