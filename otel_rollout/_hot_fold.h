/* The report's buckets of attempts in flight, folded in C (included by _hot.c).
 *
 * fold_flight_counts(counts, buckets, geometry, points) -> None
 *
 * counts: packed records.FLIGHT_COUNT points (t: double, count: int64), as the shared
 * state keeps them.  buckets: the report's list of [start, last t, least, most, sum, n]
 * buckets (floats, then ints); geometry: the list [width, origin] (floats; width 0: a
 * bucket a change).  Each point at a time before the last bucket's end (start + width)
 * goes into it; any other begins a bucket at `t`, or with a width at the start of the
 * width's slot its time falls in (counted from the origin, the first point's time).
 * Once there are 2 * `points` buckets the width doubles (the first time: about 1/points
 * of the time so far) and the buckets that now share a slot merge.  The same rules as
 * analysis/hot.py's fold_flight_counts in Python, which runs without this module: on the
 * 1M-line bench trace its loop over 820k points, 19k new buckets and 8 coarsenings were
 * ~0.15 s, a seventh of the pass.
 *
 * The last bucket's numbers are held as C numbers while points go into it, and written
 * back to its list before the next bucket begins and at the end.  Times go as Python's
 * float arithmetic takes them (its % included: py_mod); counts as int64 (the attempts in
 * flight: a count, and sums of them far below 2**63; past it, an OverflowError).
 */
#ifndef OTEL_ROLLOUT_HOT_FOLD_H
#define OTEL_ROLLOUT_HOT_FOLD_H

#include <Python.h>
#include <math.h>
#include <string.h>

/* Python's float x % y (floatobject.c's float_rem): the sign of y. */
static double py_mod(double x, double y)
{
    double mod = fmod(x, y);
    if (mod != 0.0) {
        if ((y < 0) != (mod < 0))
            mod += y;
    } else {
        mod = copysign(0.0, y);
    }
    return mod;
}

/* Python's max(a, b) and min(a, b) of two floats (the first unless the second wins). */
static double py_max(double a, double b) { return b > a ? b : a; }

typedef struct {
    PyObject *list; /* the last bucket (borrowed from buckets), or NULL */
    double start, t;
    long long least, most, sum, n;
} Bucket;

/* Read a bucket's numbers.  -1 on error (a bucket not of the shape above). */
static int bucket_read(PyObject *list, Bucket *b)
{
    if (!PyList_CheckExact(list) || PyList_GET_SIZE(list) != 6) {
        PyErr_SetString(PyExc_TypeError, "fold_flight_counts: a bucket is a list of six");
        return -1;
    }
    /* each checked before the next: a conversion may run Python code (__float__) */
    if ((b->start = PyFloat_AsDouble(PyList_GET_ITEM(list, 0))) == -1.0 && PyErr_Occurred())
        return -1;
    if ((b->t = PyFloat_AsDouble(PyList_GET_ITEM(list, 1))) == -1.0 && PyErr_Occurred())
        return -1;
    long long *counts[4] = {&b->least, &b->most, &b->sum, &b->n};
    for (int i = 0; i < 4; i++) {
        *counts[i] = PyLong_AsLongLong(PyList_GET_ITEM(list, 2 + i));
        if (*counts[i] == -1 && PyErr_Occurred())
            return -1;
    }
    b->list = list;
    return 0;
}

/* Write a bucket's numbers into `list` from item `from` on (1: all but its start).
 * -1 on error. */
static int bucket_write(PyObject *list, const Bucket *b, int from)
{
    PyObject *values[6] = {
        from == 0 ? PyFloat_FromDouble(b->start) : NULL, PyFloat_FromDouble(b->t),
        PyLong_FromLongLong(b->least), PyLong_FromLongLong(b->most),
        PyLong_FromLongLong(b->sum), PyLong_FromLongLong(b->n),
    };
    int failed = 0;
    for (int i = from; i < 6; i++)
        failed |= values[i] == NULL;
    for (int i = from; i < 6; i++) {
        if (failed)
            Py_XDECREF(values[i]);
        else
            PyList_SetItem(list, i, values[i]); /* steals the reference */
    }
    return failed ? -1 : 0;
}

/* A new list holding the bucket, appended to `into`.  -1 on error. */
static int bucket_append(PyObject *into, const Bucket *b)
{
    PyObject *list = PyList_New(6);
    if (list == NULL)
        return -1;
    for (int i = 0; i < 6; i++) /* every item set below; None until then */
        PyList_SET_ITEM(list, i, Py_NewRef(Py_None));
    int failed = bucket_write(list, b, 0) < 0 || PyList_Append(into, list) < 0;
    Py_DECREF(list);
    return failed ? -1 : 0;
}

/* Double the width (the first time: the span so far over `points`, at least a
 * microsecond) and merge the buckets that now share a slot.  -1 on error. */
