/* policies.assign._greedy: greedy_swap's two phases (policies/assign/greedy_swap.py) in C,
 * the optional compiled path (setup.py, optional=True; policies/assign/compiled.py loads
 * it). The numpy path stays in the package as the fallback, and
 * tests/unit/policies/assign/test_greedy_compiled.py compares the two decision for decision
 * (and both with the reference implementation the numpy path replaced).
 *
 * Why: the numpy path costs a few dozen array calls per exchange round on arrays of a few
 * thousand elements, so at G = 32 / pool 128 / lookahead 20 its time is call overhead, not
 * arithmetic. Here every candidate is scored in a plain loop, in the same order and with
 * the same tie-breaks as the numpy path:
 *   - the greedy phase once per start (the numpy path steps all starts in one array; every
 *     start computes exactly what it would alone), the best start by (J, start index);
 *   - per round, exchanges of each admitted x with every pooled y (the direct sum over the
 *     window that the numpy path evaluates in closed form), with every y admitted on
 *     another rank, the J-neutral plateau step, and moves to ranks with a slot still empty.
 * Loads and sizes are token counts: integers, so every score is an exact integer in double
 * and the order of summation changes no value (greedy_swap.py only calls this when they
 * are); the greedy's ceilings can be quantiles (multiples of 1/4), still exact. Built
 * with -ffp-contract=off, like compressor/_fast.c.
 *
 * Hostile input: every array is length-checked, loads and sizes finite, sizes' order
 * (by_size) a permutation, u at most min(pool, free slots); errors release what was taken. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define EPS 1e-9

typedef struct {
    Py_ssize_t g_n, h_n, p_n;
    const double *sizes; /* [P] */
} Dims;

