/* The timeline's engine lanes, drawn for the commonest lines in C (see _hot.c).
 *
 * A pass that writes the timeline hands consume() the Timeline (its hot_* methods), and
 * each line of attempt.dispatch, attempt.seal, group.reserve and group.seal the compiled
 * path applies to the state is drawn here as the Timeline's handlers draw it
 * (timeline/analysis.py, timeline/lanes.py):
 *
 *   - every such line first brings the counters up to its time once it reaches the due
 *     time (sampled here once the run's counters have begun; their first sample is
 *     hot_tick's);
 *   - a dispatch takes the lowest free lane (heapq, or hot_lane for a new one) and goes in
 *     flight: (t, lane, weight_version, refit_count, None, group_id);
 *   - a seal of an attempt in flight that no refit touched, in a run drawn whole, ends its
 *     flight, frees its lane and is one slice, written as msgspec writes the Slice struct;
 *   - a reservation of a group not yet drawn counts it as generating, a group seal as
 *     sealed.
 *
 * What the handlers would do otherwise is left to the Python path (lanes_may says 0 before
 * the state is changed): a run whose weight version is not known yet, an attempt
 * dispatched again while in flight, a seal that ends in segments (refits, a cut window,
 * a resumed attempt) or of an attempt not in flight.  The view's numbers are read once a
 * call (hot_sync) and handed back (hot_store) before any of the Timeline's code runs
 * (hot_tick, hot_lane) and at the end of the call.
 */
#ifndef OTEL_ROLLOUT_HOT_LANES_H
#define OTEL_ROLLOUT_HOT_LANES_H

#include <Python.h>
#include <string.h>

#include "_hot_line.h"

static PyObject *HEAPPUSH, *HEAPPOP, *RAW, *SYNC_NAME, *LANE_NAME;

/* Trace-event colour names by weight version, as trace_events.PALETTE. */
static const char *const PALETTE[] = {
    "rail_response", "rail_load", "rail_idle", "rail_animation",
    "cq_build_passed", "heap_dump_child_node_arrow", "olive", "startup",
};
#define LANE_TID0 2

typedef struct {
    PyObject *source; /* the Timeline, or Py_None */
    int state;        /* 0: not read this call; 1: its run is drawn; -1: not drawn */
    PyObject *view;   /* hot_sync's tuple (holds what is borrowed below) */
    PyObject *id;     /* the line's attempt_id, from lanes_may to lanes_draw */
    PyObject *flight, *free, *groups, *buf, *flush;
    long long pid, refit_count, chunk, generating, sealed, fast;
    int whole, version_known, dirty, opened;
    double t0, due, changed_at, end, resolution;
} Lanes;

static int lanes_init(void)
{
    PyObject *heapq = PyImport_ImportModule("heapq");
    PyObject *msgspec = heapq != NULL ? PyImport_ImportModule("msgspec") : NULL;
    if (msgspec != NULL) {
        HEAPPUSH = PyObject_GetAttrString(heapq, "heappush");
        HEAPPOP = PyObject_GetAttrString(heapq, "heappop");
        RAW = PyObject_GetAttrString(msgspec, "Raw");
    }
    Py_XDECREF(heapq);
    Py_XDECREF(msgspec);
    SYNC_NAME = PyUnicode_InternFromString("hot_sync");
    LANE_NAME = PyUnicode_InternFromString("hot_lane");
    return HEAPPUSH != NULL && HEAPPOP != NULL && RAW != NULL && SYNC_NAME != NULL &&
                   LANE_NAME != NULL
               ? 0
               : -1;
}

static int as_long(PyObject *value, long long *out)
{
    if (!PyLong_Check(value))
        return 0;
    int overflow;
    *out = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (*out == -1 && PyErr_Occurred())
        return -1;
    return !overflow;
}

/* hot_sync's tuple, item by item (CompiledLanes.hot_sync builds it in this order). */
enum {
    V_FLIGHT,
    V_FREE,
    V_GROUPS,
    V_PID,
    V_WHOLE,
    V_VERSION_KNOWN,
    V_REFIT_COUNT,
    V_T0,
    V_DUE,
    V_DIRTY,
    V_CHANGED_AT,
    V_GENERATING,
    V_SEALED,
    V_BUFFER,
    V_CHUNK,
    V_FLUSH,
    V_OPENED,
    V_END,
    V_RESOLUTION,
    V_ITEMS
};