static int coarsen(PyObject *buckets, double *width, double origin, Py_ssize_t points)
{
    Py_ssize_t size = PyList_GET_SIZE(buckets);
    Bucket last, b;
    if (bucket_read(PyList_GET_ITEM(buckets, size - 1), &last) < 0)
        return -1;
    double span = last.t - origin;
    *width = *width != 0.0 ? *width * 2 : py_max(span / (double)points, 1e-6);
    PyObject *merged = PyList_New(0);
    if (merged == NULL)
        return -1;
    Bucket m = {NULL, 0, 0, 0, 0, 0, 0};
    int held = 0; /* m holds the last merged bucket, not yet in `merged` */
    for (Py_ssize_t i = 0; i < size; i++) {
        if (bucket_read(PyList_GET_ITEM(buckets, i), &b) < 0)
            goto error;
        double start = b.start - py_mod(b.start - origin, *width);
        if (held && m.start == start) {
            m.t = py_max(m.t, b.t);
            m.least = b.least < m.least ? b.least : m.least;
            m.most = b.most > m.most ? b.most : m.most;
            if (__builtin_add_overflow(m.sum, b.sum, &m.sum) ||
                __builtin_add_overflow(m.n, b.n, &m.n)) {
                PyErr_SetString(PyExc_OverflowError, "fold_flight_counts: a sum past 64 bits");
                goto error;
            }
            continue;
        }
        if (held && bucket_append(merged, &m) < 0)
            goto error;
        m = b;
        m.start = start;
        held = 1;
    }
    if (held && bucket_append(merged, &m) < 0)
        goto error;
    if (PyList_SetSlice(buckets, 0, size, merged) < 0)
        goto error;
    Py_DECREF(merged);
    return 0;
error:
    Py_DECREF(merged);
    return -1;
}

static PyObject *fold_flight_counts(PyObject *self, PyObject *args)
{
    Py_buffer counts;
    PyObject *buckets, *geometry;
    Py_ssize_t points;
    if (!PyArg_ParseTuple(args, "y*O!O!n", &counts, &PyList_Type, &buckets, &PyList_Type,
                          &geometry, &points))
        return NULL;
    PyObject *result = NULL;
    Bucket b = {NULL, 0, 0, 0, 0, 0, 0};
    double width, origin;
    if (counts.len % 16 != 0 || PyList_GET_SIZE(geometry) != 2 || points < 1 ||
        points > PY_SSIZE_T_MAX / 2) {
        PyErr_SetString(PyExc_ValueError, "fold_flight_counts: 16-byte points, "
                                          "[width, origin] and points >= 1");
        goto done;
    }
    width = PyFloat_AsDouble(PyList_GET_ITEM(geometry, 0));
    origin = PyFloat_AsDouble(PyList_GET_ITEM(geometry, 1));
    if (PyErr_Occurred())
        goto done;
    Py_ssize_t size = PyList_GET_SIZE(buckets);
    if (size > 0 && bucket_read(PyList_GET_ITEM(buckets, size - 1), &b) < 0)
        goto done;
    double end = b.list != NULL ? b.start + width : -INFINITY;
    const char *p = counts.buf, *stop = p + counts.len;
    for (; p < stop; p += 16) {
        double t;
        int64_t n;
        memcpy(&t, p, 8);
        memcpy(&n, p + 8, 8);
        if (b.list != NULL && t < end) {
            if (t > b.t)
                b.t = t;
            if (n < b.least)
                b.least = n;
            else if (n > b.most)
                b.most = n;
            if (__builtin_add_overflow(b.sum, n, &b.sum) || __builtin_add_overflow(b.n, 1, &b.n)) {
                PyErr_SetString(PyExc_OverflowError, "fold_flight_counts: a sum past 64 bits");
                goto done;
            }
            continue;
        }
        if (b.list != NULL && bucket_write(b.list, &b, 1) < 0)
            goto done;
        if (PyList_GET_SIZE(buckets) == 0)
            origin = t;
        double start = width == 0.0 ? t : t - py_mod(t - origin, width);
        b = (Bucket){NULL, start, t, n, n, n, 1};
        if (bucket_append(buckets, &b) < 0)
            goto done;
        if (PyList_GET_SIZE(buckets) >= 2 * points) {
            if (coarsen(buckets, &width, origin, points) < 0)
                goto done;
        }
        size = PyList_GET_SIZE(buckets);
        if (bucket_read(PyList_GET_ITEM(buckets, size - 1), &b) < 0)
            goto done;
        end = b.start + width;
    }
    if (b.list != NULL && bucket_write(b.list, &b, 1) < 0)
        goto done;
    PyObject *w = PyFloat_FromDouble(width), *o = PyFloat_FromDouble(origin);
    if (w == NULL || o == NULL) {
        Py_XDECREF(w);
        Py_XDECREF(o);
        goto done;
    }
    PyList_SetItem(geometry, 0, w);
    PyList_SetItem(geometry, 1, o);
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&counts);
    return result;
}

#endif
