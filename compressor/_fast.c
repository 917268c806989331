/* compressor._fast: the compressor's per-piece and per-character passes in C, the optional
 * compiled path (setup.py, optional=True; compressor/compiled.py loads it). Each function
 * replaces one numpy/Python step that stays in the package as the fallback and as the
 * reference tests/unit/compressor/test_fast.py compares it with, value for value (floats
 * bit for bit); every one works on one whole text or document per call, so Python is left
 * with per-unit (hundreds), not per-piece (thousands), work:
 *
 *   probe_pieces   piecetable.py: split on b" ", key and look up every piece (longer ones
 *                  in the memo dict)
 *   insert_pieces  piecetable.py: PieceTable.insert of the misses' keys, slot for slot
 *   chunk_counts   counting.py: piece_counts_in (glued chunks looked up in the memo here)
 *   piece_features document.py: per-piece offsets, sentence flags, term ids
 *   unit_terms     document.py: words per unit and the unit x term matrix (_sparse)
 *   line_breaks    linebreaks.py: the vectorised line-break search, as one scan
 *   textrank       scoring.py: TextRank's iterations
 *   code_counts    content.py: code_score's substring counts, in one scan
 *   kept_segments  exact.py: kept_tokens' walk over the kept spans
 *
 * Hostile input: the text only ever arrives as a str or its UTF-8 bytes; every array is
 * length-checked, every index read from one is range-checked before use, the memo dicts
 * are only read (a miss comes back to Python), and errors release what was taken. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define WORDS 4
#define ROW (WORDS + 1)
#define MAX_KEY_BYTES (8 * WORDS - 1)
#define PROBES 4

static const uint64_t MIX[WORDS] = {0x9E3779B97F4A7C15ULL, 0xC2B2AE3D27D4EB4FULL,
                                    0x165667B19E3779F9ULL, 0xD6E8FEB86659FD93ULL};

/* Bytes [p, p + k) (k ≤ 8) as a little-endian word, the rest zero. */
static inline uint64_t
load_le(const unsigned char *p, Py_ssize_t k)
{
    uint64_t w = 0;
    for (Py_ssize_t i = k - 1; i >= 0; i--) {
        w = (w << 8) | p[i];
    }
    return w;
}

static inline uint64_t
load_le8(const unsigned char *p)
{
    uint64_t w;
    memcpy(&w, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    w = __builtin_bswap64(w);
#endif
    return w;
}

/* The exact key of the piece of plen ≤ MAX_KEY_BYTES bytes at data[start:] (piecetable.py's
 * piece_keys) into key, and its home slot (PieceTable._slots). */
static inline uint64_t
key_of(const unsigned char *data, Py_ssize_t len, Py_ssize_t start, Py_ssize_t plen,
       unsigned shift, uint64_t *key)
{
    const unsigned char *p = data + start;
    if (start + 8 * WORDS <= len) { /* whole words, masked to the piece */
        for (int w = 0; w < WORDS; w++) {
            Py_ssize_t k = plen - 8 * w;
            uint64_t word = load_le8(p + 8 * w);
            key[w] = k >= 8 ? word : (k <= 0 ? 0 : word & ((1ULL << (8 * k)) - 1));
        }
    }
    else { /* near the end of the text: never read past it */
        for (int w = 0; w < WORDS; w++) {
            Py_ssize_t k = plen - 8 * w;
            k = k < 0 ? 0 : (k > 8 ? 8 : k);
            key[w] = k > 0 ? load_le(p + 8 * w, k) : 0;
        }
    }
    key[WORDS - 1] |= (uint64_t)(plen + 1) << 56;
    uint64_t h = 0;
    for (int w = 0; w < WORDS; w++) {
        h += key[w] * MIX[w];
    }
    h ^= h >> 31;
    h *= MIX[0];
    return h >> shift;
}

/* Pieces are keyed a block at a time and their home slots prefetched before any is probed:
 * the table (10 MB) is mostly out of cache, and the misses of a block then overlap. */
#define BLOCK 32

static void
probe_block(const uint64_t (*keys)[WORDS], const uint64_t *slots, const Py_ssize_t *idx,
            int m, const uint64_t *rows, uint64_t mask, int64_t *values, uint8_t *found)
{
    for (int j = 0; j < m; j++) {
        const uint64_t *key = keys[j];
        uint64_t slot = slots[j];
        for (int r = 0; r < PROBES; r++) {
            const uint64_t *row = rows + slot * ROW;
            uint64_t last = row[WORDS - 1];
            if (last == key[WORDS - 1] && row[0] == key[0] && row[1] == key[1] &&
                row[2] == key[2]) {
                values[idx[j]] = (int64_t)row[WORDS];
                found[idx[j]] = 1;
                break;
            }
            if (last == 0) {
                break; /* an empty slot: absent */
            }
            slot = (slot + 1) & mask;
        }
    }
}

static void
probe_all(const unsigned char *data, Py_ssize_t len, const uint64_t *rows, uint64_t mask,
          unsigned shift, int64_t *values, uint8_t *found, int64_t *starts, int64_t *ends,
          Py_ssize_t n)
{
    uint64_t keys[BLOCK][WORDS];
    uint64_t slots[BLOCK];
    Py_ssize_t idx[BLOCK];
    int m = 0;
    Py_ssize_t start = 0, i = 0;
    for (;;) {
        const unsigned char *sp = memchr(data + start, ' ', (size_t)(len - start));
        Py_ssize_t end = sp ? (Py_ssize_t)(sp - data) : len;
        if (i >= n) {
            break; /* cannot happen: the caller counted the spaces */
        }
        starts[i] = start;
        ends[i] = end;
        values[i] = 0;
        found[i] = 0;
        Py_ssize_t plen = end - start;
        if (plen <= MAX_KEY_BYTES) {
            slots[m] = key_of(data, len, start, plen, shift, keys[m]);
            idx[m] = i;
#if defined(__GNUC__)
            __builtin_prefetch(rows + slots[m] * ROW);
            __builtin_prefetch(rows + slots[m] * ROW + ROW);
#endif
            if (++m == BLOCK) {
                probe_block((const uint64_t (*)[WORDS])keys, slots, idx, m, rows, mask,
                            values, found);
                m = 0;
            }
        }
        i++;
        if (!sp) {
            break;
        }
        start = end + 1;
    }
    probe_block((const uint64_t (*)[WORDS])keys, slots, idx, m, rows, mask, values, found);
}

static int
get_out(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, Py_ssize_t n, const char *name)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        return -1;
    }
    if (view->len != itemsize * n) {
        PyErr_Format(PyExc_ValueError, "%s: %zd bytes, expected %zd", name, view->len,
                     itemsize * n);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* A read-only int64 array of n items (n < 0: any length, returned in *n). */
static int
get_in(PyObject *obj, Py_buffer *view, Py_ssize_t *n, const char *name)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS) < 0) {
        return -1;
    }
    if (view->len % 8 != 0 || (*n >= 0 && view->len != 8 * *n)) {
        PyErr_Format(PyExc_ValueError, "%s: %zd bytes, not %zd int64", name, view->len, *n);
        PyBuffer_Release(view);
        return -1;
    }
    *n = view->len / 8;
    return 0;
}

/* The value of the str of UTF-8 bytes [p, p + len) in dict `memo`: 1 found (in *value), 0
 * absent (or not a dict), -1 error. */
static int
dict_value(PyObject *memo, const unsigned char *p, Py_ssize_t len, int64_t *value)
{
    PyObject *key = PyUnicode_DecodeUTF8((const char *)p, len, "surrogatepass");
    if (key == NULL) {
        return -1;
    }
    PyObject *v = PyDict_GetItemWithError(memo, key); /* borrowed */
    Py_DECREF(key);
    if (v == NULL) {
        return PyErr_Occurred() ? -1 : 0;
    }
    long long x = PyLong_AsLongLong(v);
    if (x == -1 && PyErr_Occurred()) {
        return -1;
    }
    *value = (int64_t)x;
    return 1;
}

