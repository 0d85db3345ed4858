/* OctoPipe's fast ranking estimator: a non-preemptive list scheduler over one pipeline.
 *
 * Actions are (stage s, kind k, micro-batch m) with k = 0 forward, 1 input gradient (or the
 * full backward when split_backward == 0), 2 weight gradient; id = (s * 3 + k) * M + m. Each (stage,
 * kind) queue runs its micro-batches in increasing order. Data edges: F(s,m) after F(s-1,m)
 * plus a transfer delay; I(s,m) after F(s,m) and I(s+1,m) plus a delay; W(s,m) after I(s,m).
 * Transfers are delays; with `contention`, each directed device pair is one link that carries
 * one transfer at a time, in the order their producers end (as the simulator's eager links do:
 * the producers of one link share its source device, so their start order is that order), else
 * pure delays. This is the cheap model the tuner ranks thousands of candidates with before the
 * full simulator checks the best few.
 *
 * An idle device starts, among the actions whose inputs are ready earliest, the best-ranked
 * one: kind rank first (kind_rank[k], lower first; W jumps ahead when the device's activation
 * memory exceeds w_pressure of its capacity), then a tie-break by stage and micro-batch.
 * A forward may not start if its stage already holds limit[s] micro-batches in flight or if
 * its activations would overflow the device's capacity. Devices are served in order of their
 * earliest possible start, so the schedule is built in time order.
 *
 * Returns the number of actions scheduled; fewer than the total means the limits deadlock.
 * With a finite `bound` the run stops early, returning -1, as soon as the makespan provably
 * exceeds it: starts never decrease (time order) and a device starts nothing before it is free,
 * so max(now, its free time) plus the durations of the actions it has left is a lower bound on
 * the makespan. `start`, `order` and `peak` may be NULL.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define EPS 1e-12

typedef struct {
    double est;
    int id;
    int valid;
} Choice;

/* arr_f[s * M + m]: when F(s, m)'s activations reach stage s + 1; arr_b[s * M + m]: when
 * I(s, m)'s gradient reaches stage s - 1 (-1 until the producer is scheduled). */
static double pred_ready(int s, int k, int m, int S, int M, const double *end,
                         const double *arr_f, const double *arr_b) {
    double r = 0.0, e;
    if (k == 0) {
        if (s == 0) return 0.0;
        return arr_f[(s - 1) * M + m];
    }
    if (k == 1) {
        e = end[(s * 3 + 0) * M + m];
        if (e < 0) return -1.0;
        r = e;
        if (s + 1 < S) {
            e = arr_b[(s + 1) * M + m];
            if (e < 0) return -1.0;
            if (e > r) r = e;
        }
        return r;
    }
    e = end[(s * 3 + 1) * M + m];
    return e;
}

/* Keep ready[q] = when queue q's next action's inputs are ready (-1: not yet, or none left). */
static void refresh(int s, int k, int S, int M, const int *nxt, const double *end,
                    const double *arr_f, const double *arr_b, double *ready) {
    if (s < 0 || s >= S) return;
    int m = nxt[s * 3 + k];
    ready[s * 3 + k] = m < M ? pred_ready(s, k, m, S, M, end, arr_f, arr_b) : -1.0;
}

/* When a transfer of `c` seconds from device a to b, produced at t, arrives: t + c, or with
 * `link_free` (per directed pair) after the link's earlier transfers. */
static double arrival(double t, double c, int a, int b, int D, double *link_free) {
    if (link_free == NULL || a == b) return t + c;
    double *lf = &link_free[(size_t)a * D + b];
    double s = *lf > t ? *lf : t;
    *lf = s + c;
    return s + c;
}

/* Lexicographic priority key; smaller runs first. */
static void prio_key(int s, int k, int m, int rank, int f_tiebreak, int b_tiebreak, long key[3]) {
    key[0] = rank;
    if (k == 0) {
        if (f_tiebreak == 0) { key[1] = m; key[2] = s; }
        else { key[1] = -s; key[2] = m; }
    } else {
        if (b_tiebreak == 0) { key[1] = -s; key[2] = m; }
        else { key[1] = m; key[2] = -s; }
    }
}

static int key_less(const long a[3], const long b[3]) {
    for (int i = 0; i < 3; i++) {
        if (a[i] != b[i]) return a[i] < b[i];
    }
    return 0;
}

/* What a device's choice depends on besides its own queues: the state every candidate reads. */
typedef struct {
    int S, M, split_backward;
    const int *nxt, *inflight, *limit, *kind_rank;
    const double *end, *free_t, *arr_f, *arr_b, *act, *mem, *cap;
    const double *ready;   /* [S * 3] when each queue's next action's inputs are ready; -1: not yet */
    int f_tiebreak, b_tiebreak;
    double w_pressure;
} State;