/* A read-only C-contiguous array of n items of itemsize bytes (n < 0: any length). */
static int
get_in(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, Py_ssize_t *n, const char *name)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS) < 0) {
        return -1;
    }
    if (view->len % itemsize != 0 || (*n >= 0 && view->len != itemsize * *n)) {
        PyErr_Format(PyExc_ValueError, "%s: %zd bytes, not %zd items of %zd", name, view->len,
                     *n, itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    *n = view->len / itemsize;
    return 0;
}

/* Phase 1 for one start (floor: the ceiling's floor, -inf for none): place u requests. */
static void
greedy_start(const Dims *dm, const double *base, const int64_t *free_in,
             const int64_t *by_size, double floor_, Py_ssize_t u, double *loads, int64_t *free_,
             int64_t *where, Py_ssize_t *left, double *left_sizes, double *ceil_, double *rise)
{
    Py_ssize_t g_n = dm->g_n, h_n = dm->h_n, p_n = dm->p_n;
    memcpy(loads, base, (size_t)(g_n * h_n) * sizeof(double));
    memcpy(free_, free_in, (size_t)g_n * sizeof(int64_t));
    Py_ssize_t n_left = p_n;
    for (Py_ssize_t i = 0; i < p_n; i++) {
        where[i] = -1;
        left[i] = i;
        left_sizes[i] = dm->sizes[by_size[i]];
    }
    for (Py_ssize_t placed = 0; placed < u; placed++) {
        Py_ssize_t need = u - placed;
        for (Py_ssize_t h = 0; h < h_n; h++) {
            double m = loads[h];
            for (Py_ssize_t g = 1; g < g_n; g++) {
                double v = loads[g * h_n + h];
                m = v > m ? v : m;
            }
            ceil_[h] = m > floor_ ? m : floor_;
        }
        /* room_g: the largest request rank g takes without raising any step's ceiling */
        double most = -INFINITY;
        for (Py_ssize_t g = 0; g < g_n; g++) {
            if (free_[g] <= 0) {
                continue;
            }
            const double *lg = loads + g * h_n;
            double room = INFINITY;
            for (Py_ssize_t h = 0; h < h_n; h++) {
                double r = (ceil_[h] - lg[h]) - (double)h;
                room = r < room ? r : room;
            }
            most = room > most ? room : most;
        }
        /* bisect_right(left_sizes, most) */
        Py_ssize_t lo = 0, hi = n_left;
        while (lo < hi) {
            Py_ssize_t mid = (lo + hi) / 2;
            if (most < left_sizes[mid]) {
                hi = mid;
            }
            else {
                lo = mid + 1;
            }
        }
        /* the largest that fits somewhere; else the largest of the `need` smallest */
        Py_ssize_t k = lo > 0 ? lo - 1 : need - 1;
        Py_ssize_t chosen = (Py_ssize_t)by_size[left[k]];
        memmove(left + k, left + k + 1, (size_t)(n_left - k - 1) * sizeof(Py_ssize_t));
        memmove(left_sizes + k, left_sizes + k + 1, (size_t)(n_left - k - 1) * sizeof(double));
        n_left--;
        double size = dm->sizes[chosen];
        double least = INFINITY;
        for (Py_ssize_t g = 0; g < g_n; g++) {
            if (free_[g] <= 0) {
                rise[g] = INFINITY;
                continue;
            }
            const double *lg = loads + g * h_n;
            double s = 0.0;
            for (Py_ssize_t h = 0; h < h_n; h++) {
                double over = (size + (double)h) - (ceil_[h] - lg[h]);
                s += over > 0.0 ? over : 0.0;
            }
            rise[g] = s;
            least = s < least ? s : least;
        }
        double limit = least + EPS;
        Py_ssize_t pick = -1, ties = 0;
        for (Py_ssize_t g = 0; g < g_n; g++) {
            if (rise[g] <= limit) {
                ties++;
                if (pick < 0) {
                    pick = g;
                }
            }
        }
        if (ties > 1) { /* the tie with the most headroom per free slot left */
            double best = -INFINITY;
            Py_ssize_t best_g = -1;
            for (Py_ssize_t g = 0; g < g_n; g++) {
                double v = -INFINITY;
                if (rise[g] <= limit) {
                    v = ((ceil_[0] - loads[g * h_n]) - size) / (double)free_[g];
                }
                if (best_g < 0 || v > best) {
                    best = v;
                    best_g = g;
                }
            }
            pick = best_g;
        }
        where[chosen] = pick;
        double *lp = loads + pick * h_n;
        for (Py_ssize_t h = 0; h < h_n; h++) {
            lp[h] += size + (double)h;
        }
        free_[pick]--;
    }
}

/* J = Σ_h (G·max_g L_g − Σ_g L_g) of loads [G, H+1]. */
static double
objective_of(const Dims *dm, const double *loads)
{
    double j = 0.0;
    for (Py_ssize_t h = 0; h < dm->h_n; h++) {
        double m = loads[h], s = 0.0;
        for (Py_ssize_t g = 0; g < dm->g_n; g++) {
            double v = loads[g * dm->h_n + h];
            m = v > m ? v : m;
            s += v;
        }
        j += (double)dm->g_n * m - s;
    }
    return j;
}

typedef struct {
    /* per step: the three heaviest ranks (stable: lower index first on equal loads) */
    int64_t *idx;   /* [3, H+1] */
    double *vals;   /* [3, H+1] */
    double *top;    /* [H+1] */
    double *sums;   /* [G]: Σ_h L_g */
    Py_ssize_t *admitted;
    int64_t *ra;
    double *gain;   /* [U, P] */
    double *outside; /* [H+1] */
    Py_ssize_t *open_ranks;
} Scratch;

/* The heaviest load at step h among ranks other than a and b (the numpy path's fallback
 * is the third value whatever its rank). */
static inline double
max_outside(const Scratch *sc, Py_ssize_t h_n, Py_ssize_t h, int64_t a, int64_t b)
{
    int64_t i0 = sc->idx[h], i1 = sc->idx[h_n + h];
    if (i0 != a && i0 != b) {
        return sc->vals[h];
    }
    if (i1 != a && i1 != b) {
        return sc->vals[h_n + h];
    }
    return sc->vals[2 * h_n + h];
}

/* Phase 2, one round: apply the best improving move (1), else a J-neutral exchange that
 * spreads the load less (2, when plateau); 0 when there is none. */
static int
improve(const Dims *dm, double *loads, int64_t *free_, int64_t *where, Scratch *sc, int plateau)
{
    Py_ssize_t g_n = dm->g_n, h_n = dm->h_n, p_n = dm->p_n;
    const double *sizes = dm->sizes;
    double gf = (double)g_n, hf = (double)h_n;
    for (Py_ssize_t h = 0; h < h_n; h++) {
        int64_t i3[3] = {-1, -1, -1};
        double v3[3] = {-INFINITY, -INFINITY, -INFINITY};
        for (Py_ssize_t g = 0; g < g_n; g++) {
            double v = loads[g * h_n + h];
            if (i3[0] < 0 || v > v3[0]) {
                i3[2] = i3[1], v3[2] = v3[1], i3[1] = i3[0], v3[1] = v3[0];
                i3[0] = g, v3[0] = v;
            }
            else if (i3[1] < 0 || v > v3[1]) {
                i3[2] = i3[1], v3[2] = v3[1];
                i3[1] = g, v3[1] = v;
            }
            else if (i3[2] < 0 || v > v3[2]) {
                i3[2] = g, v3[2] = v;
            }
        }
        for (int r = 0; r < 3; r++) {
            sc->idx[r * h_n + h] = i3[r];
            sc->vals[r * h_n + h] = v3[r];
        }
        sc->top[h] = v3[0];
    }
    Py_ssize_t n_adm = 0;
    for (Py_ssize_t i = 0; i < p_n; i++) {
        if (where[i] >= 0) {
            sc->admitted[n_adm] = i;
            sc->ra[n_adm] = where[i];
            n_adm++;
        }
    }
    Py_ssize_t n_same = 0;
    /* x ↔ y (pooled, or admitted on the same rank: overwritten below): rank a sheds d */
    for (Py_ssize_t x = 0; x < n_adm; x++) {
        int64_t a = sc->ra[x];
        const double *la = loads + a * h_n;
        double sx = sizes[sc->admitted[x]];
        for (Py_ssize_t h = 0; h < h_n; h++) {
            sc->outside[h] = sc->idx[h] != a ? sc->vals[h] : sc->vals[h_n + h];
        }
        double *row = sc->gain + x * p_n;
        for (Py_ssize_t y = 0; y < p_n; y++) {
            if (where[y] >= 0) {
                if (where[y] == a) {
                    row[y] = INFINITY;
                    n_same++;
                }
                continue; /* admitted elsewhere: the pair loop */
            }
            double d = sx - sizes[y];
            double s = 0.0;
            for (Py_ssize_t h = 0; h < h_n; h++) {
                double shed = la[h] - d, o = sc->outside[h];
                s += (shed > o ? shed : o) - sc->top[h];
            }
            row[y] = gf * s + hf * d;
        }
    }
    /* x ↔ y admitted on b ≠ a: b gains d; symmetric, so one triangle */
    for (Py_ssize_t x = 0; x < n_adm; x++) {
        int64_t a = sc->ra[x];
        const double *la = loads + a * h_n;
        double sx = sizes[sc->admitted[x]];
        for (Py_ssize_t y = x + 1; y < n_adm; y++) {
            int64_t b = sc->ra[y];
            if (b == a) {
                continue; /* inf, set above */
            }
            const double *lb = loads + b * h_n;
            double da = sx - sizes[sc->admitted[y]];
            double s = 0.0;
            for (Py_ssize_t h = 0; h < h_n; h++) {
                double o = max_outside(sc, h_n, h, a, b);
                double pa = la[h] - da, pb = lb[h] + da;
                double m = o > pa ? o : pa;
                m = m > pb ? m : pb;
                s += m - sc->top[h];
            }
            sc->gain[x * p_n + sc->admitted[y]] = sc->gain[y * p_n + sc->admitted[x]] = gf * s;
        }
    }
    Py_ssize_t total = n_adm * p_n;
    Py_ssize_t valid = total - n_same;
    Py_ssize_t best_j = -1;
    double best = 0.0;
    if (valid) {
        best_j = 0;
        best = sc->gain[0];
        for (Py_ssize_t j = 1; j < total; j++) {
            if (sc->gain[j] < best) {
                best = sc->gain[j];
                best_j = j;
            }
        }
    }
    int neutral_step = 0;
    if (best >= -EPS && valid && plateau) {
        /* a plateau: the J-neutral exchange that spreads the load least (Σ L² falls) */
        for (Py_ssize_t g = 0; g < g_n; g++) {
            double s = 0.0;
            for (Py_ssize_t h = 0; h < h_n; h++) {
                s += loads[g * h_n + h];
            }
            sc->sums[g] = s;
        }
        Py_ssize_t n_neutral = 0, k = -1;
        double least = 0.0;
        for (Py_ssize_t j = 0; j < total; j++) {
            if (!(sc->gain[j] <= EPS)) {
                continue;
            }
            Py_ssize_t x = j / p_n, y = j % p_n;
            double dn = sizes[sc->admitted[x]] - sizes[y];
            double sp = hf * (dn * dn) - (2.0 * dn) * sc->sums[sc->ra[x]];
            if (where[y] >= 0) {
                sp += hf * (dn * dn) + (2.0 * dn) * sc->sums[where[y]];
            }
            if (k < 0 || sp < least) {
                least = sp;
                k = j;
            }
            n_neutral++;
        }
        if (n_neutral && least < -1e-6) {
            best_j = k;
            best = -1.0; /* as if it improved */
            neutral_step = 1;
        }
    }
    /* moves: x admitted on a to a rank c that still has an empty slot */
    Py_ssize_t n_open = 0;
    for (Py_ssize_t g = 0; g < g_n; g++) {
        if (free_[g] > 0) {
            sc->open_ranks[n_open++] = g;
        }
    }
    Py_ssize_t move_x = -1, move_c = -1;
    if (n_open) {
        double m_best = INFINITY;
        Py_ssize_t m_x = -1, m_c = -1;
        for (Py_ssize_t x = 0; x < n_adm; x++) {
            int64_t a = sc->ra[x];
            double sx = sizes[sc->admitted[x]];
            for (Py_ssize_t q = 0; q < n_open; q++) {
                int64_t c = (int64_t)sc->open_ranks[q];
                if (c == a) {
                    continue;
                }
                double s = 0.0;
                for (Py_ssize_t h = 0; h < h_n; h++) {
                    double w = sx + (double)h;
                    double pa = loads[a * h_n + h] - w, pc = loads[c * h_n + h] + w;
                    double inner = pa > pc ? pa : pc;
                    double o = max_outside(sc, h_n, h, a, c);
                    s += (o > inner ? o : inner) - sc->top[h];
                }
                double mg = gf * s;
                if (m_x < 0 || mg < m_best) {
                    m_best = mg;
                    m_x = sc->admitted[x];
                    m_c = c;
                }
            }
        }
        if (m_x >= 0 && m_best < best) {
            best = m_best;
            move_x = m_x;
            move_c = m_c;
        }
    }
    if (best >= -EPS) {
        return 0;
    }
    if (move_x >= 0) {
        int64_t a = where[move_x];
        double sx = sizes[move_x];
        for (Py_ssize_t h = 0; h < h_n; h++) {
            double w = sx + (double)h;
            loads[a * h_n + h] -= w;
            loads[move_c * h_n + h] += w;
        }
        free_[a]++;
        free_[move_c]--;
        where[move_x] = move_c;
        return 1;
    }
    Py_ssize_t xi = sc->admitted[best_j / p_n], yi = best_j % p_n;
    int64_t rank_a = where[xi], rank_b = where[yi];
    double shift = sizes[xi] - sizes[yi];
    for (Py_ssize_t h = 0; h < h_n; h++) {
        loads[rank_a * h_n + h] -= shift;
        if (rank_b >= 0) {
            loads[rank_b * h_n + h] += shift;
        }
    }
    where[xi] = rank_b;
    where[yi] = rank_a;
    return neutral_step ? 2 : 1;
}

/* greedy_swap(base, horizon, free, sizes, by_size, levels, u, rounds, where): see
 * greedy_swap.py. base float64 [G, horizon] (C order), free int64 [G], sizes float64 [P],
 * by_size int64 [P] (a stable argsort of sizes), levels float64 [S] (-inf: the current
 * maxima), where int64 [P] (out: each pooled request's rank, -1 pooled). */
static PyObject *
greedy_swap(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *base_o, *free_o, *sizes_o, *order_o, *levels_o, *where_o;
    Py_ssize_t h_n, u, rounds;
    if (!PyArg_ParseTuple(args, "OnOOOOnnO", &base_o, &h_n, &free_o, &sizes_o, &order_o,
                          &levels_o, &u, &rounds, &where_o)) {
        return NULL;
    }
    Py_buffer base_b, free_b, sizes_b, order_b, levels_b, where_b;
    int held = 0;
    PyObject *result = NULL;
    char *mem = NULL;
    Py_ssize_t cells = -1, g_n = -1, p_n = -1, s_n = -1;
    if (get_in(base_o, &base_b, 8, &cells, "base") < 0) {
        goto done;
    }
    held = 1;
    if (get_in(free_o, &free_b, 8, &g_n, "free") < 0) {
        goto done;
    }
    held = 2;
    if (get_in(sizes_o, &sizes_b, 8, &p_n, "sizes") < 0) {
        goto done;
    }
    held = 3;
    if (get_in(order_o, &order_b, 8, &p_n, "by_size") < 0) {
        goto done;
    }
    held = 4;
    if (get_in(levels_o, &levels_b, 8, &s_n, "levels") < 0) {
        goto done;
    }
    held = 5;
    if (PyObject_GetBuffer(where_o, &where_b, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        goto done;
    }
    held = 6;
    if (where_b.len != 8 * p_n) {
        PyErr_SetString(PyExc_ValueError, "where: not one int64 per pooled request");
        goto done;
    }
    if (h_n < 1 || g_n < 1 || cells != g_n * h_n) {
        PyErr_SetString(PyExc_ValueError, "base: not [len(free), horizon] float64");
        goto done;
    }
    if (s_n < 1 || rounds < 0) {
        PyErr_SetString(PyExc_ValueError, "no start, or negative rounds");
        goto done;
    }
    const double *base = base_b.buf, *levels = levels_b.buf;
    const int64_t *free_in = free_b.buf, *by_size = order_b.buf;
    const double *sizes_in = sizes_b.buf;
    for (Py_ssize_t i = 0; i < cells; i++) {
        if (!isfinite(base[i])) {
            PyErr_SetString(PyExc_ValueError, "base: not finite");
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < p_n; i++) {
        if (!isfinite(sizes_in[i])) {
            PyErr_SetString(PyExc_ValueError, "sizes: not finite");
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < s_n; i++) {
        if (isnan(levels[i]) || levels[i] == INFINITY) {
            PyErr_SetString(PyExc_ValueError, "levels: NaN or +inf");
            goto done;
        }
    }
    int64_t free_total = 0;
    for (Py_ssize_t g = 0; g < g_n; g++) {
        free_total += free_in[g] > 0 ? free_in[g] : 0;
    }
    if (u < 0 || u > p_n || u > free_total) {
        PyErr_SetString(PyExc_ValueError, "u: more than the pool or the free slots");
        goto done;
    }
    size_t gh = (size_t)(g_n * h_n), g = (size_t)g_n, p = (size_t)p_n, hn = (size_t)h_n;
    size_t up = (size_t)u * p;
    /* two states (the best start so far, the current one) and the scratch */
    size_t bytes = 2 * (gh * 8 + g * 8 + p * 8) + p * sizeof(Py_ssize_t) + p * 8 + hn * 8 +
                   g * 8 + 3 * hn * 8 * 2 + hn * 8 + g * 8 + p * sizeof(Py_ssize_t) + p * 8 +
                   up * 8 + hn * 8 + g * sizeof(Py_ssize_t);
    mem = PyMem_Calloc(1, bytes);
    if (mem == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    char *at = mem;
#define TAKE(ptr, type, n) \
    ptr = (type *)at;      \
    at += (n) * sizeof(type)
    double *loads[2], *rise, *ceil_, *left_sizes;
    int64_t *freev[2], *wherev[2];
    Py_ssize_t *left;
    Scratch sc;
    for (int s = 0; s < 2; s++) {
        TAKE(loads[s], double, gh);
        TAKE(freev[s], int64_t, g);
        TAKE(wherev[s], int64_t, p);
    }
    TAKE(left, Py_ssize_t, p);
    TAKE(left_sizes, double, p);
    TAKE(ceil_, double, hn);
    TAKE(rise, double, g);
    TAKE(sc.idx, int64_t, 3 * hn);
    TAKE(sc.vals, double, 3 * hn);
    TAKE(sc.top, double, hn);
    TAKE(sc.sums, double, g);
    TAKE(sc.admitted, Py_ssize_t, p);
    TAKE(sc.ra, int64_t, p);
    TAKE(sc.gain, double, up);
    TAKE(sc.outside, double, hn);
    TAKE(sc.open_ranks, Py_ssize_t, g);
#undef TAKE
    /* by_size must be a permutation (it indexes sizes and where) */
    memset(wherev[0], 0, p * 8);
    for (Py_ssize_t i = 0; i < p_n; i++) {
        int64_t k = by_size[i];
        if (k < 0 || k >= p_n || wherev[0][k]) {
            PyErr_SetString(PyExc_ValueError, "by_size: not a permutation of the pool");
            goto done;
        }
        wherev[0][k] = 1;
    }
    Dims dm = {g_n, h_n, p_n, sizes_b.buf};
    int best_s = -1, cur = 0;
    double best_j = 0.0;
    for (Py_ssize_t n = 0; n < s_n; n++) {
        greedy_start(&dm, base, free_in, by_size, levels[n], u, loads[cur], freev[cur],
                     wherev[cur], left, left_sizes, ceil_, rise);
        double j = objective_of(&dm, loads[cur]);
        if (best_s < 0 || j < best_j) { /* min over (J, start): the first on ties */
            best_j = j;
            best_s = cur;
            cur = 1 - cur;
        }
    }
    double *ld = loads[best_s];
    int64_t *fr = freev[best_s], *wh = wherev[best_s];
    Py_ssize_t plateau_left = 2 * u;
    if (u > 0) {
        for (Py_ssize_t r = 0; r < rounds; r++) {
            int step = improve(&dm, ld, fr, wh, &sc, plateau_left > 0);
            if (step == 0) {
                break;
            }
            plateau_left -= step == 2;
        }
    }
    memcpy(where_b.buf, wh, p * 8);
    result = Py_NewRef(Py_None);
done:
    PyMem_Free(mem);
    switch (held) {
    case 6:
        PyBuffer_Release(&where_b);
        /* fall through */
    case 5:
        PyBuffer_Release(&levels_b);
        /* fall through */
    case 4:
        PyBuffer_Release(&order_b);
        /* fall through */
    case 3:
        PyBuffer_Release(&sizes_b);
        /* fall through */
    case 2:
        PyBuffer_Release(&free_b);
        /* fall through */
    case 1:
        PyBuffer_Release(&base_b);
        /* fall through */
    default:
        break;
    }
    return result;
}

static PyMethodDef methods[] = {
    {"greedy_swap", greedy_swap, METH_VARARGS,
     "greedy_swap(base, horizon, free, sizes, by_size, levels, u, rounds, where): BF-IO's "
     "greedy starts and exchange rounds; writes each pooled request's rank (-1: pooled) "
     "into where (policies/assign/greedy_swap.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "policies.assign._greedy",
    "BF-IO's greedy_swap in C (optional; numpy fallback).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__greedy(void)
{
    return PyModule_Create(&module);
}