/* probe_pieces(raw, rows, mask, shift, memo, values, found, starts, ends) fills, for each
 * piece of raw.split(b" ") (n = raw.count(b" ") + 1 of them, the caller sizes the arrays):
 * starts/ends its byte span; for a piece of at most MAX_KEY_BYTES bytes whose exact key is
 * in the table (found within PROBES linear-probe rounds from its home slot, as
 * PieceTable.lookup) values its value and found 1; for a longer piece, its value in the
 * dict `memo` if it is there (an exact lookup: a subclass's __missing__ is not called).
 * The key, the slot hash and the probe order are piecetable.py's bit for bit
 * (little-endian words; the table is shared). Only reads `rows`; the GIL is released
 * during the table pass (the buffers are held). */
static PyObject *
probe_pieces(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer raw, rows, values, found, starts, ends;
    PyObject *rows_o, *memo, *values_o, *found_o, *starts_o, *ends_o;
    unsigned long long mask;
    unsigned int shift;
    if (!PyArg_ParseTuple(args, "y*OKIO!OOOO", &raw, &rows_o, &mask, &shift, &PyDict_Type,
                          &memo, &values_o, &found_o, &starts_o, &ends_o)) {
        return NULL;
    }
    const unsigned char *data = raw.buf;
    Py_ssize_t len = raw.len;
    Py_ssize_t n = 1;
    for (const unsigned char *p = data, *e = data + len;
         (p = memchr(p, ' ', (size_t)(e - p))) != NULL; p++) {
        n++;
    }
    if (shift < 1 || shift > 63 || mask != (UINT64_MAX >> shift)) {
        PyBuffer_Release(&raw);
        PyErr_SetString(PyExc_ValueError, "mask must be 2**(64 - shift) - 1");
        return NULL;
    }
    if (PyObject_GetBuffer(rows_o, &rows, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&raw);
        return NULL;
    }
    if ((unsigned long long)rows.len != (mask + 1) * ROW * sizeof(uint64_t)) {
        PyErr_SetString(PyExc_ValueError, "rows: (mask + 1) * 5 uint64 expected");
        goto fail_rows;
    }
    if (get_out(values_o, &values, 8, n, "values") < 0) {
        goto fail_rows;
    }
    if (get_out(found_o, &found, 1, n, "found") < 0) {
        goto fail_values;
    }
    if (get_out(starts_o, &starts, 8, n, "starts") < 0) {
        goto fail_found;
    }
    if (get_out(ends_o, &ends, 8, n, "ends") < 0) {
        goto fail_starts;
    }
    int64_t *vals = values.buf, *s = starts.buf, *e = ends.buf;
    uint8_t *hit = found.buf;
    Py_BEGIN_ALLOW_THREADS
    probe_all(data, len, rows.buf, (uint64_t)mask, shift, vals, hit, s, e, n);
    Py_END_ALLOW_THREADS
    /* the longer pieces (no key): the dict, without making a str of the short ones */
    int failed = 0;
    for (Py_ssize_t i = 0; i < n && !failed; i++) {
        if (e[i] - s[i] > MAX_KEY_BYTES) {
            int got = dict_value(memo, data + s[i], e[i] - s[i], &vals[i]);
            failed = got < 0;
            hit[i] = got > 0;
        }
    }
    PyBuffer_Release(&ends);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&found);
    PyBuffer_Release(&values);
    PyBuffer_Release(&rows);
    PyBuffer_Release(&raw);
    if (failed) {
        return NULL;
    }
    Py_RETURN_NONE;

fail_starts:
    PyBuffer_Release(&starts);
fail_found:
    PyBuffer_Release(&found);
fail_values:
    PyBuffer_Release(&values);
fail_rows:
    PyBuffer_Release(&rows);
    PyBuffer_Release(&raw);
    return NULL;
}

/* Validated heads: ascending piece indices from 0 (none when there are no pieces). */
static int
check_heads(const int64_t *heads, Py_ssize_t k, Py_ssize_t n)
{
    if ((n > 0 && (k == 0 || heads[0] != 0)) || (n == 0 && k != 0)) {
        PyErr_SetString(PyExc_ValueError, "heads must start with piece 0");
        return -1;
    }
    for (Py_ssize_t h = 1; h < k; h++) {
        if (heads[h] <= heads[h - 1] || heads[h] >= n) {
            PyErr_SetString(PyExc_ValueError, "heads must ascend within the pieces");
            return -1;
        }
    }
    return 0;
}

/* chunk_counts(raw, starts, ends, packed, heads, spaced, head, counts, glued) is
 * counting.py's piece_counts_in on byte spans: per piece its tokens (the packed count; 0
 * for a piece glued to its predecessor; a glued run's whole chunk charged to its first
 * piece, looked up in `spaced`, or in `head` when a text starts there) and the glued
 * pieces' indices. Returns (number glued, the chunks no dict held: [(piece, str,
 * starts a text)]) for the caller to count. */

/* counting.py's packed memo value: bits 0-19 the count, 42 empty or ends in whitespace */
#define COUNT_MASK ((INT64_C(1) << 20) - 1)
#define WS_BIT (INT64_C(1) << 42)

/* Count of piece i's chunk (pieces a..b, bytes starts[a]..ends[b]) from `memo`; a miss is
 * appended to `misses` as (a, str, is_head) and counted 0 here. 0 ok, -1 error. */
static int
chunk_value(PyObject *memo, const unsigned char *data, int64_t from, int64_t to, Py_ssize_t a,
            int is_head, int64_t *out, PyObject *misses)
{
    PyObject *key = PyUnicode_DecodeUTF8((const char *)data + from, (Py_ssize_t)(to - from),
                                         "surrogatepass");
    if (key == NULL) {
        return -1;
    }
    PyObject *v = PyDict_GetItemWithError(memo, key); /* borrowed */
    if (v == NULL) {
        if (PyErr_Occurred()) {
            Py_DECREF(key);
            return -1;
        }
        *out = 0;
        PyObject *row = Py_BuildValue("(nNO)", a, key, is_head ? Py_True : Py_False);
        if (row == NULL) { /* Py_BuildValue's N stole key only on success */
            return -1;
        }
        int err = PyList_Append(misses, row);
        Py_DECREF(row);
        return err;
    }
    Py_DECREF(key);
    long long x = PyLong_AsLongLong(v);
    if (x == -1 && PyErr_Occurred()) {
        return -1;
    }
    *out = (int64_t)x;
    return 0;
}