/* Offer action (s, k, next micro-batch) of device d to `out` (the device's best so far): it
 * replaces `out` if it starts earlier (beyond the tolerance) or, at the same start, ranks
 * first. Skips actions not ready (or none left), past the in-flight limit or over the memory
 * cap. */
static void offer(const State *g, int d, int s, int k, int pressured, Choice *out, long best_key[3]) {
    double r = g->ready[s * 3 + k];
    if (r < 0) return;
    int M = g->M;
    int m = g->nxt[s * 3 + k];
    if (k == 0) {
        if (g->limit[s] > 0 && g->inflight[s] >= g->limit[s]) return;
        if (g->cap[d] >= 0 && g->mem[d] + g->act[s] > g->cap[d] * (1.0 + 1e-9) + EPS) return;
    }
    double est = r > g->free_t[d] ? r : g->free_t[d];
    int rank = g->kind_rank[k];
    if (k == 2 && pressured) rank = -1;
    long key[3];
    prio_key(s, k, m, rank, g->f_tiebreak, g->b_tiebreak, key);
    double tol = 1e-12 * (fabs(est) + 1.0);
    if (!out->valid || est < out->est - tol ||
        (fabs(est - out->est) <= tol && key_less(key, best_key))) {
        out->valid = 1;
        out->est = est;
        out->id = (s * 3 + k) * M + m;
        memcpy(best_key, key, sizeof(long) * 3);
    }
}

static int is_pressured(const State *g, int d) {
    return g->cap[d] >= 0 && g->mem[d] > g->w_pressure * g->cap[d];
}

/* The device's best action over all its queues, in stage order then kind order. */
static void best_of_device(const State *g, int d, const int *dstage, int ndst, Choice *out,
                           long best_key[3]) {
    int nk = g->split_backward ? 3 : 2;
    int pressured = is_pressured(g, d);
    out->valid = 0;
    out->est = INFINITY;
    out->id = -1;
    for (int j = 0; j < ndst; j++)
        for (int k = 0; k < nk; k++) offer(g, d, dstage[j], k, pressured, out, best_key);
}

