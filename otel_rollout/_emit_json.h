/* The log's lines made in C from emit's arguments (included by _emit.c).
 *
 * json_line() writes {"t":...,"run_id":...,"event":...,<fields>}\n for the
 * values orjson writes the same way for sure: a str name, fields of exact str,
 * int (64-bit), float (finite, written without an exponent), bool, None, and
 * lists and tuples of those.  Anything else (an enum, a dict, a set, a bigger
 * integer, a string with a lone surrogate, a reserved field name, a line past
 * the limit) returns 0 and leaves the rest to the log's own rule in Python.
 * The time is written to the microsecond, as the shortest repr of that
 * microsecond's float (what orjson writes for it): repr of a full time.time()
 * float alone costs 0.5 us.
 */

typedef struct {
    char *data;
    Py_ssize_t len, cap;
} Buf;

/* Room for need more bytes: 0, or -1 with no error set (no Python object made: a caller
 * holding the line buffer's mutex sets it once that is released). */
static int buf_reserve(Buf *b, Py_ssize_t need)
{
    if (b->len + need <= b->cap)
        return 0;
    Py_ssize_t cap = b->cap ? b->cap : 1 << 16;
    while (cap < b->len + need) {
        if (cap > PY_SSIZE_T_MAX / 2)
            return -1;
        cap *= 2;
    }
    char *data = PyMem_RawRealloc(b->data, cap); /* (raw: freed without the GIL too) */
    if (data == NULL)
        return -1;
    b->data = data;
    b->cap = cap;
    return 0;
}

static int buf_grow(Buf *b, Py_ssize_t need)
{
    if (buf_reserve(b, need) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static int buf_put(Buf *b, const char *s, Py_ssize_t n)
{
    if (buf_grow(b, n) < 0)
        return -1;
    memcpy(b->data + b->len, s, n);
    b->len += n;
    return 0;
}

static int put_digits(char *w, unsigned long long x)
{
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + x % 10);
        x /= 10;
    } while (x);
    for (int i = 0; i < n; i++)
        w[i] = tmp[n - 1 - i];
    return n;
}

/* 1: written; 0: not a string this writer takes (an error may be set: the caller clears
 * an Exception, as for any value left to Python); -1: out of memory. */
static int put_string(Buf *b, PyObject *s, Py_ssize_t limit)
{
    Py_ssize_t n;
    const char *u = PyUnicode_AsUTF8AndSize(s, &n); /* fails on a lone surrogate */
    if (u == NULL)
        return 0;
    if (n > limit)
        return 0; /* a line past the limit: the log's rule writes it short */
    if (buf_grow(b, 2 + 6 * n) < 0)
        return -1;
    char *w = b->data + b->len;
    *w++ = '"';
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)u[i];
        if (c >= 0x20 && c != '"' && c != '\\') {
            *w++ = (char)c;
            continue;
        }
        *w++ = '\\';
        switch (c) { /* orjson's escapes, the same bytes */
        case '"': *w++ = '"'; break;
        case '\\': *w++ = '\\'; break;
        case '\n': *w++ = 'n'; break;
        case '\r': *w++ = 'r'; break;
        case '\t': *w++ = 't'; break;
        case '\b': *w++ = 'b'; break;
        case '\f': *w++ = 'f'; break;
        default:
            *w++ = 'u';
            *w++ = '0';
            *w++ = '0';
            *w++ = "0123456789abcdef"[c >> 4];
            *w++ = "0123456789abcdef"[c & 15];
        }
    }
    *w++ = '"';
    b->len = w - b->data;
    return 1;
}

static int put_value(Buf *b, PyObject *v, int depth, Py_ssize_t limit);

static int put_float(Buf *b, double x)
{
    if (!isfinite(x))
        return 0; /* orjson writes null: the log's rule says so, not this */
    char *r = PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (r == NULL)
        return -1;
    int written = 0;
    if (strchr(r, 'e') == NULL) { /* an exponent orjson writes its own way */
        written = buf_put(b, r, (Py_ssize_t)strlen(r)) < 0 ? -1 : 1;
    }
    PyMem_Free(r);
    return written;
}