static PyObject *
chunk_counts(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer raw, starts_b, ends_b, packed_b, heads_b, counts_b, glued_b;
    PyObject *starts_o, *ends_o, *packed_o, *heads_o, *spaced, *head, *counts_o, *glued_o;
    if (!PyArg_ParseTuple(args, "y*OOOOO!O!OO", &raw, &starts_o, &ends_o, &packed_o, &heads_o,
                          &PyDict_Type, &spaced, &PyDict_Type, &head, &counts_o, &glued_o)) {
        return NULL;
    }
    PyObject *result = NULL, *misses = NULL;
    int held = 0; /* buffers acquired so far, released in reverse */
    Py_ssize_t n = -1, k = -1;
    if (get_in(packed_o, &packed_b, &n, "packed") < 0) {
        goto done;
    }
    held = 1;
    if (get_in(starts_o, &starts_b, &n, "starts") < 0) {
        goto done;
    }
    held = 2;
    if (get_in(ends_o, &ends_b, &n, "ends") < 0) {
        goto done;
    }
    held = 3;
    if (get_in(heads_o, &heads_b, &k, "heads") < 0) {
        goto done;
    }
    held = 4;
    if (get_out(counts_o, &counts_b, 8, n, "counts") < 0) {
        goto done;
    }
    held = 5;
    if (get_out(glued_o, &glued_b, 8, n, "glued") < 0) {
        goto done;
    }
    held = 6;
    const unsigned char *data = raw.buf;
    const int64_t *packed = packed_b.buf, *starts = starts_b.buf, *ends = ends_b.buf;
    const int64_t *heads = heads_b.buf;
    int64_t *counts = counts_b.buf, *glued = glued_b.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (starts[i] < 0 || starts[i] > ends[i] || ends[i] > raw.len) {
            PyErr_SetString(PyExc_ValueError, "a piece's span is outside the text");
            goto done;
        }
    }
    if (check_heads(heads, k, n) < 0) {
        goto done;
    }
    misses = PyList_New(0);
    if (misses == NULL) {
        goto done;
    }
    /* Piece j is glued to j - 1 when j - 1 is empty or ends in whitespace, unless j starts
     * a text, or j - 1 is an empty first piece of a text (a space at a text's start has no
     * left neighbour). A run of glued pieces is one chunk, charged to the piece before it. */
    Py_ssize_t m = 0, h = 0, run = -1;
    for (Py_ssize_t j = 0; j < n; j++) {
        int is_head = h < k && heads[h] == j;
        if (is_head) {
            h++;
        }
        int join = 0;
        if (j > 0 && !is_head && (packed[j - 1] & WS_BIT)) {
            /* j - 1 an empty head: not a cut to glue across */
            int prev_head = h > 0 && heads[h - 1] == j - 1;
            join = !(prev_head && starts[j - 1] == ends[j - 1]);
        }
        if (join) {
            glued[m++] = j;
            counts[j] = 0;
            if (run < 0) {
                run = j - 1;
            }
            continue;
        }
        if (run >= 0) { /* the run run..j-1 closes */
            Py_ssize_t before = h - 1 - is_head; /* the last head before j */
            int run_head = before >= 0 && heads[before] == run;
            if (chunk_value(run_head ? head : spaced, data, starts[run], ends[j - 1], run,
                            run_head, &counts[run], misses) < 0) {
                goto done;
            }
            run = -1;
        }
        if (is_head) {
            /* a head that opens a run is charged its run's chunk when the run closes (a
             * miss recorded here would overwrite that count) */
            int empty = ends[j] == starts[j];
            int opens_run = !empty && j + 1 < n && (packed[j] & WS_BIT) &&
                            !(h < k && heads[h] == j + 1);
            counts[j] = 0;
            if (!empty && !opens_run &&
                chunk_value(head, data, starts[j], ends[j], j, 1, &counts[j], misses) < 0) {
                goto done;
            }
        }
        else {
            counts[j] = packed[j] & COUNT_MASK;
        }
    }
    if (run >= 0) {
        int run_head = h > 0 && heads[h - 1] == run;
        if (chunk_value(run_head ? head : spaced, data, starts[run], ends[n - 1], run, run_head,
                        &counts[run], misses) < 0) {
            goto done;
        }
    }
    result = Py_BuildValue("(nO)", m, misses);

done:
    Py_XDECREF(misses);
    switch (held) {
    case 6:
        PyBuffer_Release(&glued_b);
        /* fall through */
    case 5:
        PyBuffer_Release(&counts_b);
        /* fall through */
    case 4:
        PyBuffer_Release(&heads_b);
        /* fall through */
    case 3:
        PyBuffer_Release(&ends_b);
        /* fall through */
    case 2:
        PyBuffer_Release(&starts_b);
        /* fall through */
    case 1:
        PyBuffer_Release(&packed_b);
        /* fall through */
    default:
        break;
    }
    PyBuffer_Release(&raw);
    return result;
}

/* compressor/document.py's per-piece fields of the packed memo values, in one pass:
 * piece_features(packed, heads, user_shift, flag_shift, nonempty, pos, flags, terms) writes
 * each piece's offset in the joined texts (sentences.piece_offsets: the space before it, or
 * its own start when it opens a text), its sentence flags (| nonempty when it has
 * characters) and its term id − 1 (−1: none). Length: bits 20-41; term id + 1: the
 * TERM_BITS above user_shift. */
#define LEN_SHIFT 20
#define LEN_MASK ((INT64_C(1) << 22) - 1)
#define TERM_MASK ((INT64_C(1) << 18) - 1)

static PyObject *
piece_features(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer packed_b, heads_b, pos_b, flags_b, terms_b;
    PyObject *packed_o, *heads_o, *pos_o, *flags_o, *terms_o;
    unsigned int user_shift, flag_shift;
    long long nonempty;
    if (!PyArg_ParseTuple(args, "OOIILOOO", &packed_o, &heads_o, &user_shift, &flag_shift,
                          &nonempty, &pos_o, &flags_o, &terms_o)) {
        return NULL;
    }
    if (user_shift > 45 || flag_shift > 63) {
        PyErr_SetString(PyExc_ValueError, "shifts out of range");
        return NULL;
    }
    PyObject *result = NULL;
    int held = 0;
    Py_ssize_t n = -1, k = -1;
    if (get_in(packed_o, &packed_b, &n, "packed") < 0) {
        goto done;
    }
    held = 1;
    if (get_in(heads_o, &heads_b, &k, "heads") < 0) {
        goto done;
    }
    held = 2;
    if (get_out(pos_o, &pos_b, 8, n, "pos") < 0) {
        goto done;
    }
    held = 3;
    if (get_out(flags_o, &flags_b, 8, n, "flags") < 0) {
        goto done;
    }
    held = 4;
    if (get_out(terms_o, &terms_b, 8, n, "terms") < 0) {
        goto done;
    }
    held = 5;
    const int64_t *packed = packed_b.buf, *heads = heads_b.buf;
    int64_t *pos = pos_b.buf, *flags = flags_b.buf, *terms = terms_b.buf;
    if (check_heads(heads, k, n) < 0) {
        goto done;
    }
    int64_t at = 0; /* the piece's first character */
    Py_ssize_t h = 0;
    for (Py_ssize_t j = 0; j < n; j++) {
        int64_t v = packed[j];
        int64_t len = (v >> LEN_SHIFT) & LEN_MASK;
        if (h < k && heads[h] == j) { /* a text starts here: no space before it */
            h++;
            pos[j] = at;
        }
        else {
            pos[j] = at - 1;
        }
        at += len + 1;
        if (h < k && heads[h] == j + 1) {
            at -= 1; /* no space between a text and the next one */
        }
        flags[j] = (v >> flag_shift) | (len > 0 ? nonempty : 0);
        terms[j] = ((v >> user_shift) & TERM_MASK) - 1;
    }
    result = Py_None;
    Py_INCREF(result);

done:
    switch (held) {
    case 5:
        PyBuffer_Release(&terms_b);
        /* fall through */
    case 4:
        PyBuffer_Release(&flags_b);
        /* fall through */
    case 3:
        PyBuffer_Release(&pos_b);
        /* fall through */
    case 2:
        PyBuffer_Release(&heads_b);
        /* fall through */
    case 1:
        PyBuffer_Release(&packed_b);
        /* fall through */
    default:
        break;
    }
    return result;
}

/* compressor/document.py's unit × term matrix in one pass: unit_terms(starts, pos, terms,
 * words, pu, pt, tf) puts each piece in its unit (the last unit start ≤ its offset, as
 * np.searchsorted(starts, pos, "right") − 1), counts the pieces of each unit into `words`,
 * and writes the (unit, local term, tf) triples of the pieces with a term (≥ 0), sorted by
 * unit then local term, where local terms are the ranks of the distinct term ids (_sparse's
 * np.unique). Returns (triples, distinct terms); None when the pieces' units do not ascend
 * (never for a document: the caller then takes the numpy path). */
