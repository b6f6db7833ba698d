/* The caller's emit in C: the module otel_rollout._emit (compiled, optional; the
 * pipeline's Emitter uses it where built, its Python closure otherwise).
 *
 * Emitter(put, qsize, capacity, now, on_full, rename, run_id) is a callable
 * emit(name, /, **fields) that does what Pipeline.make_emit's closure does, with
 * the same results: stamp the time (now()), build the event dict {"t", "run_id",
 * "event", **fields}, hand an event with a field named t, run_id or event to
 * rename(t, name, fields), and put the event on the queue while qsize() < capacity,
 * or call on_full().
 *
 * Line mode (buffer=LineBuffer(), slow, limit; the pipeline's choice when the log is
 * its only exporter): the event becomes its line at once, appended to the buffer while
 * it holds fewer than capacity lines (_emit_lines.h: the buffer wakes a writer waiting
 * for a line, and the writer takes its lines without the GIL).  The line is made here
 * from the call's arguments (_emit_json.h: no event dict) for the common values, and
 * by slow(event), the log's own rule in Python, for the rest.
 *
 * Why: a controller that keeps the GIL busy lost 5-7% of its throughput to the log
 * at 10,000 events/s while the writer thread encoded event dicts made on another core
 * (1.4-2.6 us of the writer's time an event, most of it under the GIL).  Encoding them
 * with orjson on the caller's thread only moved that time to the caller.  Made here,
 * emit took 591 ns an event of the bench's mix, best of 30, against 662 for a Python
 * function taking the same keywords and doing nothing, and the writer only writes
 * (bench/README.md).  Called through vectorcall, emit gets the keywords' names and
 * values as arrays, with no dict of its own.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <structmember.h>

#include "_emit_json.h"
#include "_emit_wait.h"
#include "_emit_lines.h"

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *put;
    PyObject *qsize;
    PyObject *capacity;
    PyObject *now;
    PyObject *on_full;
    PyObject *rename;
    PyObject *run_id;
    /* The line mode (buffer NULL: event dicts are queued): see emit_line. */
    LineBuffer *buffer;
    PyObject *slow;
    PyObject *run_id_json;
    Py_ssize_t limit;
    Buf line;       /* where emit makes a line before it goes into the buffer */
    int making;     /* line is in use (an emit from a finalizer that ran meanwhile: not) */
} Emitter;

static PyObject *key_time, *key_run_id, *key_event; /* interned, made at import */

/* The fields as a dict of their own, for rename (rare: a reserved field name). */
static PyObject *fields_dict(PyObject *const *values, PyObject *kwnames)
{
    PyObject *fields = PyDict_New();
    if (fields == NULL)
        return NULL;
    Py_ssize_t n = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyDict_SetItem(fields, PyTuple_GET_ITEM(kwnames, i), values[i]) < 0) {
            Py_DECREF(fields);
            return NULL;
        }
    }
    return fields;
}

/* The event dict the closure makes: the time, the run, the name, the fields in order; a
 * field named t, run_id or event handed to rename. */
static PyObject *event_dict(Emitter *self, PyObject *t, PyObject *name, PyObject *const *values,
                            PyObject *kwnames)
{
    Py_ssize_t n = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    PyObject *event = PyDict_New();
    if (event == NULL)
        return NULL;
    if (PyDict_SetItem(event, key_time, t) < 0 || PyDict_SetItem(event, key_run_id, self->run_id) < 0
        || PyDict_SetItem(event, key_event, name) < 0)
        goto error;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyDict_SetItem(event, PyTuple_GET_ITEM(kwnames, i), values[i]) < 0)
            goto error;
    }
    if (PyDict_GET_SIZE(event) != n + 3) { /* a field named t, run_id or event */
        PyObject *fields = fields_dict(values, kwnames);
        if (fields == NULL)
            goto error;
        Py_SETREF(event, PyObject_CallFunctionObjArgs(self->rename, t, name, fields, NULL));
        Py_DECREF(fields);
    }
    return event;
error:
    Py_DECREF(event);
    return NULL;
}

static int has_room(Emitter *self, Py_ssize_t held)
{
    PyObject *size = held >= 0 ? PyLong_FromSsize_t(held) : PyObject_CallNoArgs(self->qsize);
    if (size == NULL)
        return -1;
    int room = PyObject_RichCompareBool(size, self->capacity, Py_LT); /* as the closure: any number */
    Py_DECREF(size);
    return room;
}

/* Line mode: the event's line appended to the buffer, made here (json_line) where it can
 * be, else by slow(event), the log's own rule, from the event dict with the time to the
 * microsecond; the writer woken if it waits for a line. */