static int put_value(Buf *b, PyObject *v, int depth, Py_ssize_t limit)
{
    if (PyUnicode_CheckExact(v))
        return put_string(b, v, limit);
    if (v == Py_None)
        return buf_put(b, "null", 4) < 0 ? -1 : 1;
    if (v == Py_True)
        return buf_put(b, "true", 4) < 0 ? -1 : 1;
    if (v == Py_False)
        return buf_put(b, "false", 5) < 0 ? -1 : 1;
    if (PyLong_CheckExact(v)) {
        int overflow;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow || (x == -1 && PyErr_Occurred()))
            return 0;
        if (buf_grow(b, 24) < 0)
            return -1;
        char *w = b->data + b->len;
        if (x < 0) {
            *w++ = '-';
            w += put_digits(w, (unsigned long long)(-(x + 1)) + 1);
        }
        else
            w += put_digits(w, (unsigned long long)x);
        b->len = w - b->data;
        return 1;
    }
    if (PyFloat_CheckExact(v))
        return put_float(b, PyFloat_AS_DOUBLE(v));
    if ((PyList_CheckExact(v) || PyTuple_CheckExact(v)) && depth < 8) {
        Py_ssize_t n = PyList_CheckExact(v) ? PyList_GET_SIZE(v) : PyTuple_GET_SIZE(v);
        if (n > limit)
            return 0; /* more items than the line may hold bytes */
        if (buf_put(b, "[", 1) < 0)
            return -1;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (i && buf_put(b, ",", 1) < 0)
                return -1;
            /* A list may change under a value's own code: none runs here (exact types). */
            PyObject *item = PyList_CheckExact(v) ? PyList_GET_ITEM(v, i) : PyTuple_GET_ITEM(v, i);
            int done = put_value(b, item, depth + 1, limit);
            if (done <= 0)
                return done;
        }
        return buf_put(b, "]", 1) < 0 ? -1 : 1;
    }
    return 0;
}

/* A field name the event's own keys take (t, run_id, event): the rename is Python's. */
static int reserved(PyObject *key)
{
    Py_ssize_t n;
    const char *u = PyUnicode_AsUTF8AndSize(key, &n);
    if (u == NULL) {
        PyErr_Clear();
        return 1; /* not for this writer either way */
    }
    return (n == 1 && u[0] == 't') || (n == 6 && memcmp(u, "run_id", 6) == 0)
           || (n == 5 && memcmp(u, "event", 5) == 0);
}

/* The time as the shortest repr of its microsecond's float; 0 outside [0, 2**33) s, where a
 * microsecond is not a float's whole digits. */
static int put_time(Buf *b, long long micros)
{
    if (buf_grow(b, 32) < 0)
        return -1;
    char *w = b->data + b->len;
    w += put_digits(w, (unsigned long long)(micros / 1000000));
    *w++ = '.';
    long long frac = micros % 1000000;
    char digits[6];
    for (int k = 5; k >= 0; k--) {
        digits[k] = (char)('0' + frac % 10);
        frac /= 10;
    }
    int keep = 6;
    while (keep > 1 && digits[keep - 1] == '0')
        keep--;
    memcpy(w, digits, keep);
    w += keep;
    b->len = w - b->data;
    return 1;
}

/* Appends the event's line to b: 1 written; 0 left to Python (b as it was); -1 an error. */
static int json_line(Buf *b, long long micros, PyObject *run_id_json, PyObject *name,
                     PyObject *const *values, PyObject *kwnames, Py_ssize_t limit)
{
    Py_ssize_t start = b->len;
    int done = 0;
    if (!PyUnicode_CheckExact(name))
        goto left;
    if (buf_put(b, "{\"t\":", 5) < 0 || (done = put_time(b, micros)) < 0)
        goto error;
    if (buf_put(b, ",\"run_id\":", 10) < 0
        || buf_put(b, PyBytes_AS_STRING(run_id_json), PyBytes_GET_SIZE(run_id_json)) < 0
        || buf_put(b, ",\"event\":", 9) < 0)
        goto error;
    if ((done = put_string(b, name, limit)) <= 0)
        goto check;
    Py_ssize_t n = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, i);
        if (!PyUnicode_CheckExact(key) || reserved(key))
            goto left;
        if (buf_put(b, ",", 1) < 0)
            goto error;
        if ((done = put_string(b, key, limit)) <= 0)
            goto check;
        if (buf_put(b, ":", 1) < 0)
            goto error;
        if ((done = put_value(b, values[i], 0, limit)) <= 0)
            goto check;
    }
    if (buf_put(b, "}\n", 2) < 0)
        goto error;
    if (b->len - start > limit)
        goto left; /* the log's rule writes it short, and counts it */
    return 1;
check:
    if (done < 0)
        goto error;
left:
    b->len = start;
    return 0;
error:
    b->len = start;
    return -1;
}