static int
cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static PyObject *
unit_terms(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer starts_b, pos_b, terms_b, words_b, pu_b, pt_b, tf_b;
    PyObject *starts_o, *pos_o, *terms_o, *words_o, *pu_o, *pt_o, *tf_o;
    if (!PyArg_ParseTuple(args, "OOOOOOO", &starts_o, &pos_o, &terms_o, &words_o, &pu_o,
                          &pt_o, &tf_o)) {
        return NULL;
    }
    PyObject *result = NULL;
    uint64_t *bits = NULL;
    int64_t *rank = NULL, *row = NULL;
    int held = 0;
    Py_ssize_t m = -1, n = -1;
    if (get_in(starts_o, &starts_b, &m, "starts") < 0) {
        goto done;
    }
    held = 1;
    if (get_in(pos_o, &pos_b, &n, "pos") < 0) {
        goto done;
    }
    held = 2;
    if (get_in(terms_o, &terms_b, &n, "terms") < 0) {
        goto done;
    }
    held = 3;
    if (get_out(words_o, &words_b, 8, m, "words") < 0) {
        goto done;
    }
    held = 4;
    if (get_out(pu_o, &pu_b, 8, n, "pu") < 0) {
        goto done;
    }
    held = 5;
    if (get_out(pt_o, &pt_b, 8, n, "pt") < 0) {
        goto done;
    }
    held = 6;
    if (get_out(tf_o, &tf_b, 8, n, "tf") < 0) {
        goto done;
    }
    held = 7;
    const int64_t *starts = starts_b.buf, *pos = pos_b.buf, *terms = terms_b.buf;
    int64_t *words = words_b.buf, *pu = pu_b.buf, *pt = pt_b.buf, *tf = tf_b.buf;
    for (Py_ssize_t u = 1; u < m; u++) {
        if (starts[u] < starts[u - 1]) {
            PyErr_SetString(PyExc_ValueError, "unit starts must ascend");
            goto done;
        }
    }
    int64_t top = -1; /* the largest term id */
    for (Py_ssize_t j = 0; j < n; j++) {
        if (terms[j] > top) {
            top = terms[j];
        }
    }
    if (top > TERM_MASK) {
        PyErr_SetString(PyExc_ValueError, "term ids out of range");
        goto done;
    }
    Py_ssize_t nw = (Py_ssize_t)(top / 64 + 1);
    bits = PyMem_Calloc((size_t)nw, sizeof(uint64_t));
    rank = PyMem_Malloc((size_t)nw * sizeof(int64_t));
    row = PyMem_Malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
    if (bits == NULL || rank == NULL || row == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        if (terms[j] >= 0) {
            bits[terms[j] >> 6] |= UINT64_C(1) << (terms[j] & 63);
        }
    }
    int64_t v = 0; /* distinct terms; rank[w]: those in the words before w */
    for (Py_ssize_t w = 0; w < nw; w++) {
        rank[w] = v;
        v += __builtin_popcountll(bits[w]);
    }
    for (Py_ssize_t u = 0; u < m; u++) {
        words[u] = 0;
    }
    Py_ssize_t out = 0, u = m > 0 ? 0 : -1, open = 0; /* open: the current unit's first row */
    int64_t cur = -1;                                    /* the unit of the open rows */
    int ascending = 1;
    for (Py_ssize_t j = 0; j <= n; j++) {
        int64_t unit = -1;
        if (j < n) {
            int64_t p = pos[j];
            while (u + 1 < m && starts[u + 1] <= p) {
                u++;
            }
            while (u >= 0 && starts[u] > p) {
                u--;
            }
            if (u < 0) {
                PyErr_SetString(PyExc_ValueError, "a piece before the first unit");
                goto done;
            }
            unit = u;
            words[u]++;
            if (terms[j] < 0) {
                continue;
            }
        }
        if (j == n || unit != cur) { /* close the open unit: its terms sorted, counted */
            if (j < n && unit < cur) {
                ascending = 0;
                break;
            }
            Py_ssize_t len = open;
            if (len > 32) {
                qsort(row, (size_t)len, sizeof(int64_t), cmp_i64);
            }
            else { /* a sentence's few terms: insertion sort */
                for (Py_ssize_t i = 1; i < len; i++) {
                    int64_t x = row[i];
                    Py_ssize_t at = i;
                    for (; at > 0 && row[at - 1] > x; at--) {
                        row[at] = row[at - 1];
                    }
                    row[at] = x;
                }
            }
            for (Py_ssize_t i = 0; i < len; i++) {
                if (i > 0 && row[i] == row[i - 1]) {
                    tf[out - 1]++;
                }
                else {
                    pu[out] = cur;
                    pt[out] = row[i];
                    tf[out] = 1;
                    out++;
                }
            }
            open = 0;
            cur = unit;
            if (j == n) {
                break;
            }
        }
        int64_t t = terms[j];
        uint64_t below = bits[t >> 6] & ((UINT64_C(1) << (t & 63)) - 1);
        row[open++] = rank[t >> 6] + __builtin_popcountll(below);
    }
    if (!ascending) {
        result = Py_None;
        Py_INCREF(result);
    }
    else {
        result = Py_BuildValue("(nL)", out, (long long)v);
    }

done:
    PyMem_Free(bits);
    PyMem_Free(rank);
    PyMem_Free(row);
    switch (held) {
    case 7:
        PyBuffer_Release(&tf_b);
        /* fall through */
    case 6:
        PyBuffer_Release(&pt_b);
        /* fall through */
    case 5:
        PyBuffer_Release(&pu_b);
        /* fall through */
    case 4:
        PyBuffer_Release(&words_b);
        /* fall through */
    case 3:
        PyBuffer_Release(&terms_b);
        /* fall through */
    case 2:
        PyBuffer_Release(&pos_b);
        /* fall through */
    case 1:
        PyBuffer_Release(&starts_b);
        /* fall through */
    default:
        break;
    }
    return result;
}

/* compressor/linebreaks.py's fast path in one scan of the text's code points:
 * line_breaks(text, seams) -> (lead, end) as bytes of int64 offsets, the starts of
 * LEAD_BREAK's and END_BREAK's matches (each moved back over the blanks before its newline,
 * not past the last seam at or before it). A text holding whitespace other than " ", "\t",
 * "\n" or a control character gives None (the regexes then decide), or with any_space true
 * is scanned with str.isspace's whitespace (the regexes' \\s, sep_start's test): the same
 * offsets, without the regex engine's per-position attempts (~0.5 ms on 37 KB). The
 * character sets are linebreaks.py's tables. */
static int
in_set(Py_UCS4 c, const char *ascii, const Py_UCS4 *wide)
{
    if (c < 128) {
        return c != 0 && strchr(ascii, (int)c) != NULL;
    }
    for (; *wide; wide++) {
        if (*wide == c) {
            return 1;
        }
    }
    return 0;
}

static const Py_UCS4 END_WIDE[] = {0x2026, 0x3002, 0xFF01, 0xFF1F, 0x201D, 0x2019, 0};
static const Py_UCS4 BULLET_WIDE[] = {0x2022, 0x2023, 0x25E6, 0x25AA, 0x2013, 0};
static const Py_UCS4 NONE_WIDE[] = {0};
#define END_MARK(c) in_set((c), ".!?:;\"')]", END_WIDE)
#define BULLET(c) in_set((c), "-*+", BULLET_WIDE)
#define OPENS(c) in_set((c), ">|", NONE_WIDE)
#define DOT_PAREN(c) ((c) == '.' || (c) == ')')
#define BLANK(c) ((c) == ' ' || (c) == '\t')
#define LETTER(c) (((c) >= 'a' && (c) <= 'z') || ((c) >= 'A' && (c) <= 'Z'))

/* LEAD_BREAK's lookahead at `at` (past a newline's indentation): a list item, heading,
 * quote or table row opens there. */
static int
opens_item(int kind, const void *data, Py_ssize_t n, Py_ssize_t at)
{
    Py_UCS4 w[8];
    for (int j = 0; j < 8; j++) {
        w[j] = at + j < n ? PyUnicode_READ(kind, data, at + j) : 0;
    }
    if ((BULLET(w[0]) && BLANK(w[1])) || OPENS(w[0])) {
        return 1;
    }
    if (LETTER(w[0]) && DOT_PAREN(w[1]) && BLANK(w[2])) {
        return 1;
    }
    int hashes = 0;
    while (hashes < 7 && w[hashes] == '#') {
        hashes++;
    }
    if (hashes >= 1 && hashes <= 6 && BLANK(w[hashes])) {
        return 1;
    }
    int digits = 0;
    while (digits < 4 && w[digits] != 0 && Py_UNICODE_ISDECIMAL(w[digits])) {
        digits++;
    }
    return digits >= 1 && digits <= 3 && DOT_PAREN(w[digits]) && BLANK(w[digits + 1]);
}

typedef struct {
    int64_t *at;
    Py_ssize_t len, cap;
} Offsets;

