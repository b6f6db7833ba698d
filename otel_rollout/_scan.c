/* The reader's line finder in C: an optional accelerator of _blocks.scan.
 *
 * scan(chunk, start, end, needles, first) -> (found, newlines)
 *
 *   found:    [(offset, line), ...] for each line of chunk[start:end] that contains
 *             one of needles (and the line at start when first is true), in file order;
 *             line is the line's bytes without its newline.
 *   newlines: the number of b"\n" in chunk[start:end].
 *
 * The same result as the pure-Python _blocks.scan (a hypothesis test holds the two to
 * it).  Needles hold no newline (they are event kinds' names; the Python side checks),
 * so a match never crosses a line.
 *
 * Where SSE2 is there (every x86-64), one pass finds every needle at once: each vector
 * step compares the needles' first and last bytes at every position and checks the few
 * positions where both agree (Mula's "SIMD-friendly" substring search), and a match skips
 * the rest of its line; the newlines are counted a vector at a time.  Steps are 32 bytes
 * where the CPU has AVX2 (picked when the module loads), else 16.  On the 600k-line bench
 * trace, each 128 KiB block scanned as it is read, batch age's four needles and the
 * newlines took 0.060 s as a memmem pass a needle (glibc's: 3-6 GB/s for these names),
 * 0.029 s in one pass of 32-byte steps and 0.040 s of 16-byte ones; in Python, 0.35 s.
 * Elsewhere, or past MAX_AT_ONCE needles, each needle is a memmem pass (scan_each, which
 * the tests also run).
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#define HAVE_SSE2 1
#endif

#define MAX_AT_ONCE 8

typedef struct {
    const char *bytes;
    Py_ssize_t length;
} Needle;

static int add_line(PyObject *found, const char *base, const char *line, const char *stop)
{
    PyObject *offset = PyLong_FromSsize_t(line - base);
    PyObject *bytes = PyBytes_FromStringAndSize(line, stop - line);
    PyObject *pair = (offset && bytes) ? PyTuple_Pack(2, offset, bytes) : NULL;
    Py_XDECREF(offset);
    Py_XDECREF(bytes);
    if (pair == NULL)
        return -1;
    int failed = PyList_Append(found, pair);
    Py_DECREF(pair);
    return failed;
}

static int by_offset(const void *a, const void *b)
{
    Py_ssize_t x = *(const Py_ssize_t *)a, y = *(const Py_ssize_t *)b;
    return (x > y) - (x < y);
}

/* A growing array of line starts. */
typedef struct {
    Py_ssize_t *at;
    Py_ssize_t count, room;
} Starts;

static int push(Starts *starts, Py_ssize_t offset)
{
    if (starts->count == starts->room) {
        Py_ssize_t *grown = PyMem_Realloc(starts->at, 2 * starts->room * sizeof(Py_ssize_t));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        starts->at = grown, starts->room *= 2;
    }
    starts->at[starts->count++] = offset;
    return 0;
}

/* Each needle over the whole window: memmem's skip search runs at several GB/s, where a
 * call per line paid its set-up ~120k times a 60k-line file (a seventh of batch-age).
 * Starts come out by needle, then are sorted and told apart by the caller. */
static int find_each(Starts *starts, const char *base, const char *from, const char *limit,
                     const Needle *needles, Py_ssize_t count)
{
    for (Py_ssize_t i = 0; i < count; i++) {
        const char *needle = needles[i].bytes;
        Py_ssize_t length = needles[i].length;
        const char *at = from;
        while (limit - at >= length) {
            const char *hit = length == 1 ? memchr(at, needle[0], limit - at)
                                          : memmem(at, limit - at, needle, length);
            if (hit == NULL)
                break;
            const char *before = memrchr(from, '\n', hit - from);
            if (push(starts, (before != NULL ? before + 1 : from) - base) < 0)
                return -1;
            const char *newline = memchr(hit, '\n', limit - hit);
            if (newline == NULL)
                break;
            at = newline + 1; /* the rest of this line holds nothing more to find */
        }
    }
    qsort(starts->at, starts->count, sizeof(Py_ssize_t), by_offset);
    return 0;
}

