/* The report's fold of the attempts in flight, in C (included by _hot.c).
 *
 * fold_flight_counts(counts, buckets, end, new_bucket) -> None
 *
 * counts: packed records.FLIGHT_COUNT points (t: double, count: int64), as the shared
 * state keeps them.  buckets: the report's list of [start, last t, least, most, sum, n]
 * buckets; end: where its last bucket ends (-inf for none).  Each point at a time before
 * `end` goes into the last bucket (its last t, least, most, sum and n); any other begins
 * a bucket through new_bucket(t, count), which appends it (coarsening them all as it
 * must) and returns where the last bucket now ends.  The same rule as
 * analysis/hot.py's fold_flight_counts, which runs without this module: on the 1M-line
 * bench trace the Python loop over its 820k points was ~0.12 s, a tenth of the pass.
 *
 * The last bucket's numbers are held as C numbers while points go into it, and written
 * back to its list before new_bucket is called and at the end.
 */
#ifndef OTEL_ROLLOUT_HOT_FOLD_H
#define OTEL_ROLLOUT_HOT_FOLD_H

#include <Python.h>
#include <string.h>

typedef struct {
    PyObject *list; /* the last bucket (borrowed from buckets), or NULL */
    double t;
    long long least, most, sum, n;
} Bucket;

/* The last bucket of `buckets`, its numbers read; b->list NULL for none.  -1 on error (a
 * bucket not of the shape above). */
static int bucket_load(Bucket *b, PyObject *buckets)
{
    b->list = NULL;
    Py_ssize_t size = PyList_GET_SIZE(buckets);
    if (size == 0)
        return 0;
    PyObject *last = PyList_GET_ITEM(buckets, size - 1);
    if (!PyList_CheckExact(last) || PyList_GET_SIZE(last) != 6) {
        PyErr_SetString(PyExc_TypeError, "fold_flight_counts: a bucket is a list of six");
        return -1;
    }
    b->t = PyFloat_AsDouble(PyList_GET_ITEM(last, 1));
    b->least = PyLong_AsLongLong(PyList_GET_ITEM(last, 2));
    b->most = PyLong_AsLongLong(PyList_GET_ITEM(last, 3));
    b->sum = PyLong_AsLongLong(PyList_GET_ITEM(last, 4));
    b->n = PyLong_AsLongLong(PyList_GET_ITEM(last, 5));
    if (PyErr_Occurred())
        return -1;
    b->list = last;
    return 0;
}

/* Write the held numbers back to the bucket's list.  -1 on error. */
static int bucket_store(Bucket *b)
{
    if (b->list == NULL)
        return 0;
    PyObject *values[5] = {
        PyFloat_FromDouble(b->t), PyLong_FromLongLong(b->least), PyLong_FromLongLong(b->most),
        PyLong_FromLongLong(b->sum), PyLong_FromLongLong(b->n),
    };
    int failed = 0;
    for (int i = 0; i < 5; i++) {
        if (values[i] == NULL)
            failed = 1;
        else if (!failed)
            PyList_SetItem(b->list, i + 1, values[i]); /* steals the reference */
        else
            Py_DECREF(values[i]);
    }
    return failed ? -1 : 0;
}

static PyObject *fold_flight_counts(PyObject *self, PyObject *args)
{
    Py_buffer counts;
    PyObject *buckets, *new_bucket;
    double end;
    if (!PyArg_ParseTuple(args, "y*O!dO", &counts, &PyList_Type, &buckets, &end, &new_bucket))
        return NULL;
    PyObject *result = NULL;
    Bucket b;
    if (counts.len % 16 != 0) {
        PyErr_SetString(PyExc_ValueError, "fold_flight_counts: counts are 16-byte points");
        goto done;
    }
    if (bucket_load(&b, buckets) < 0)
        goto done;
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
            b.sum += n;
            b.n += 1;
            continue;
        }
        if (bucket_store(&b) < 0)
            goto done;
        PyObject *ends = PyObject_CallFunction(new_bucket, "dL", t, (long long)n);
        if (ends == NULL)
            goto done;
        end = PyFloat_AsDouble(ends);
        Py_DECREF(ends);
        if (end == -1.0 && PyErr_Occurred())
            goto done;
        if (bucket_load(&b, buckets) < 0)
            goto done;
        if (b.list == NULL) {
            PyErr_SetString(PyExc_ValueError, "fold_flight_counts: new_bucket made none");
            goto done;
        }
    }
    if (bucket_store(&b) < 0)
        goto done;
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&counts);
    return result;
}

#endif