static int
push(Offsets *o, int64_t x)
{
    if (o->len == o->cap) {
        Py_ssize_t cap = o->cap ? 2 * o->cap : 64;
        int64_t *at = PyMem_Realloc(o->at, (size_t)cap * sizeof(int64_t));
        if (at == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        o->at = at;
        o->cap = cap;
    }
    o->at[o->len++] = x;
    return 0;
}

/* Whitespace other than " ", "\t", "\n", or a control character: str.isspace's set above
 * U+0020 (tests/unit/compressor/test_fast.py checks the list against str.isspace). */
static inline int
odd_char(Py_UCS4 c)
{
    if (c <= 32) {
        return c != ' ' && c != '\t' && c != '\n';
    }
    if (c < 0x85) {
        return 0;
    }
    return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

static unsigned char ODD_LATIN1[256]; /* odd_char per byte of a 1-byte string (module init) */

#define WS(c) ((c) == ' ' || (c) == '\t' || (c) == '\n')
/* A whitespace run's character: " \t\n", or with odd whitespace in the text str.isspace's
 * set (the regexes' \\s and sep_start's test) */
#define SPACE(c) (any_space ? Py_UNICODE_ISSPACE(c) : WS(c))

/* The first newline at or after `from`, or -1. */
static inline __attribute__((always_inline)) Py_ssize_t
find_nl(int kind, const void *data, Py_ssize_t from, Py_ssize_t n)
{
    if (kind == PyUnicode_1BYTE_KIND) {
        const Py_UCS1 *p = (const Py_UCS1 *)data;
        const void *at = memchr(p + from, '\n', (size_t)(n - from));
        return at ? (Py_ssize_t)((const Py_UCS1 *)at - p) : -1;
    }
    for (Py_ssize_t i = from; i < n; i++) {
        if (PyUnicode_READ(kind, data, i) == '\n') {
            return i;
        }
    }
    return -1;
}

/* The scan itself, for one string kind (inlined per kind: the reads are then plain loads).
 * 1: odd whitespace (nothing written), 0: done, -1: error. */
static inline __attribute__((always_inline)) int
scan_breaks(int kind, const void *data, Py_ssize_t n, const int64_t *seam, Py_ssize_t ns,
            Offsets *lead, Offsets *end, int any_space)
{
    if (kind == PyUnicode_1BYTE_KIND) {
        const Py_UCS1 *p = (const Py_UCS1 *)data;
        unsigned char odd = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            odd |= ODD_LATIN1[p[i]];
        }
        if (odd && !any_space) {
            return 1;
        }
        any_space = odd;
    }
    else {
        int odd = 0;
        for (Py_ssize_t i = 0; i < n && !odd; i++) {
            odd = odd_char(PyUnicode_READ(kind, data, i));
        }
        if (odd && !any_space) {
            return 1;
        }
        any_space = odd;
    }
    /* newline to newline, one whitespace run at a time: [run, stop) holds the newline i,
     * the first of its run; the run's first newline opens a paragraph when the run holds
     * another one (a blank line) or an item starts right after it */
    Py_ssize_t pos = 0, k = 0;
    while (pos < n) {
        Py_ssize_t i = find_nl(kind, data, pos, n);
        if (i < 0) {
            break;
        }
        Py_ssize_t run = i, stop = i + 1;
        while (run > 0 && SPACE(PyUnicode_READ(kind, data, run - 1))) {
            run--;
        }
        while (stop < n && SPACE(PyUnicode_READ(kind, data, stop))) {
            stop++;
        }
        /* LEAD_BREAK's lookahead skips only blanks ("\n\xa0- x" opens no item); with
         * " \t\n" alone and no other newline in the run this is `stop` */
        Py_ssize_t item = i + 1;
        while (item < n && BLANK(PyUnicode_READ(kind, data, item))) {
            item++;
        }
        int several = 0;
        int64_t first_at = 0;
        for (Py_ssize_t j = i; j < stop; j++) {
            if (PyUnicode_READ(kind, data, j) != '\n') {
                continue;
            }
            Py_UCS4 p1 = j >= 1 ? PyUnicode_READ(kind, data, j - 1) : 0;
            Py_UCS4 p2 = j >= 2 ? PyUnicode_READ(kind, data, j - 2) : 0;
            int64_t at = j;
            if (j >= 1 && BLANK(p1)) { /* a break after blanks starts at them */
                at = run;
                while (k < ns && seam[k] <= j) {
                    k++;
                }
                if (k > 0 && seam[k - 1] > at) { /* not before its own text's seam */
                    at = seam[k - 1];
                }
            }
            if ((j >= 1 && END_MARK(p1)) || (j >= 2 && BLANK(p1) && END_MARK(p2))) {
                if (push(end, at) < 0) {
                    return -1;
                }
            }
            if (j == i) {
                first_at = at;
            }
            else {
                several = 1;
            }
        }
        if (several || (item < n && opens_item(kind, data, n, item))) {
            if (push(lead, first_at) < 0) {
                return -1;
            }
        }
        pos = stop;
    }
    return 0;
}

static PyObject *
line_breaks(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *text, *seams_o;
    int any_space = 0;
    if (!PyArg_ParseTuple(args, "UO|p", &text, &seams_o, &any_space)) {
        return NULL;
    }
    PyObject *seams = PySequence_Fast(seams_o, "seams must be a sequence of ints");
    if (seams == NULL) {
        return NULL;
    }
    Py_ssize_t ns = PySequence_Fast_GET_SIZE(seams);
    int64_t *seam = PyMem_Malloc((size_t)(ns > 0 ? ns : 1) * sizeof(int64_t));
    Offsets lead = {NULL, 0, 0}, end = {NULL, 0, 0};
    PyObject *result = NULL;
    if (seam == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < ns; i++) {
        seam[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seams, i));
        if (seam[i] == -1 && PyErr_Occurred()) {
            goto done;
        }
        if (i > 0 && seam[i] < seam[i - 1]) {
            PyErr_SetString(PyExc_ValueError, "seams must be sorted");
            goto done;
        }
    }
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    int got;
    if (kind == PyUnicode_1BYTE_KIND) {
        got = scan_breaks(PyUnicode_1BYTE_KIND, data, n, seam, ns, &lead, &end, any_space);
    }
    else if (kind == PyUnicode_2BYTE_KIND) {
        got = scan_breaks(PyUnicode_2BYTE_KIND, data, n, seam, ns, &lead, &end, any_space);
    }
    else {
        got = scan_breaks(PyUnicode_4BYTE_KIND, data, n, seam, ns, &lead, &end, any_space);
    }
    if (got < 0) {
        goto done;
    }
    if (got > 0) { /* odd whitespace: the regexes decide */
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    /* y# makes None of a NULL buffer: an empty list is "" */
    result = Py_BuildValue("(y#y#)", lead.at ? (const char *)lead.at : "",
                           lead.len * (Py_ssize_t)sizeof(int64_t),
                           end.at ? (const char *)end.at : "",
                           end.len * (Py_ssize_t)sizeof(int64_t));

done:
    PyMem_Free(lead.at);
    PyMem_Free(end.at);
    PyMem_Free(seam);
    Py_DECREF(seams);
    return result;
}

/* insert_pieces(raw, starts, ends, at, values, rows, mask, shift) -> placed:
 * PieceTable.insert of the keys of pieces at[i] (distinct, each ≤ MAX_KEY_BYTES bytes) with
 * values[i], slot for slot as the numpy rounds place them: each round, in order, a key
 * whose slot is still free takes it (the first that wants a free slot gets it), the others
 * move on one slot; after PROBES rounds the rest are left out (the dict answers them). */
static PyObject *
insert_pieces(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer raw, starts_b, ends_b, at_b, values_b, rows_b;
    PyObject *starts_o, *ends_o, *at_o, *values_o, *rows_o;
    unsigned long long mask;
    unsigned int shift;
    if (!PyArg_ParseTuple(args, "y*OOOOOKI", &raw, &starts_o, &ends_o, &at_o, &values_o,
                          &rows_o, &mask, &shift)) {
        return NULL;
    }
    PyObject *result = NULL;
    uint64_t(*keys)[WORDS] = NULL;
    uint64_t *slot = NULL;
    Py_ssize_t *todo = NULL;
    int held = 0;
    Py_ssize_t n = -1, m = -1;
    if (shift < 1 || shift > 63 || mask != (UINT64_MAX >> shift)) {
        PyErr_SetString(PyExc_ValueError, "mask must be 2**(64 - shift) - 1");
        goto done;
    }
    if (get_in(starts_o, &starts_b, &n, "starts") < 0) {
        goto done;
    }
    held = 1;
    if (get_in(ends_o, &ends_b, &n, "ends") < 0) {
        goto done;
    }
    held = 2;
    if (get_in(at_o, &at_b, &m, "at") < 0) {
        goto done;
    }
    held = 3;
    if (get_in(values_o, &values_b, &m, "values") < 0) {
        goto done;
    }
    held = 4;
    if (PyObject_GetBuffer(rows_o, &rows_b, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        goto done;
    }
    held = 5;
    if ((unsigned long long)rows_b.len != (mask + 1) * ROW * sizeof(uint64_t)) {
        PyErr_SetString(PyExc_ValueError, "rows: (mask + 1) * 5 uint64 expected");
        goto done;
    }
    const int64_t *starts = starts_b.buf, *ends = ends_b.buf, *at = at_b.buf;
    const int64_t *values = values_b.buf;
    uint64_t *rows = rows_b.buf;
    keys = PyMem_Malloc((size_t)(m > 0 ? m : 1) * sizeof(*keys));
    slot = PyMem_Malloc((size_t)(m > 0 ? m : 1) * sizeof(uint64_t));
    todo = PyMem_Malloc((size_t)(m > 0 ? m : 1) * sizeof(Py_ssize_t));
    if (keys == NULL || slot == NULL || todo == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < m; i++) {
        int64_t j = at[i];
        if (j < 0 || j >= n || starts[j] < 0 || starts[j] > ends[j] || ends[j] > raw.len ||
            ends[j] - starts[j] > MAX_KEY_BYTES) {
            PyErr_SetString(PyExc_ValueError, "not a keyed piece of the text");
            goto done;
        }
        slot[i] = key_of(raw.buf, raw.len, starts[j], ends[j] - starts[j], shift, keys[i]);
        todo[i] = i;
    }
    Py_ssize_t left = m, placed = 0;
    for (int r = 0; r < PROBES && left > 0; r++) {
        Py_ssize_t next = 0;
        for (Py_ssize_t t = 0; t < left; t++) {
            Py_ssize_t i = todo[t];
            uint64_t *row = rows + slot[i] * ROW;
            if (row[WORDS - 1] == 0) {
                memcpy(row, keys[i], sizeof(keys[i]));
                row[WORDS] = (uint64_t)values[i];
                placed++;
            }
            else {
                slot[i] = (slot[i] + 1) & mask;
                todo[next++] = i;
            }
        }
        left = next;
    }
    result = PyLong_FromSsize_t(placed);

done:
    PyMem_Free(keys);
    PyMem_Free(slot);
    PyMem_Free(todo);
    switch (held) {
    case 5:
        PyBuffer_Release(&rows_b);
        /* fall through */
    case 4:
        PyBuffer_Release(&values_b);
        /* fall through */
    case 3:
        PyBuffer_Release(&at_b);
        /* fall through */
    case 2:
        PyBuffer_Release(&ends_b);
        /* fall through */
    case 1:
        PyBuffer_Release(&starts_b);
        /* fall through */
    default:
        break;
    }
    PyBuffer_Release(&raw);
    return result;
}

/* compressor/scoring.py's TextRank iterations: textrank(pu, pt, x, self_sim, inv_degree,
 * rank, teleport, damping, iterations, n_terms) updates `rank` in place,
 *     v = rank · inv_degree;  col = Σ_pt x · v[pu];  s = Σ_pu x · col[pt] − self_sim · v;
 *     rank = teleport + damping · s
 * with numpy's operations in numpy's order (np.bincount adds its weights one by one in
 * index order; every other step is elementwise), so the floats are bit for bit the same.
 * setup.py compiles this file with -ffp-contract=off: no fused multiply-adds. */
static PyObject *
textrank(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer pu_b, pt_b, x_b, ss_b, inv_b, rank_b;
    PyObject *pu_o, *pt_o, *x_o, *ss_o, *inv_o, *rank_o;
    double teleport, damping;
    int iterations;
    Py_ssize_t v_terms;
    if (!PyArg_ParseTuple(args, "OOOOOOddin", &pu_o, &pt_o, &x_o, &ss_o, &inv_o, &rank_o,
                          &teleport, &damping, &iterations, &v_terms)) {
        return NULL;
    }
    PyObject *result = NULL;
    double *v = NULL, *col = NULL, *out = NULL;
    int held = 0;
    Py_ssize_t nnz = -1, n = -1;
    if (get_in(pu_o, &pu_b, &nnz, "pu") < 0) {
        goto done;
    }
    held = 1;
    if (get_in(pt_o, &pt_b, &nnz, "pt") < 0) {
        goto done;
    }
    held = 2;
    if (get_in(x_o, &x_b, &nnz, "x") < 0) {
        goto done;
    }
    held = 3;
    if (get_in(ss_o, &ss_b, &n, "self_sim") < 0) {
        goto done;
    }
    held = 4;
    if (get_in(inv_o, &inv_b, &n, "inv_degree") < 0) {
        goto done;
    }
    held = 5;
    if (get_out(rank_o, &rank_b, 8, n, "rank") < 0) {
        goto done;
    }
    held = 6;
    const int64_t *pu = pu_b.buf, *pt = pt_b.buf;
    const double *x = x_b.buf, *self_sim = ss_b.buf, *inv = inv_b.buf;
    double *rank = rank_b.buf;
    if (v_terms < 0) {
        PyErr_SetString(PyExc_ValueError, "n_terms must be ≥ 0");
        goto done;
    }
    for (Py_ssize_t i = 0; i < nnz; i++) {
        if (pu[i] < 0 || pu[i] >= n || pt[i] < 0 || pt[i] >= v_terms) {
            PyErr_SetString(PyExc_ValueError, "a matrix entry outside the units or terms");
            goto done;
        }
    }
    v = PyMem_Malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    out = PyMem_Malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    col = PyMem_Malloc((size_t)(v_terms > 0 ? v_terms : 1) * sizeof(double));
    if (v == NULL || out == NULL || col == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (int it = 0; it < iterations; it++) {
        for (Py_ssize_t u = 0; u < n; u++) {
            v[u] = rank[u] * inv[u];
            out[u] = 0.0;
        }
        for (Py_ssize_t t = 0; t < v_terms; t++) {
            col[t] = 0.0;
        }
        for (Py_ssize_t i = 0; i < nnz; i++) {
            double w = x[i] * v[pu[i]];
            col[pt[i]] += w;
        }
        for (Py_ssize_t i = 0; i < nnz; i++) {
            double w = x[i] * col[pt[i]];
            out[pu[i]] += w;
        }
        for (Py_ssize_t u = 0; u < n; u++) {
            double own = self_sim[u] * v[u];
            double s = out[u] - own;
            double scaled = damping * s;
            rank[u] = teleport + scaled;
        }
    }
    result = Py_None;
    Py_INCREF(result);

done:
    PyMem_Free(v);
    PyMem_Free(out);
    PyMem_Free(col);
    switch (held) {
    case 6:
        PyBuffer_Release(&rank_b);
        /* fall through */
    case 5:
        PyBuffer_Release(&inv_b);
        /* fall through */
    case 4:
        PyBuffer_Release(&ss_b);
        /* fall through */
    case 3:
        PyBuffer_Release(&x_b);
        /* fall through */
    case 2:
        PyBuffer_Release(&pt_b);
        /* fall through */
    case 1:
        PyBuffer_Release(&pu_b);
        /* fall through */
    default:
        break;
    }
    return result;
}

/* compressor/content.py's code_score counts in one scan: code_counts(s) -> (code, doctest,
 * prose, lines) where code = newlines after one of ":;{}),", plus str.count's " = ", "()",
 * "return ", "def "; doctest = ">>> "; prose = ". " + ", "; lines = "\n". str.count counts
 * non-overlapping occurrences from the left: of these only " = " can overlap itself. */
static inline __attribute__((always_inline)) void
scan_code(int kind, const void *d, Py_ssize_t n, Py_ssize_t *out)
{
#define AT(j) ((j) < n ? PyUnicode_READ(kind, d, (j)) : 0)
    Py_ssize_t code = 0, doctest = 0, prose = 0, lines = 0, eq_free = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, d, i);
        switch (c) {
        case '\n':
            lines++;
            if (i > 0) {
                Py_UCS4 p = PyUnicode_READ(kind, d, i - 1);
                code += p == ':' || p == ';' || p == '{' || p == '}' || p == ')' || p == ',';
            }
            break;
        case ' ':
            if (i >= eq_free && AT(i + 1) == '=' && AT(i + 2) == ' ') {
                code++;
                eq_free = i + 3;
            }
            break;
        case '(':
            code += AT(i + 1) == ')';
            break;
        case 'r':
            code += AT(i + 1) == 'e' && AT(i + 2) == 't' && AT(i + 3) == 'u' &&
                    AT(i + 4) == 'r' && AT(i + 5) == 'n' && AT(i + 6) == ' ';
            break;
        case 'd':
            code += AT(i + 1) == 'e' && AT(i + 2) == 'f' && AT(i + 3) == ' ';
            break;
        case '.':
        case ',':
            prose += AT(i + 1) == ' ';
            break;
        case '>':
            doctest += AT(i + 1) == '>' && AT(i + 2) == '>' && AT(i + 3) == ' ';
            break;
        default:
            break;
        }
    }
#undef AT
    out[0] = code;
    out[1] = doctest;
    out[2] = prose;
    out[3] = lines;
}

static PyObject *
code_counts(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *text;
    if (!PyArg_ParseTuple(args, "U", &text)) {
        return NULL;
    }
    Py_ssize_t out[4];
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    if (kind == PyUnicode_1BYTE_KIND) {
        scan_code(PyUnicode_1BYTE_KIND, data, n, out);
    }
    else if (kind == PyUnicode_2BYTE_KIND) {
        scan_code(PyUnicode_2BYTE_KIND, data, n, out);
    }
    else {
        scan_code(PyUnicode_4BYTE_KIND, data, n, out);
    }
    return Py_BuildValue("(nnnn)", out[0], out[1], out[2], out[3]);
}

/* compressor/exact.py's kept_tokens walk: kept_segments(text, a, b, hard, cs, counts) ->
 * (total, new) for the kept spans [a, b) (ascending, cut at the seams; hard[i]: span i
 * starts a text), the chunk starts cs (ascending) and their tokens: the tokens of the
 * chunks the spans keep whole, and the new strings (segments around junctions that are
 * not safe cuts) for the caller to count. Step for step exact.py's loop. */
static Py_ssize_t
bisect(const int64_t *x, Py_ssize_t n, int64_t v, int right)
{
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (right ? x[mid] <= v : x[mid] < v) {
            lo = mid + 1;
        }
        else {
            hi = mid;
        }
    }
    return lo;
}