#ifdef HAVE_SSE2
#include <immintrin.h>

/* Whether one of needles starts at p (each fits before limit). */
static int starts_here(const char *p, const char *limit, const Needle *needles, Py_ssize_t count)
{
    for (Py_ssize_t k = 0; k < count; k++)
        if (limit - p >= needles[k].length && memcmp(p, needles[k].bytes, needles[k].length) == 0)
            return 1;
    return 0;
}

/* The first place at or after at where one of needles (at most MAX_AT_ONCE) starts, or
 * NULL: for each WIDTH positions, a mask of those where a needle's first byte and last
 * byte (its length - 1 further) both agree, then a memcmp of the few candidates.  Made
 * twice below, for SSE2 (16 bytes a step) and AVX2 (32), picked when the module loads.
 * Both loads of a step stay inside the window: at + longest - 1 + WIDTH <= limit. */
#define FIND_ANY(NAME, TARGET, VEC, WIDTH, SET1, LOADU, CMPEQ, AND, MOVEMASK)                  \
    TARGET static const char *NAME(const char *at, const char *limit, const Needle *needles,  \
                                   Py_ssize_t count, Py_ssize_t longest)                      \
    {                                                                                         \
        VEC firsts[MAX_AT_ONCE], lasts[MAX_AT_ONCE];                                          \
        for (Py_ssize_t k = 0; k < count; k++) {                                              \
            firsts[k] = SET1(needles[k].bytes[0]);                                            \
            lasts[k] = SET1(needles[k].bytes[needles[k].length - 1]);                         \
        }                                                                                     \
        while (limit - at >= longest - 1 + WIDTH) {                                           \
            VEC block = LOADU((const VEC *)at);                                               \
            unsigned masks[MAX_AT_ONCE], any = 0;                                             \
            for (Py_ssize_t k = 0; k < count; k++) {                                          \
                VEC both = CMPEQ(block, firsts[k]);                                           \
                if (needles[k].length > 1) /* a backslash is one byte: one compare */         \
                    both = AND(both, CMPEQ(LOADU((const VEC *)(at + needles[k].length - 1)),  \
                                           lasts[k]));                                        \
                masks[k] = (unsigned)MOVEMASK(both);                                          \
                any |= masks[k];                                                              \
            }                                                                                 \
            while (any) {                                                                     \
                int bit = __builtin_ctz(any);                                                 \
                for (Py_ssize_t k = 0; k < count; k++)                                        \
                    if ((masks[k] >> bit) & 1u &&                                             \
                        memcmp(at + bit, needles[k].bytes, needles[k].length) == 0)           \
                        return at + bit;                                                      \
                any &= any - 1;                                                               \
            }                                                                                 \
            at += WIDTH;                                                                      \
        }                                                                                     \
        for (; at < limit; at++) /* the last few positions, one at a time */                  \
            if (starts_here(at, limit, needles, count))                                       \
                return at;                                                                    \
        return NULL;                                                                          \
    }

/* The b"\n" in [p, limit): each lane counts its matches (cmpeq gives -1, subtracted) for
 * up to 255 steps, then the lanes are summed (sad against zero). */
#define COUNT_NEWLINES(NAME, TARGET, VEC, WIDTH, SET1, LOADU, CMPEQ, SUB, SAD, SUM)           \
    TARGET static Py_ssize_t NAME(const char *p, const char *limit)                           \
    {                                                                                         \
        Py_ssize_t n = 0;                                                                     \
        const VEC newline = SET1('\n'), zero = SET1(0);                                       \
        while (limit - p >= WIDTH) {                                                          \
            VEC lanes = zero;                                                                 \
            for (int steps = 0; steps < 255 && limit - p >= WIDTH; steps++, p += WIDTH)       \
                lanes = SUB(lanes, CMPEQ(LOADU((const VEC *)p), newline));                    \
            n += SUM(SAD(lanes, zero));                                                       \
        }                                                                                     \
        for (; p < limit; p++)                                                                \
            n += *p == '\n';                                                                  \
        return n;                                                                             \
    }