/* hot_sync: the view of the state's run.  -1 on error. */
static int lanes_sync(Lanes *l)
{
    PyObject *view = PyObject_CallMethodNoArgs(l->source, SYNC_NAME);
    if (view == NULL)
        return -1;
    if (view == Py_None) {
        Py_DECREF(view);
        l->state = -1;
        return 0;
    }
    if (!PyTuple_CheckExact(view) || PyTuple_GET_SIZE(view) != V_ITEMS) {
        Py_DECREF(view);
        PyErr_SetString(PyExc_TypeError, "hot_sync must give a tuple of V_ITEMS or None");
        return -1;
    }
    PyObject **v = &PyTuple_GET_ITEM(view, 0);
    l->flight = v[V_FLIGHT], l->free = v[V_FREE], l->groups = v[V_GROUPS];
    l->buf = v[V_BUFFER], l->flush = v[V_FLUSH];
    if (!PyDict_CheckExact(l->flight) || !PyList_CheckExact(l->free) ||
        !PyDict_CheckExact(l->groups) || !PyList_CheckExact(l->buf)) {
        Py_DECREF(view);
        PyErr_SetString(PyExc_TypeError, "hot_sync: flight, free, groups or buffer mistyped");
        return -1;
    }
    int ok = as_long(v[V_PID], &l->pid) > 0 &&
             as_long(v[V_REFIT_COUNT], &l->refit_count) > 0 &&
             as_long(v[V_GENERATING], &l->generating) > 0 &&
             as_long(v[V_SEALED], &l->sealed) > 0 && as_long(v[V_CHUNK], &l->chunk) > 0;
    if (ok) { /* (nothing more is called once an error is set) */
        l->whole = PyObject_IsTrue(v[V_WHOLE]);
        l->version_known = PyObject_IsTrue(v[V_VERSION_KNOWN]);
        l->dirty = PyObject_IsTrue(v[V_DIRTY]);
        l->opened = PyObject_IsTrue(v[V_OPENED]);
        ok = l->whole >= 0 && l->version_known >= 0 && l->dirty >= 0 && l->opened >= 0;
    }
    if (ok) {
        l->t0 = PyFloat_AsDouble(v[V_T0]);
        l->due = PyFloat_AsDouble(v[V_DUE]);
        l->changed_at = PyFloat_AsDouble(v[V_CHANGED_AT]);
        l->end = PyFloat_AsDouble(v[V_END]);
        l->resolution = PyFloat_AsDouble(v[V_RESOLUTION]);
    }
    if (!ok || PyErr_Occurred()) {
        Py_DECREF(view);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "hot_sync: a number out of range");
        return -1;
    }
    Py_XSETREF(l->view, view);
    l->fast = 0;
    l->state = 1;
    return 0;
}

/* hot_store: the numbers changed here, back to the Timeline.  -1 on error. */
static int lanes_store(Lanes *l)
{
    if (l->state != 1)
        return 0;
    PyObject *r = PyObject_CallMethod(l->source, "hot_store", "dOdLLL", l->due,
                                      l->dirty ? Py_True : Py_False, l->changed_at,
                                      l->generating, l->sealed, l->fast);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    l->fast = 0;
    return 0;
}

static void lanes_release(Lanes *l)
{
    Py_CLEAR(l->view);
    Py_CLEAR(l->id);
}

/* 1 if the Timeline's handler of this hot line is drawn here (or its run is not drawn),
 * 0 if the line must go to the Python path, -1 on error.  Changes nothing. */