/* Close the open segment: its known count, or its text appended to `out` (0 tokens here). */
static int
close_segment(PyObject **parts, int64_t known, int64_t *total, PyObject *out)
{
    if (*parts == NULL) {
        return 0;
    }
    int err = 0;
    if (known >= 0) {
        *total += known;
    }
    else {
        PyObject *empty = PyUnicode_New(0, 0);
        PyObject *joined = empty ? PyUnicode_Join(empty, *parts) : NULL;
        Py_XDECREF(empty);
        err = joined == NULL || PyList_Append(out, joined) < 0;
        Py_XDECREF(joined);
    }
    Py_CLEAR(*parts);
    return err ? -1 : 0;
}

/* Start a new open segment with text[s:e] (or append it to the open one). */
static int
add_part(PyObject **parts, PyObject *text, Py_ssize_t s, Py_ssize_t e)
{
    PyObject *piece = PyUnicode_Substring(text, s, e);
    if (piece == NULL) {
        return -1;
    }
    if (*parts == NULL && (*parts = PyList_New(0)) == NULL) {
        Py_DECREF(piece);
        return -1;
    }
    int err = PyList_Append(*parts, piece);
    Py_DECREF(piece);
    return err;
}

static PyObject *
kept_segments(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer a_b, b_b, hard_b, cs_b, n_b;
    PyObject *text, *a_o, *b_o, *hard_o, *cs_o, *n_o;
    if (!PyArg_ParseTuple(args, "UOOOOO", &text, &a_o, &b_o, &hard_o, &cs_o, &n_o)) {
        return NULL;
    }
    PyObject *result = NULL, *out = NULL, *parts = NULL;
    int64_t *cum = NULL;
    int held = 0;
    Py_ssize_t k = -1, m = -1;
    if (get_in(a_o, &a_b, &k, "a") < 0) {
        goto done;
    }
    held = 1;
    if (get_in(b_o, &b_b, &k, "b") < 0) {
        goto done;
    }
    held = 2;
    if (get_in(hard_o, &hard_b, &k, "hard") < 0) {
        goto done;
    }
    held = 3;
    if (get_in(cs_o, &cs_b, &m, "cs") < 0) {
        goto done;
    }
    held = 4;
    if (get_in(n_o, &n_b, &m, "counts") < 0) {
        goto done;
    }
    held = 5;
    const int64_t *sa = a_b.buf, *sb = b_b.buf, *hard = hard_b.buf, *cs = cs_b.buf;
    const int64_t *cn = n_b.buf;
    Py_ssize_t len = PyUnicode_GET_LENGTH(text);
    if (m == 0) {
        PyErr_SetString(PyExc_ValueError, "no chunks");
        goto done;
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        if (sa[i] < 0 || sa[i] > sb[i] || sb[i] > len) { /* empty: at an empty text */
            PyErr_SetString(PyExc_ValueError, "a span outside the text");
            goto done;
        }
    }
    for (Py_ssize_t j = 1; j < m; j++) {
        if (cs[j] < cs[j - 1]) {
            PyErr_SetString(PyExc_ValueError, "chunk starts must ascend");
            goto done;
        }
    }
    cum = PyMem_Malloc((size_t)(m + 1) * sizeof(int64_t));
    out = PyList_New(0);
    if (cum == NULL || out == NULL) {
        if (cum == NULL) {
            PyErr_NoMemory();
        }
        goto done;
    }
    cum[0] = 0;
    for (Py_ssize_t j = 0; j < m; j++) {
        cum[j + 1] = cum[j] + cn[j];
    }
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    Py_ssize_t top = m - 1;
    int64_t total = 0, known = -1, prev_end = -1;
    for (Py_ssize_t i = 0; i < k; i++) {
        int64_t s = sa[i], e = sb[i];
        Py_ssize_t lo = bisect(cs, m, s, 1); /* chunks lo..hi-1 start strictly inside */
        Py_ssize_t hi = bisect(cs, m, e, 0);
        total += cum[hi - 1 > lo ? hi - 1 : lo] - cum[lo];
        int inner = hi > lo;
        int64_t first = cs[lo < top ? lo : top];
        Py_ssize_t last_k = hi - 1 < 0 ? 0 : (hi - 1 > top ? top : hi - 1);
        int64_t last_end = last_k < top ? cs[last_k + 1] : len;
        int64_t tail_n = inner && last_end == e ? cn[last_k] : -1;
        Py_ssize_t ka = bisect(cs, m, s, 0);
        ka = ka < top ? ka : top;
        int64_t ka_end = ka < top ? cs[ka + 1] : len;
        int64_t head_end = inner ? first : e;
        int64_t head_n = cs[ka] == s && ka_end == head_end ? cn[ka] : -1;
        if (prev_end >= 0) {
            int junction = hard[i] != 0;
            if (!junction && s >= len) {
                PyErr_SetString(PyExc_IndexError, "an empty span inside a text");
                goto done;
            }
            if (!junction && PyUnicode_READ(kind, data, s) == ' ') {
                Py_ssize_t before = prev_end >= 1 ? prev_end - 1 : len - 1; /* text[-1] */
                junction = !Py_UNICODE_ISSPACE(PyUnicode_READ(kind, data, before));
            }
            if (junction) { /* a new text, or a safe junction: the open segment ends */
                if (close_segment(&parts, known, &total, out) < 0) {
                    goto done;
                }
                known = -1;
            }
        }
        if (parts == NULL && head_n >= 0) {
            known = head_n;
        }
        else {
            known = -1;
        }
        if (add_part(&parts, text, (Py_ssize_t)s, (Py_ssize_t)head_end) < 0) {
            goto done;
        }
        if (inner) {
            if (close_segment(&parts, known, &total, out) < 0) {
                goto done;
            }
            known = tail_n;
            if (add_part(&parts, text, (Py_ssize_t)cs[last_k], (Py_ssize_t)e) < 0) {
                goto done;
            }
        }
        prev_end = e;
    }
    if (close_segment(&parts, known, &total, out) < 0) {
        goto done;
    }
    result = Py_BuildValue("(LO)", (long long)total, out);

done:
    Py_XDECREF(parts);
    Py_XDECREF(out);
    PyMem_Free(cum);
    switch (held) {
    case 5:
        PyBuffer_Release(&n_b);
        /* fall through */
    case 4:
        PyBuffer_Release(&cs_b);
        /* fall through */
    case 3:
        PyBuffer_Release(&hard_b);
        /* fall through */
    case 2:
        PyBuffer_Release(&b_b);
        /* fall through */
    case 1:
        PyBuffer_Release(&a_b);
        /* fall through */
    default:
        break;
    }
    return result;
}