static Py_ssize_t sum_sse2(__m128i sums)
{
    return _mm_cvtsi128_si32(sums) + _mm_cvtsi128_si32(_mm_srli_si128(sums, 8));
}

#define AVX2 __attribute__((target("avx2")))

AVX2 static Py_ssize_t sum_avx2(__m256i sums)
{
    __m128i halves = _mm_add_epi64(_mm256_castsi256_si128(sums), _mm256_extracti128_si256(sums, 1));
    return _mm_cvtsi128_si32(halves) + _mm_cvtsi128_si32(_mm_srli_si128(halves, 8));
}

FIND_ANY(find_any_sse2, , __m128i, 16, _mm_set1_epi8, _mm_loadu_si128, _mm_cmpeq_epi8,
         _mm_and_si128, _mm_movemask_epi8)
FIND_ANY(find_any_avx2, AVX2, __m256i, 32, _mm256_set1_epi8, _mm256_loadu_si256,
         _mm256_cmpeq_epi8, _mm256_and_si256, _mm256_movemask_epi8)
COUNT_NEWLINES(count_sse2, , __m128i, 16, _mm_set1_epi8, _mm_loadu_si128, _mm_cmpeq_epi8,
               _mm_sub_epi8, _mm_sad_epu8, sum_sse2)
COUNT_NEWLINES(count_avx2, AVX2, __m256i, 32, _mm256_set1_epi8, _mm256_loadu_si256,
               _mm256_cmpeq_epi8, _mm256_sub_epi8, _mm256_sad_epu8, sum_avx2)

typedef const char *(*FindAny)(const char *, const char *, const Needle *, Py_ssize_t,
                               Py_ssize_t);
static FindAny find_any = find_any_sse2;
static Py_ssize_t (*count_newlines)(const char *, const char *) = count_sse2;

/* Every needle in one pass, lines in order: after a match, the search goes on at the next
 * line, so no line is found twice. */
static int find_once(Starts *starts, const char *base, const char *from, const char *limit,
                     const Needle *needles, Py_ssize_t count)
{
    Py_ssize_t longest = 0;
    for (Py_ssize_t k = 0; k < count; k++)
        if (needles[k].length > longest)
            longest = needles[k].length;
    const char *at = from;
    if (starts->count) { /* the first line is found already: go on after it */
        const char *newline = memchr(from, '\n', limit - from);
        at = newline != NULL ? newline + 1 : limit;
    }
    while (at < limit) {
        const char *hit = find_any(at, limit, needles, count, longest);
        if (hit == NULL)
            break;
        const char *before = memrchr(at, '\n', hit - at); /* at is a line's start */
        if (push(starts, (before != NULL ? before + 1 : at) - base) < 0)
            return -1;
        const char *newline = memchr(hit, '\n', limit - hit);
        if (newline == NULL)
            break;
        at = newline + 1;
    }
    return 0;
}
#else
static Py_ssize_t count_newlines(const char *p, const char *limit)
{
    Py_ssize_t n = 0;
    for (; (p = memchr(p, '\n', limit - p)) != NULL; p++)
        n++;
    return n;
}
#endif