static int lanes_may(Lanes *l, const Line *line, int kind)
{
    if (l->state == 0 && lanes_sync(l) < 0)
        return -1;
    if (l->state < 0)
        return 1;
    if (kind == KIND_DISPATCH || kind == KIND_RESERVE) {
        if (!l->version_known)
            return 0; /* the first version of the run: the handler sets the counter */
        if (kind == KIND_RESERVE)
            return 1;
    }
    if (kind != KIND_DISPATCH && kind != KIND_SEAL)
        return 1;
    Py_XSETREF(l->id, ascii(line->attempt_id));
    if (l->id == NULL)
        return -1;
    PyObject *record = PyDict_GetItemWithError(l->flight, l->id);
    if (record == NULL && PyErr_Occurred())
        return -1;
    if (kind == KIND_DISPATCH)
        return record == NULL; /* dispatched again while in flight: its first one ends */
    long long lane, version, seen;
    if (record == NULL || !l->whole || !PyTuple_CheckExact(record) ||
        PyTuple_GET_SIZE(record) != 6 || !PyFloat_CheckExact(PyTuple_GET_ITEM(record, 0)) ||
        PyTuple_GET_ITEM(record, 4) != Py_None)
        return 0;
    int ok = as_long(PyTuple_GET_ITEM(record, 1), &lane);
    if (ok > 0)
        ok = as_long(PyTuple_GET_ITEM(record, 2), &version);
    if (ok > 0)
        ok = as_long(PyTuple_GET_ITEM(record, 3), &seen);
    if (ok <= 0)
        return ok;
    return seen == l->refit_count && version >= 0 && lane >= 0 && lane < (1LL << 40);
}

static long long micros(double seconds)
{
    if (seconds < -1e12)
        seconds = -1e12;
    else if (seconds > 1e12)
        seconds = 1e12;
    return (long long)(seconds * 1e6);
}

/* A raw trace event (JSON text) into the writer's buffer, flushed at its chunk. */
static int lanes_add(Lanes *l, const char *text, Py_ssize_t n)
{
    PyObject *bytes = PyBytes_FromStringAndSize(text, n);
    if (bytes == NULL)
        return -1;
    PyObject *raw = PyObject_CallOneArg(RAW, bytes);
    Py_DECREF(bytes);
    if (raw == NULL || PyList_Append(l->buf, raw) < 0) {
        Py_XDECREF(raw);
        return -1;
    }
    Py_DECREF(raw);
    if (PyList_GET_SIZE(l->buf) >= l->chunk) {
        PyObject *r = PyObject_CallNoArgs(l->flush);
        if (r == NULL)
            return -1;
        Py_DECREF(r);
    }
    return 0;
}

/* Text appended at *p (the caller leaves room for it). */
static inline char *put(char *p, const char *text, size_t n)
{
    memcpy(p, text, n);
    return p + n;
}
#define PUT(p, literal) put((p), (literal), sizeof(literal) - 1)