/* has_fence_marker(text) -> bool: `"```" in text or "~~~" in text` (compressor/fences.py's
 * test before looking for fenced blocks). One memchr hop per backtick or tilde instead of
 * two substring searches of the whole text: most prompts hold inline code, few a fence. */
static int
run3_1byte(const Py_UCS1 *p, Py_ssize_t n, Py_UCS1 ch)
{
    const Py_UCS1 *end = p + n, *at = p;
    while (end - at >= 3) {
        at = memchr(at, ch, (size_t)(end - at - 2));
        if (at == NULL) {
            return 0;
        }
        if (at[1] == ch && at[2] == ch) {
            return 1;
        }
        at++;
    }
    return 0;
}

static PyObject *
has_fence_marker(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *text;
    if (!PyArg_ParseTuple(args, "U", &text)) {
        return NULL;
    }
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    int found = 0;
    if (kind == PyUnicode_1BYTE_KIND) {
        found = run3_1byte(data, n, '`') || run3_1byte(data, n, '~');
    }
    else {
        Py_ssize_t run_b = 0, run_t = 0;
        for (Py_ssize_t i = 0; i < n && !found; i++) {
            Py_UCS4 c = PyUnicode_READ(kind, data, i);
            run_b = c == '`' ? run_b + 1 : 0;
            run_t = c == '~' ? run_t + 1 : 0;
            found = run_b >= 3 || run_t >= 3;
        }
    }
    return PyBool_FromLong(found);
}

