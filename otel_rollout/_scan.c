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
 * it), in one pass instead of one bytes.find pass per kind plus a bytes.count pass:
 * glibc's memchr and memmem, ~2.6x bytes.find's speed here (3.3 GB/s against 1.3).
 * On the 1M-line bench trace, finding the seals and steps batch age reads took 0.11 s
 * against 0.41 s.  Needles hold no newline (they are event kinds' names; the Python
 * side checks), so a match never crosses a line.
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#define MAX_NEEDLES 16

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

static PyObject *scan(PyObject *self, PyObject *args)
{
    Py_buffer chunk;
    Py_ssize_t start, end;
    PyObject *needles;
    int first;
    if (!PyArg_ParseTuple(args, "y*nnO!p", &chunk, &start, &end, &PyTuple_Type, &needles, &first))
        return NULL;
    PyObject *result = NULL, *found = NULL;
    const char *names[MAX_NEEDLES];
    Py_ssize_t lengths[MAX_NEEDLES];
    Py_ssize_t count = PyTuple_GET_SIZE(needles);
    if (start < 0 || end > chunk.len || start > end) {
        PyErr_SetString(PyExc_ValueError, "start and end must lie within the chunk");
        goto done;
    }
    if (count > MAX_NEEDLES) {
        PyErr_SetString(PyExc_ValueError, "too many needles");
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *name = PyTuple_GET_ITEM(needles, i);
        if (!PyBytes_Check(name) || PyBytes_GET_SIZE(name) == 0) {
            PyErr_SetString(PyExc_TypeError, "needles must be non-empty bytes");
            goto done;
        }
        names[i] = PyBytes_AS_STRING(name);
        lengths[i] = PyBytes_GET_SIZE(name);
        if (memchr(names[i], '\n', lengths[i]) != NULL) {
            PyErr_SetString(PyExc_ValueError, "a needle may not hold a newline");
            goto done;
        }
    }
    found = PyList_New(0);
    if (found == NULL)
        goto done;
    const char *base = chunk.buf;
    const char *line = base + start, *limit = base + end;
    Py_ssize_t newlines = 0;
    while (line < limit) {
        const char *newline = memchr(line, '\n', limit - line);
        const char *stop = newline != NULL ? newline : limit;
        int wanted = first && line == base + start;
        for (Py_ssize_t i = 0; i < count && !wanted; i++)
            wanted = stop - line >= lengths[i] && memmem(line, stop - line, names[i], lengths[i]) != NULL;
        if (wanted && add_line(found, base, line, stop) < 0)
            goto done;
        if (newline == NULL)
            break;
        newlines++;
        line = newline + 1;
    }
    if (first && start == end && add_line(found, base, line, line) < 0)
        goto done;  /* an empty first block: its one (empty) line, as the Python side finds */
    result = Py_BuildValue("(On)", found, newlines);
done:
    Py_XDECREF(found);
    PyBuffer_Release(&chunk);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(chunk, start, end, needles, first) -> (found, newlines): the lines of "
     "chunk[start:end] holding a needle, as (offset, line), and its newline count."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "otel_rollout._scan",
    "The reader's line finder in C (see _blocks.scan).", -1, methods,
};

PyMODINIT_FUNC PyInit__scan(void)
{
    return PyModule_Create(&module);
}