int octo_list_schedule(int S, int M, int D, int split_backward, const int *dev, const double *dur,
                       const double *comm_f, const double *comm_b, const double *act,
                       const double *free_i, const double *cap, const int *limit,
                       const int *kind_rank, int f_tiebreak, int b_tiebreak, double w_pressure,
                       int contention, double bound, double *start, int *order, double *peak,
                       double *out_makespan) {
    int total = S * M * (split_backward ? 3 : 2);
    int n = S * 3 * M;
    double *end = (double *)malloc(sizeof(double) * n);
    double *free_t = (double *)calloc(D, sizeof(double));
    double *mem = (double *)calloc(D, sizeof(double));
    int *nxt = (int *)calloc(S * 3, sizeof(int));
    int *inflight = (int *)calloc(S, sizeof(int));
    int *dstart = (int *)calloc(D + 1, sizeof(int));
    int *dstage = (int *)malloc(sizeof(int) * (S > 0 ? S : 1));
    int *dirty = (int *)malloc(sizeof(int) * D);
    Choice *cache = (Choice *)malloc(sizeof(Choice) * D);
    long *keys = (long *)malloc(sizeof(long) * 3 * (D > 0 ? D : 1));
    double *rem = (double *)calloc(D, sizeof(double));
    double *arr_f = (double *)malloc(sizeof(double) * (S * M > 0 ? S * M : 1));
    double *arr_b = (double *)malloc(sizeof(double) * (S * M > 0 ? S * M : 1));
    double *link_free = contention ? (double *)calloc((size_t)D * D, sizeof(double)) : NULL;
    double *ready = (double *)malloc(sizeof(double) * (S > 0 ? 3 * S : 1));
    double makespan = 0.0;
    int done = 0, nk = split_backward ? 3 : 2, cut = 0;

    for (int x = 0; x < n; x++) end[x] = -1.0;
    for (int x = 0; x < S * M; x++) { arr_f[x] = -1.0; arr_b[x] = -1.0; }
    if (start) for (int x = 0; x < n; x++) start[x] = -1.0;
    if (isfinite(bound))
        for (int s = 0; s < S; s++)
            for (int k = 0; k < nk; k++) rem[dev[s]] += M * dur[s * 3 + k];
    for (int s = 0; s < S; s++) dstart[dev[s] + 1]++;
    for (int d = 0; d < D; d++) dstart[d + 1] += dstart[d];
    {
        int *fill = (int *)calloc(D, sizeof(int));
        for (int s = 0; s < S; s++) dstage[dstart[dev[s]] + fill[dev[s]]++] = s;
        free(fill);
    }
    for (int d = 0; d < D; d++) { dirty[d] = 1; if (peak) peak[d] = 0.0; }
    for (int s = 0; s < S; s++)
        for (int k = 0; k < 3; k++)
            ready[s * 3 + k] = k < nk && M > 0 ? pred_ready(s, k, 0, S, M, end, arr_f, arr_b) : -1.0;
    State g = {S, M, split_backward, nxt, inflight, limit, kind_rank, end, free_t, arr_f, arr_b,
               act, mem, cap, ready, f_tiebreak, b_tiebreak, w_pressure};

    while (done < total) {
        int bd = -1;
        for (int d = 0; d < D; d++) {
            if (dirty[d]) {
                best_of_device(&g, d, dstage + dstart[d], dstart[d + 1] - dstart[d], &cache[d],
                               keys + 3 * d);
                dirty[d] = 0;
            }
            if (cache[d].valid && (bd < 0 || cache[d].est < cache[bd].est)) bd = d;
        }
        if (bd < 0) break;
        int id = cache[bd].id;
        int m = id % M, sk = id / M, s = sk / 3, k = sk % 3;
        double t0 = cache[bd].est;
        double t1 = t0 + dur[s * 3 + k];
        if (start) start[id] = t0;
        end[id] = t1;
        if (order) order[done] = id;
        done++;
        nxt[sk]++;
        free_t[bd] = t1;
        if (t1 > makespan) makespan = t1;
        if (k == 0 && s + 1 < S)
            arr_f[s * M + m] = arrival(t1, comm_f[s], dev[s], dev[s + 1], D, link_free);
        else if (k == 1 && s > 0)
            arr_b[s * M + m] = arrival(t1, comm_b[s], dev[s], dev[s - 1], D, link_free);
        /* the queues whose next action's inputs this action may complete: its own, then the
         * forward of s + 1 and input gradient of s (after F), the input gradient of s - 1 and
         * weight gradient of s (after I) */
        refresh(s, k, S, M, nxt, end, arr_f, arr_b, ready);
        if (k == 0) {
            refresh(s + 1, 0, S, M, nxt, end, arr_f, arr_b, ready);
            refresh(s, 1, S, M, nxt, end, arr_f, arr_b, ready);
        } else if (k == 1) {
            refresh(s - 1, 1, S, M, nxt, end, arr_f, arr_b, ready);
            if (split_backward) refresh(s, 2, S, M, nxt, end, arr_f, arr_b, ready);
        }
        if (k == 0) {
            inflight[s]++;
            mem[bd] += act[s];
            if (peak && mem[bd] > peak[bd]) peak[bd] = mem[bd];
        } else if (k == 1) {
            inflight[s]--;
            mem[bd] -= split_backward ? free_i[s] : act[s];
        } else {
            mem[bd] -= act[s] - free_i[s];
        }
        /* The device that ran chooses afresh (its free time, memory, queues changed). Another
         * device's state is unchanged but for one queue the action made ready, of the same
         * kind: the forward of stage s + 1 after a forward, the input gradient of stage s - 1
         * after one; offering that queue to its cached choice gives what a full rescan would. */
        dirty[bd] = 1;
        int s2 = k == 0 ? s + 1 : (k == 1 ? s - 1 : -1);
        if (s2 >= 0 && s2 < S && dev[s2] != bd && !dirty[dev[s2]])
            offer(&g, dev[s2], s2, k, is_pressured(&g, dev[s2]), &cache[dev[s2]], keys + 3 * dev[s2]);
        if (isfinite(bound)) {
            rem[bd] -= dur[s * 3 + k];
            for (int d = 0; d < D; d++) {
                double lb = (free_t[d] > t0 ? free_t[d] : t0) + (rem[d] > 0.0 ? rem[d] : 0.0);
                if (lb > bound) { makespan = lb; cut = 1; break; }
            }
            if (cut) break;
        }
    }
    *out_makespan = makespan;
    free(end); free(free_t); free(mem); free(nxt); free(inflight);
    free(dstart); free(dstage); free(dirty); free(cache); free(keys); free(rem);
    free(arr_f); free(arr_b); free(link_free); free(ready);
    return cut ? -1 : done;
}

/* A problem's per-layer inputs to `octo_stage_arrays` (built once per problem): the cost table's
 * prefix sums pfiw [L + 1, K, 4] (F, I, W and the full backward B per kind column) and p1
 * [L + 1, 3] (act, w_act, static bytes), each layer's out bytes, the [D, D] link latency and
 * bandwidth, each device's kind column and memory, and its activation budget (NULL: none);
 * `has_b`: a B costs its own column plus `action_s` (else I + W), the host seconds every
 * action adds once. */