/* A whole number as msgspec writes it. */
static char *put_int(char *p, long long value)
{
    char digits[24];
    int n = 0;
    unsigned long long v = value < 0 ? 0ULL - (unsigned long long)value : (unsigned long long)value;
    do {
        digits[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    if (value < 0)
        *p++ = '-';
    while (n)
        *p++ = digits[--n];
    return p;
}

/* A sealed attempt's slice, as msgspec encodes trace_events.Slice (the IDs are plain
 * ASCII with nothing to escape: read_string takes no other). */
static int lanes_slice(Lanes *l, const Line *line, double start, long long lane,
                       long long version)
{
    long long ts = micros(start - l->t0), end = micros(line->t - l->t0);
    const char *colour = PALETTE[version % 8];
    /* 154 bytes of keys and punctuation, 26 of the longest colour, 7 integers of at most 20
     * characters each (a sign and 19 digits): 320 bytes past the two IDs. */
    Py_ssize_t most = 320 + line->attempt_id.n + line->group_id.n;
    char stack[512];
    char *text = most <= (Py_ssize_t)sizeof stack ? stack : PyMem_Malloc((size_t)most);
    if (text == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    char *p = text;
    p = PUT(p, "{\"ph\":\"X\",\"name\":\"v");
    p = put_int(p, version);
    p = PUT(p, "\",\"cat\":\"attempt\",\"ts\":");
    p = put_int(p, ts);
    p = PUT(p, ",\"dur\":");
    p = put_int(p, end > ts ? end - ts : 0);
    p = PUT(p, ",\"pid\":");
    p = put_int(p, l->pid);
    p = PUT(p, ",\"tid\":");
    p = put_int(p, LANE_TID0 + lane);
    p = PUT(p, ",\"cname\":\"");
    p = put(p, colour, strlen(colour));
    p = PUT(p, "\",\"args\":{\"attempt_id\":\"");
    p = put(p, line->attempt_id.p, (size_t)line->attempt_id.n);
    p = PUT(p, "\",\"group_id\":\"");
    p = put(p, line->group_id.p, (size_t)line->group_id.n);
    p = PUT(p, "\",\"outcome\":\"sealed\",\"tokens\":");
    p = put_int(p, line->tokens);
    p = PUT(p, ",\"version\":");
    p = put_int(p, version);
    p = PUT(p, "}}");
    int result = lanes_add(l, text, p - text);
    if (text != stack)
        PyMem_Free(text);
    if (result == 0)
        l->fast++;
    return result;
}

/* Timeline._counters: the attempts and groups in flight at t (each line 140 bytes at
 * most: 70 of text, four integers of at most 20 characters). */
static int lanes_counters(Lanes *l, double t)
{
    char text[160], *p = text;
    long long ts = micros(t - l->t0);
    p = PUT(p, "{\"ph\":\"C\",\"name\":\"attempts in flight\",\"ts\":");
    p = put_int(p, ts);
    p = PUT(p, ",\"pid\":");
    p = put_int(p, l->pid);
    p = PUT(p, ",\"tid\":0,\"args\":{\"attempts\":");
    p = put_int(p, (long long)PyDict_GET_SIZE(l->flight));
    p = PUT(p, "}}");
    if (lanes_add(l, text, p - text) < 0)
        return -1;
    p = text;
    p = PUT(p, "{\"ph\":\"C\",\"name\":\"groups in flight\",\"ts\":");
    p = put_int(p, ts);
    p = PUT(p, ",\"pid\":");
    p = put_int(p, l->pid);
    p = PUT(p, ",\"tid\":0,\"args\":{\"generating\":");
    p = put_int(p, l->generating);
    p = PUT(p, ",\"sealed\":");
    p = put_int(p, l->sealed);
    p = PUT(p, "}}");
    return lanes_add(l, text, p - text);
}

/* Timeline._tick, once t reached the due time: a run whose counters have begun samples
 * the last change here; the first sample of a run is the Timeline's (hot_tick). */
static int lanes_tick(Lanes *l, double t)
{
    if (l->opened) {
        if (l->dirty && l->changed_at <= l->end) {
            if (lanes_counters(l, l->changed_at) < 0)
                return -1;
            l->dirty = 0;
        }
        l->due = t <= l->end ? t + l->resolution : INFINITY;
        return 0;
    }
    if (lanes_store(l) < 0)
        return -1;
    PyObject *r = PyObject_CallMethod(l->source, "hot_tick", "d", t);
    if (r == NULL)
        return -1;
    int ok = PyTuple_CheckExact(r) && PyTuple_GET_SIZE(r) == 3;
    if (ok) {
        l->due = PyFloat_AsDouble(PyTuple_GET_ITEM(r, 0));
        l->dirty = PyObject_IsTrue(PyTuple_GET_ITEM(r, 1));
        l->opened = PyObject_IsTrue(PyTuple_GET_ITEM(r, 2));
    }
    Py_DECREF(r);
    if (!ok || PyErr_Occurred() || l->dirty < 0 || l->opened < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "hot_tick must give (due, dirty, opened)");
        return -1;
    }
    return 0;
}

/* The Timeline's handler of a hot line the state took, drawn (lanes_may said 1). */
static int lanes_draw(Lanes *l, const Line *line, int kind)
{
    if (l->state != 1)
        return 0;
    if (line->t >= l->due && lanes_tick(l, line->t) < 0) /* Timeline._at */
        return -1;
    int result = -1;
    PyObject *id = NULL, *lane = NULL, *record = NULL, *group_id = NULL;
    switch (kind) {
    case KIND_DISPATCH: { /* EngineLanes.dispatch */
        Py_ssize_t free = PyList_GET_SIZE(l->free);
        if (free == 1) { /* a heap of one: its only lane (heappop, without the call) */
            lane = Py_NewRef(PyList_GET_ITEM(l->free, 0));
            if (PyList_SetSlice(l->free, 0, 1, NULL) < 0)
                goto done;
        } else if (free > 1) {
            lane = PyObject_CallOneArg(HEAPPOP, l->free);
        } else if (lanes_store(l) == 0) {
            lane = PyObject_CallMethodNoArgs(l->source, LANE_NAME);
        }
        if (lane == NULL)
            goto done;
        id = Py_XNewRef(l->id);
        group_id = ascii(line->group_id);
        record = PyTuple_New(6);
        if (id == NULL || group_id == NULL || record == NULL)
            goto done;
        PyObject *t = PyFloat_FromDouble(line->t);
        PyObject *version = PyLong_FromLongLong(line->weight_version);
        PyObject *seen = PyLong_FromLongLong(l->refit_count);
        PyTuple_SET_ITEM(record, 0, t);
        PyTuple_SET_ITEM(record, 1, Py_NewRef(lane));
        PyTuple_SET_ITEM(record, 2, version);
        PyTuple_SET_ITEM(record, 3, seen);
        PyTuple_SET_ITEM(record, 4, Py_NewRef(Py_None));
        PyTuple_SET_ITEM(record, 5, Py_NewRef(group_id));
        if (t == NULL || version == NULL || seen == NULL ||
            PyDict_SetItem(l->flight, id, record) < 0)
            goto done;
        l->dirty = 1;
        l->changed_at = line->t;
        break;
    }
    case KIND_SEAL: { /* EngineLanes.seal's one slice */
        id = Py_XNewRef(l->id);
        if (id == NULL)
            goto done;
        record = PyDict_GetItemWithError(l->flight, id);
        if (record == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_RuntimeError, "the attempt left the timeline's flight");
            goto done;
        }
        Py_INCREF(record);
        long long n, version;
        double start = PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(record, 0));
        lane = Py_NewRef(PyTuple_GET_ITEM(record, 1));
        if (as_long(lane, &n) <= 0 || as_long(PyTuple_GET_ITEM(record, 2), &version) <= 0 ||
            PyDict_DelItem(l->flight, id) < 0)
            goto done;
        if (PyList_GET_SIZE(l->free) == 0) { /* onto an empty heap (heappush, without the call) */
            if (PyList_Append(l->free, lane) < 0)
                goto done;
        } else {
            PyObject *r = PyObject_CallFunctionObjArgs(HEAPPUSH, l->free, lane, NULL);
            if (r == NULL)
                goto done;
            Py_DECREF(r);
        }
        if (lanes_slice(l, line, start, n, version) < 0)
            goto done;
        l->dirty = 1;
        l->changed_at = line->t;
        break;
    }
    case KIND_RESERVE: { /* Timeline._group_reserve */
        group_id = ascii(line->group_id);
        if (group_id == NULL)
            goto done;
        int held = PyDict_Contains(l->groups, group_id);
        if (held < 0 || (!held && PyDict_SetItem(l->groups, group_id, Py_False) < 0))
            goto done;
        if (!held) {
            l->generating++;
            l->dirty = 1;
            l->changed_at = line->t;
        }
        break;
    }
    case KIND_GROUP_SEAL: { /* Timeline._group_seal */
        group_id = ascii(line->group_id);
        if (group_id == NULL)
            goto done;
        PyObject *sealed = PyDict_GetItemWithError(l->groups, group_id);
        if (sealed == NULL && PyErr_Occurred())
            goto done;
        if (sealed != Py_True) {
            if (sealed == Py_False)
                l->generating--;
            l->sealed++;
            if (PyDict_SetItem(l->groups, group_id, Py_True) < 0)
                goto done;
            l->dirty = 1;
            l->changed_at = line->t;
        }
        break;
    }
    }
    result = 0;
done:
    Py_CLEAR(l->id);
    Py_XDECREF(id);
    Py_XDECREF(lane);
    Py_XDECREF(record);
    Py_XDECREF(group_id);
    return result;
}

#endif