/* count_spaces(s) -> int: s.count(" ") of a str, or of bytes / a buffer (b" "). A plain
 * loop the compiler vectorises: str.count and bytes.count look for a one-character needle
 * a character at a time (~55 µs on 37 KB; the look-up sizes its arrays with it). */
static Py_ssize_t
spaces_1byte(const unsigned char *p, Py_ssize_t n)
{
    const uint64_t low7 = 0x7F7F7F7F7F7F7F7FULL, spaces = 0x2020202020202020ULL;
    Py_ssize_t count = 0, i = 0;
    while (i + 8 <= n) { /* eight bytes at a time: the zero bytes of w ^ "        " */
        uint64_t lanes = 0; /* per byte lane, how many spaces (≤ 255 words per round) */
        for (int k = 0; k < 255 && i + 8 <= n; k++, i += 8) {
            uint64_t w;
            memcpy(&w, p + i, 8);
            uint64_t x = w ^ spaces;
            uint64_t nonzero = ((x & low7) + low7) | x; /* high bit set: the byte is not 0 */
            lanes += (~nonzero & ~low7) >> 7;
        }
        for (int b = 0; b < 8; b++) {
            count += (Py_ssize_t)((lanes >> (8 * b)) & 0xFF);
        }
    }
    for (; i < n; i++) {
        count += p[i] == ' ';
    }
    return count;
}

static PyObject *
count_spaces(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *obj;
    if (!PyArg_ParseTuple(args, "O", &obj)) {
        return NULL;
    }
    Py_ssize_t count = 0;
    if (PyUnicode_Check(obj)) {
        int kind = PyUnicode_KIND(obj);
        const void *data = PyUnicode_DATA(obj);
        Py_ssize_t n = PyUnicode_GET_LENGTH(obj);
        if (kind == PyUnicode_1BYTE_KIND) {
            count = spaces_1byte(data, n);
        }
        else if (kind == PyUnicode_2BYTE_KIND) {
            const Py_UCS2 *p = data;
            for (Py_ssize_t i = 0; i < n; i++) {
                count += p[i] == ' ';
            }
        }
        else {
            const Py_UCS4 *p = data;
            for (Py_ssize_t i = 0; i < n; i++) {
                count += p[i] == ' ';
            }
        }
        return PyLong_FromSsize_t(count);
    }
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    count = spaces_1byte(view.buf, view.len);
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(count);
}

static PyMethodDef methods[] = {
    {"probe_pieces", probe_pieces, METH_VARARGS,
     "probe_pieces(raw, rows, mask, shift, memo, values, found, starts, ends): split raw on "
     "b' ', key and look up every piece in a PieceTable's rows, the longer ones in memo "
     "(compressor/piecetable.py)."},
    {"chunk_counts", chunk_counts, METH_VARARGS,
     "chunk_counts(raw, starts, ends, packed, heads, spaced, head, counts, glued) -> (glued "
     "pieces, misses): tokens per piece (compressor/counting.py's piece_counts_in)."},
    {"piece_features", piece_features, METH_VARARGS,
     "piece_features(packed, heads, user_shift, flag_shift, nonempty, pos, flags, terms): "
     "offsets, sentence flags and term ids per piece (compressor/document.py)."},
    {"unit_terms", unit_terms, METH_VARARGS,
     "unit_terms(starts, pos, terms, words, pu, pt, tf) -> (triples, distinct terms) or "
     "None: words per unit and the unit x term matrix (compressor/document.py)."},
    {"line_breaks", line_breaks, METH_VARARGS,
     "line_breaks(text, seams, any_space=False) -> (lead, end) int64 bytes, or None for "
     "the regexes when the text holds odd whitespace and any_space is false "
     "(compressor/linebreaks.py)."},
    {"insert_pieces", insert_pieces, METH_VARARGS,
     "insert_pieces(raw, starts, ends, at, values, rows, mask, shift) -> placed: "
     "PieceTable.insert of the pieces' keys (compressor/piecetable.py)."},
    {"textrank", textrank, METH_VARARGS,
     "textrank(pu, pt, x, self_sim, inv_degree, rank, teleport, damping, iterations, "
     "n_terms): TextRank's iterations in place (compressor/scoring.py)."},
    {"code_counts", code_counts, METH_VARARGS,
     "code_counts(s) -> (code, doctest, prose, lines): code_score's counts "
     "(compressor/content.py)."},
    {"kept_segments", kept_segments, METH_VARARGS,
     "kept_segments(text, a, b, hard, cs, counts) -> (tokens, new strings): "
     "compressor/exact.py's walk over the kept spans."},
    {"has_fence_marker", has_fence_marker, METH_VARARGS,
     "has_fence_marker(text) -> bool: '```' in text or '~~~' in text "
     "(compressor/fences.py)."},
    {"count_spaces", count_spaces, METH_VARARGS,
     "count_spaces(s) -> int: s.count(' ') of a str, or of bytes (b' ')."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "compressor._fast",
    "The compressor's per-piece passes in C (optional; numpy fallback).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__fast(void)
{
    for (int b = 0; b < 256; b++) {
        ODD_LATIN1[b] = (unsigned char)odd_char((Py_UCS4)b);
    }
    return PyModule_Create(&module);
}