static PyObject *emit_line(Emitter *self, PyObject *name, PyObject *const *values,
                           PyObject *kwnames)
{
    LineBuffer *lb = self->buffer;
    int room = has_room(self, LOAD(lb->lines) + LOAD(lb->taken));
    if (room <= 0)
        return room < 0 ? NULL : PyObject_CallNoArgs(self->on_full);
    PyObject *t = PyObject_CallNoArgs(self->now);
    if (t == NULL)
        return NULL;
    double seconds = PyFloat_AsDouble(t);
    if (seconds == -1.0 && PyErr_Occurred()) {
        Py_DECREF(t);
        return NULL;
    }
    /* Below 2**33 s (the year 2242) a microsecond is a float's whole digits. */
    int in_range = isfinite(seconds) && seconds >= 0 && seconds < 8589934592.0;
    long long micros = in_range ? llround(seconds * 1e6) : 0;
    in_range = in_range && (micros == 0 || micros >= 100); /* below 1e-4 s repr has an exponent */
    double stamp = in_range ? (double)micros / 1e6 : seconds;
    /* Made in a buffer of the emitter's own, then copied in under the buffer's mutex, so
     * that no Python code runs under it (an exception made here may collect garbage, whose
     * finalizers may emit: such an emit makes its line in a buffer of its own). */
    Buf fresh = {NULL, 0, 0};
    int mine = !self->making;
    Buf *made = mine ? &self->line : &fresh;
    self->making = 1;
    made->len = 0;
    int done = in_range ? json_line(made, micros, self->run_id_json, name, values, kwnames,
                                    self->limit)
                        : 0;
    if (done > 0 && lines_put(lb, made->data, made->len, stamp) < 0)
        done = -1;
    if (mine) {
        self->making = 0;
        if (self->line.cap > (1 << 20)) { /* a huge line's buffer is not kept */
            PyMem_RawFree(self->line.data);
            self->line = (Buf){NULL, 0, 0};
        }
    }
    else
        PyMem_RawFree(fresh.data);
    if (done != 0) {
        Py_DECREF(t);
        return done < 0 ? NULL : Py_NewRef(Py_None);
    }
    /* The log's rule, in Python. */
    if (PyErr_Occurred()) { /* a string or number this writer does not take */
        if (!PyErr_ExceptionMatches(PyExc_Exception) || PyErr_ExceptionMatches(PyExc_MemoryError)) {
            Py_DECREF(t);
            return NULL;
        }
        PyErr_Clear();
    }
    if (in_range)
        Py_SETREF(t, PyFloat_FromDouble(stamp));
    if (t == NULL)
        return NULL;
    PyObject *event = event_dict(self, t, name, values, kwnames);
    Py_DECREF(t);
    if (event == NULL)
        return NULL;
    PyObject *line = PyObject_CallOneArg(self->slow, event);
    Py_DECREF(event);
    if (line == NULL)
        return NULL;
    if (!PyBytes_Check(line)) {
        Py_DECREF(line);
        PyErr_SetString(PyExc_TypeError, "emit: the log's rule made no bytes");
        return NULL;
    }
    int failed = lines_put(lb, PyBytes_AS_STRING(line), PyBytes_GET_SIZE(line), stamp);
    Py_DECREF(line);
    if (failed)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *emitter_call(PyObject *callable, PyObject *const *args, size_t nargsf,
                              PyObject *kwnames)
{
    Emitter *self = (Emitter *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 1) {
        if (nargs == 0)
            PyErr_SetString(PyExc_TypeError,
                            "emit() missing 1 required positional argument: 'name'");
        else
            PyErr_Format(PyExc_TypeError,
                         "emit() takes 1 positional argument but %zd were given", nargs);
        return NULL;
    }
    if (self->now == NULL) { /* cleared by the garbage collector while being torn down */
        PyErr_SetString(PyExc_RuntimeError, "emit() of a pipeline being torn down");
        return NULL;
    }
    if (self->buffer != NULL)
        return emit_line(self, args[0], args + 1, kwnames);
    PyObject *t = PyObject_CallNoArgs(self->now);
    if (t == NULL)
        return NULL;
    PyObject *event = event_dict(self, t, args[0], args + 1, kwnames);
    Py_DECREF(t);
    if (event == NULL)
        return NULL;
    int room = has_room(self, -1);
    if (room < 0) {
        Py_DECREF(event);
        return NULL;
    }
    PyObject *done = room ? PyObject_CallOneArg(self->put, event) : PyObject_CallNoArgs(self->on_full);
    Py_DECREF(event);
    if (done == NULL)
        return NULL;
    Py_DECREF(done);
    Py_RETURN_NONE;
}

static PyObject *emitter_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"put", "qsize", "capacity", "now", "on_full", "rename", "run_id",
                            "buffer", "slow", "limit", NULL};
    PyObject *put, *qsize, *capacity, *now, *on_full, *rename, *run_id;
    PyObject *buffer = Py_None, *slow = Py_None;
    Py_ssize_t limit = PY_SSIZE_T_MAX;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOO|$OOn:Emitter", names, &put, &qsize,
                                     &capacity, &now, &on_full, &rename, &run_id, &buffer,
                                     &slow, &limit))
        return NULL;
    PyObject *run_id_json = NULL;
    if (buffer != Py_None) {
        if (!PyObject_TypeCheck(buffer, &LineBufferType) || !PyCallable_Check(slow)
            || !PyUnicode_CheckExact(run_id)) {
            PyErr_SetString(PyExc_TypeError,
                            "Emitter: a LineBuffer comes with a callable slow and a str run_id");
            return NULL;
        }
        Buf b = {NULL, 0, 0};
        int done = put_string(&b, run_id, PY_SSIZE_T_MAX);
        if (done > 0)
            run_id_json = PyBytes_FromStringAndSize(b.data, b.len);
        PyMem_RawFree(b.data);
        if (run_id_json == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "Emitter: a run_id JSON cannot hold");
            return NULL;
        }
    }
    Emitter *self = (Emitter *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_XDECREF(run_id_json);
        return NULL;
    }
    self->vectorcall = emitter_call;
    self->capacity = Py_NewRef(capacity);
    self->put = Py_NewRef(put);
    self->qsize = Py_NewRef(qsize);
    self->now = Py_NewRef(now);
    self->on_full = Py_NewRef(on_full);
    self->rename = Py_NewRef(rename);
    self->run_id = Py_NewRef(run_id);
    if (buffer != Py_None) {
        self->buffer = (LineBuffer *)Py_NewRef(buffer);
        self->slow = Py_NewRef(slow);
        self->run_id_json = run_id_json;
    }
    self->limit = limit;
    return (PyObject *)self;
}