typedef struct {
    int n_devices, n_kinds, contention, has_b;
    const long long *kind_col;
    const double *pfiw, *p1, *out_bytes, *lat, *bw, *memory, *budget;
    double action_s;
} Tables;

/* A list-scheduling policy (see octo_list_schedule), `limit` [S]. */
typedef struct {
    int split_backward, f_tiebreak, b_tiebreak;
    int kind_rank[3];
    double w_pressure;
    const int *limit;
} Policy;

/* The estimator's per-stage inputs for one partition and placement, as `Problem._arrays_numpy`
 * builds them (the same operations in the same order, so the same bits): every figure a
 * difference of two rows of the prefix sums. `layout` holds the S stage sizes, then the S
 * devices. `buf` [7 S + D] receives dur [S, 3], comm_f, comm_b, act, free_i [S] and the
 * capacity [D]: memory minus the static bytes (summed in stage order, as numpy's bincount),
 * capped by the budget (as numpy's minimum: a NaN wins, a tie gives the budget). Returns 1
 * when some device's capacity is negative (the layout does not fit), else 0. */
int octo_stage_arrays(const Tables *t, int S, int split_backward, const int *layout, double *buf) {
    const int *dev = layout + S;
    int D = t->n_devices, K = t->n_kinds;
    const double *pfiw = t->pfiw, *p1 = t->p1;
    double *dur = buf, *comm_f = buf + 3 * S, *comm_b = buf + 4 * S, *act = buf + 5 * S;
    double *free_i = buf + 6 * S, *cap = buf + 7 * S;
    long lo = 0;
    int neg = 0;
    for (int d = 0; d < D; d++) cap[d] = 0.0;
    for (int s = 0; s < S; s++) {
        long hi = lo + layout[s];
        const double *fh = pfiw + (hi * K + t->kind_col[dev[s]]) * 4;
        const double *fl = pfiw + (lo * K + t->kind_col[dev[s]]) * 4;
        const double *bh = p1 + hi * 3, *bl = p1 + lo * 3;
        double h = t->action_s;
        double f = (fh[0] - fl[0]) + h, i = (fh[1] - fl[1]) + h, w = (fh[2] - fl[2]) + h;
        double a = bh[0] - bl[0], wa = bh[1] - bl[1], st = bh[2] - bl[2];
        dur[3 * s] = f;
        if (split_backward) {
            dur[3 * s + 1] = i;
            dur[3 * s + 2] = w;
            free_i[s] = a - wa;
        } else {
            dur[3 * s + 1] = t->has_b ? (fh[3] - fl[3]) + h : i + w;
            dur[3 * s + 2] = 0.0;
            free_i[s] = a;
        }
        act[s] = a;
        cap[dev[s]] += st;
        if (s + 1 < S) {
            long x = dev[s], y = dev[s + 1];
            double c = x == y ? 0.0 : t->lat[x * D + y] + t->out_bytes[hi - 1] / t->bw[x * D + y];
            comm_f[s] = c;
            comm_b[s + 1] = c;
        }
        lo = hi;
    }
    if (S > 0) { comm_f[S - 1] = 0.0; comm_b[0] = 0.0; }
    for (int d = 0; d < D; d++) {
        double c = t->memory[d] - cap[d];
        if (t->budget != NULL && !(c < t->budget[d] || isnan(c))) c = t->budget[d];
        cap[d] = c;
        if (c < 0) neg = 1;
    }
    return neg;
}

/* The estimate of one layout under policy `p`: `octo_list_schedule`'s makespan over the arrays
 * in `buf` (filled first by `octo_stage_arrays` when `fill`); infinity when some capacity is
 * negative or the limits deadlock, NaN when the run stopped early above `bound`. */
double octo_estimate(const Tables *t, const Policy *p, int S, int M, const int *layout, double *buf,
                     int fill, double bound) {
    int D = t->n_devices;
    double ms = 0.0;
    if (fill) octo_stage_arrays(t, S, p->split_backward, layout, buf);
    for (int d = 0; d < D; d++)
        if (buf[7 * S + d] < 0) return INFINITY;
    int done = octo_list_schedule(S, M, D, p->split_backward, layout + S, buf, buf + 3 * S,
                                  buf + 4 * S, buf + 5 * S, buf + 6 * S, buf + 7 * S, p->limit,
                                  p->kind_rank, p->f_tiebreak, p->b_tiebreak, p->w_pressure,
                                  t->contention, bound, NULL, NULL, NULL, &ms);
    if (done < 0) return NAN;
    return done == S * M * (p->split_backward ? 3 : 2) ? ms : INFINITY;
}
