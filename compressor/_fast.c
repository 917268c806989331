/* compressor._fast: compressor/piecetable.py's split + key + probe in one pass over the
 * UTF-8 bytes (the optional compiled path; piecetable.py keeps the numpy one as the
 * fallback and as the reference the tests compare this with).
 *
 * probe_pieces(raw, rows, mask, shift, values, found, starts, ends) fills, for each piece of
 * raw.split(b" ") (n = raw.count(b" ") + 1 of them, the caller sizes the arrays):
 * starts/ends its byte span, and for a piece of at most MAX_KEY_BYTES bytes whose exact key
 * is in the table (found within PROBES linear-probe rounds from its home slot, as
 * PieceTable.lookup) values its value and found 1. The key, the slot hash and the probe
 * order are piecetable.py's bit for bit (little-endian words; the table is shared).
 * Only reads `rows`; the GIL is released during the pass (the buffers are held). */
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
            uint64_t *key = keys[m];
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
                    key[w] = load_le(p + 8 * w, k);
                }
            }
            key[WORDS - 1] |= (uint64_t)(plen + 1) << 56;
            uint64_t h = 0;
            for (int w = 0; w < WORDS; w++) {
                h += key[w] * MIX[w];
            }
            h ^= h >> 31;
            h *= MIX[0];
            slots[m] = h >> shift;
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

static PyObject *
probe_pieces(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer raw, rows, values, found, starts, ends;
    PyObject *rows_o, *values_o, *found_o, *starts_o, *ends_o;
    unsigned long long mask;
    unsigned int shift;
    if (!PyArg_ParseTuple(args, "y*OKIOOOO", &raw, &rows_o, &mask, &shift, &values_o,
                          &found_o, &starts_o, &ends_o)) {
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
    Py_BEGIN_ALLOW_THREADS
    probe_all(data, len, rows.buf, (uint64_t)mask, shift, values.buf, found.buf, starts.buf,
              ends.buf, n);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&ends);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&found);
    PyBuffer_Release(&values);
    PyBuffer_Release(&rows);
    PyBuffer_Release(&raw);
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

static PyMethodDef methods[] = {
    {"probe_pieces", probe_pieces, METH_VARARGS,
     "probe_pieces(raw, rows, mask, shift, values, found, starts, ends): split raw on b' ', "
     "key and look up every piece in a PieceTable's rows (compressor/piecetable.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "compressor._fast",
    "piecetable.py's split + key + probe in C (optional; numpy fallback).", -1, methods,
};

PyMODINIT_FUNC
PyInit__fast(void)
{
    return PyModule_Create(&module);
}