static int emitter_traverse(Emitter *self, visitproc visit, void *arg)
{
    Py_VISIT(self->put);
    Py_VISIT(self->qsize);
    Py_VISIT(self->capacity);
    Py_VISIT(self->now);
    Py_VISIT(self->on_full);
    Py_VISIT(self->rename);
    Py_VISIT(self->run_id);
    Py_VISIT(self->buffer);
    Py_VISIT(self->slow);
    return 0;
}

static int emitter_clear(Emitter *self)
{
    Py_CLEAR(self->put);
    Py_CLEAR(self->qsize);
    Py_CLEAR(self->capacity);
    Py_CLEAR(self->now);
    Py_CLEAR(self->on_full);
    Py_CLEAR(self->rename);
    Py_CLEAR(self->run_id);
    Py_CLEAR(self->buffer);
    Py_CLEAR(self->slow);
    Py_CLEAR(self->run_id_json);
    return 0;
}

static void emitter_dealloc(Emitter *self)
{
    PyObject_GC_UnTrack(self);
    emitter_clear(self);
    PyMem_RawFree(self->line.data);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef emitter_members[] = {
    {"capacity", T_OBJECT, offsetof(Emitter, capacity), READONLY,
     "Events the queue holds before emit drops (and counts) them."},
    {"run_id", T_OBJECT, offsetof(Emitter, run_id), READONLY, "The run_id every event gets."},
    {"buffer", T_OBJECT, offsetof(Emitter, buffer), READONLY,
     "The LineBuffer each event's line is appended to; None: event dicts are queued."},
    {NULL},
};

static PyTypeObject EmitterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "otel_rollout._emit.Emitter",
    .tp_basicsize = sizeof(Emitter),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "emit(name, /, **fields): stamp the event and enqueue it, or count a drop.",
    .tp_new = emitter_new,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Emitter, vectorcall),
    .tp_traverse = (traverseproc)emitter_traverse,
    .tp_clear = (inquiry)emitter_clear,
    .tp_dealloc = (destructor)emitter_dealloc,
    .tp_members = emitter_members,
};

static PyMethodDef module_methods[] = {
    {"write_whole", (PyCFunction)write_whole, METH_VARARGS,
     "write_whole(fd, data) -> (written, errno, deleted): all of data written, unless the"
     " file was deleted, in one release of the GIL (_emit_lines.h)."},
    {NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "otel_rollout._emit",
    "The caller's emit in C (see _pipeline.Pipeline.make_emit), its line buffer and the writer's waits.", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__emit(void)
{
    key_time = PyUnicode_InternFromString("t");
    key_run_id = PyUnicode_InternFromString("run_id");
    key_event = PyUnicode_InternFromString("event");
    if (key_time == NULL || key_run_id == NULL || key_event == NULL)
        return NULL;
    if (pthread_atfork(NULL, NULL, count_fork) != 0)
        return PyErr_Format(PyExc_OSError, "otel_rollout._emit: pthread_atfork failed");
    if (PyType_Ready(&EmitterType) < 0 || PyType_Ready(&LineBufferType) < 0
        || PyType_Ready(&WakerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Emitter", (PyObject *)&EmitterType) < 0
        || PyModule_AddObjectRef(m, "LineBuffer", (PyObject *)&LineBufferType) < 0
        || PyModule_AddObjectRef(m, "Waker", (PyObject *)&WakerType) < 0
        || PyModule_AddIntConstant(m, "DRAIN_ASKED", DRAIN_ASKED) < 0
        || PyModule_AddIntConstant(m, "DRAIN_REPORT", DRAIN_REPORT) < 0
        || PyModule_AddIntConstant(m, "DRAIN_URGENT", DRAIN_URGENT) < 0
        || PyModule_AddIntConstant(m, "DRAIN_FAILED", DRAIN_FAILED) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