static PyObject *run_scan(PyObject *args, int each)
{
    Py_buffer chunk;
    Py_ssize_t start, end;
    PyObject *names;
    int first;
    if (!PyArg_ParseTuple(args, "y*nnO!p", &chunk, &start, &end, &PyTuple_Type, &names, &first))
        return NULL;
    PyObject *result = NULL, *found = NULL;
    Starts starts = {NULL, 0, 64};
    Py_ssize_t count = PyTuple_GET_SIZE(names);
    Needle *needles = PyMem_Malloc((count ? count : 1) * sizeof(Needle));
    if (needles == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (start < 0 || end > chunk.len || start > end) {
        PyErr_SetString(PyExc_ValueError, "start and end must lie within the chunk");
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i);
        if (!PyBytes_Check(name) || PyBytes_GET_SIZE(name) == 0) {
            PyErr_SetString(PyExc_TypeError, "needles must be non-empty bytes");
            goto done;
        }
        if (memchr(PyBytes_AS_STRING(name), '\n', PyBytes_GET_SIZE(name)) != NULL) {
            PyErr_SetString(PyExc_ValueError, "a needle may not hold a newline");
            goto done;
        }
        needles[i].bytes = PyBytes_AS_STRING(name);
        needles[i].length = PyBytes_GET_SIZE(name);
    }
    starts.at = PyMem_Malloc(starts.room * sizeof(Py_ssize_t));
    if (starts.at == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const char *base = chunk.buf, *from = base + start, *limit = base + end;
    if (first && push(&starts, start) < 0)
        goto done;
#ifdef HAVE_SSE2
    if (!each && count > 0 && count <= MAX_AT_ONCE) { /* (no needle: longest 0, no steps) */
        if (find_once(&starts, base, from, limit, needles, count) < 0)
            goto done;
    }
    else
#endif
    if (find_each(&starts, base, from, limit, needles, count) < 0)
        goto done;
    found = PyList_New(0);
    if (found == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < starts.count; i++) {
        if (i > 0 && starts.at[i] == starts.at[i - 1])
            continue; /* a line two needles found */
        const char *line = base + starts.at[i];
        const char *newline = memchr(line, '\n', limit - line);
        if (add_line(found, base, line, newline != NULL ? newline : limit) < 0)
            goto done;
    }
    result = Py_BuildValue("(On)", found, count_newlines(from, limit));
done:
    Py_XDECREF(found);
    PyMem_Free(starts.at);
    PyMem_Free(needles);
    PyBuffer_Release(&chunk);
    return result;
}

static PyObject *scan(PyObject *self, PyObject *args)
{
    return run_scan(args, 0);
}

static PyObject *scan_each(PyObject *self, PyObject *args)
{
    return run_scan(args, 1);
}

/* For the tests: run the SSE2 steps on a machine with AVX2 too, or go back. */
static PyObject *vector_width(PyObject *self, PyObject *args)
{
    int width = 0;
    if (!PyArg_ParseTuple(args, "|i", &width))
        return NULL;
#ifdef HAVE_SSE2
    if (width == 16)
        find_any = find_any_sse2, count_newlines = count_sse2;
    else if (width == 32 && __builtin_cpu_supports("avx2"))
        find_any = find_any_avx2, count_newlines = count_avx2;
    else if (width != 0) {
        PyErr_SetString(PyExc_ValueError, "this machine runs no such width");
        return NULL;
    }
    return PyLong_FromLong(find_any == find_any_avx2 ? 32 : 16);
#else
    if (width != 0) {
        PyErr_SetString(PyExc_ValueError, "built without SSE2: no vector steps");
        return NULL;
    }
    return PyLong_FromLong(0);
#endif
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(chunk, start, end, needles, first) -> (found, newlines): the lines of "
     "chunk[start:end] holding a needle, as (offset, line), and its newline count."},
    {"scan_each", scan_each, METH_VARARGS,
     "scan_each(chunk, start, end, needles, first): scan, always one memmem pass a "
     "needle (what scan does without SSE2 or past 8 needles)."},
    {"vector_width", vector_width, METH_VARARGS,
     "vector_width([16 or 32]) -> the bytes a vector step of scan takes (0: no vector "
     "steps); with an argument, use that width from now on (for the tests)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "otel_rollout._scan",
    "The reader's line finder in C (see _blocks.scan).", -1, methods,
};

PyMODINIT_FUNC PyInit__scan(void)
{
#ifdef HAVE_SSE2
    if (__builtin_cpu_supports("avx2"))
        find_any = find_any_avx2, count_newlines = count_avx2;
#endif
    return PyModule_Create(&module);
}
