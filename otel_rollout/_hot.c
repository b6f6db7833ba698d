/* The commonest lines of a trace applied to the one pass's shared state in C.
 *
 * consume(chunk, pos, end, run_id, attempts, groups, epochs, group_type, kinds,
 *         watch_dispatch, watch_seal, trained, seals, waiting, histories, history_type,
 *         flight_counts, lanes)
 *     -> (pos, lines, cold_end, last_t, tokens)
 *
 * Most of a trace is attempt.dispatch, attempt.seal, group.reserve, group.admit and
 * group.seal lines (97% of the bench trace).  Through the Python path each one is decoded
 * into its struct by msgspec and handed to the handlers: ~2.8 us a line, most of a cost
 * pass.  consume() reads the whole lines of chunk[pos:end] from pos and applies each to
 * the shared state exactly as its handlers in analysis/state.py do (see analysis/hot.py
 * for when a pass may), until it meets a line it is not certain of:
 *
 *   - a line the schema's rules might refuse, or that is not in the writer's plain shape
 *     (a key it does not know, a duplicate key, a null, an escape or a non-ASCII byte in
 *     a string, an integer past 15 digits, a float where an integer is due, ...);
 *   - another kind, or a kind not in kinds (1: attempt.dispatch, 2: attempt.seal,
 *     4: group.reserve, 8: group.admit, 16: group.seal);
 *   - a line of another run than run_id (a new run, a forked child: the engine decides);
 *   - a dispatch whose rollout key is in a set of watch_dispatch, a seal whose attempt
 *     is not in flight, whose group is not in flight, or whose key is in a set of
 *     watch_seal, a reserve of a group in flight, a group seal of a group not in flight
 *     or in `trained`, or naming more tokens than its attempts sealed while `waiting`
 *     (finished work to carry) is not empty (an analysis, or the state's Python handler,
 *     must see it); with histories kept, a seal of a group whose sealed attempts are
 *     held in a list (a count past 64 bits) or of an attempt whose start is no float.
 *
 * Where the pass keeps them (not None), the state's optional records change as its
 * Python handlers change them: every group's history (histories: History records,
 * analysis/history.py) and every change of the count of attempts in flight
 * (flight_counts: packed records.FLIGHT_COUNT points).  Where `lanes` is the timeline (not
 * None), each hot line it handles is drawn as its handlers draw it (_hot_lanes.h), or
 * left to the Python path.
 *
 * A line left to the Python path goes with every line after it up to the next line
 * that reads as a hot line, or up to and with the first line of another run:
 * chunk[pos:cold_end] (at least one line, unless pos == end).
 * The caller decodes those (reporting any problem with its line number), hands them to
 * the engine, and calls consume() again from cold_end.  So the state sees every event in
 * file order, and a line the C side takes is one the Python path would have taken the
 * same way: a hypothesis test runs both paths over hostile files and compares results.
 *
 * Returned: the position after the lines applied, how many they were, the end of the
 * cold lines after them, the latest t among them (-inf for none) and their seals' tokens.
 *
 * The module's parts: _hot_line.h and _hot_number.h read a line; _hot_apply.h applies it
 * to the state as its handlers would (_hot_history.h: the groups' histories);
 * _hot_lanes.h draws it on the timeline's lanes.  One fold runs once a step, outside
 * consume: fold_flight_counts (_hot_fold.h, the report's in-flight buckets).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_hot_apply.h"
#include "_hot_fold.h"
#include "_hot_line.h"
#include "_hot_lanes.h"

static PyObject *consume(PyObject *self, PyObject *args)
{
    Py_buffer chunk;
    Py_ssize_t pos, end;
    PyObject *run_id, *attempts, *groups, *epochs, *group_type, *watch_dispatch, *watch_seal;
    PyObject *trained, *seals, *waiting, *counts;
    Histories h;
    Lanes lanes = {0};
    FlightCounts flight;
    flight.held = 0;
    int kinds;
    if (!PyArg_ParseTuple(args, "y*nnUO!O!O!OiO!O!O!O!O!OOOO", &chunk, &pos, &end, &run_id,
                          &PyDict_Type, &attempts, &PyDict_Type, &groups, &PyDict_Type,
                          &epochs, &group_type, &kinds, &PyTuple_Type, &watch_dispatch,
                          &PyTuple_Type, &watch_seal, &PySet_Type, &trained, &PyDict_Type,
                          &seals, &PyDict_Type, &waiting, &h.histories, &h.history_type,
                          &counts, &lanes.source))
        return NULL;
    PyObject *result = NULL;
    if (pos < 0 || end > chunk.len || pos > end) {
        PyErr_SetString(PyExc_ValueError, "consume: pos and end must lie within chunk");
        goto done;
    }
    if (h.histories != Py_None && !PyDict_Check(h.histories)) {
        PyErr_SetString(PyExc_TypeError, "consume: histories must be a dict or None");
        goto done;
    }
    if (counts != Py_None && !PyByteArray_CheckExact(counts)) {
        PyErr_SetString(PyExc_TypeError, "consume: flight_counts must be a bytearray or None");
        goto done;
    }
    Py_ssize_t run_length;
    const char *run = PyUnicode_AsUTF8AndSize(run_id, &run_length);
    if (run == NULL)
        goto done;
    flight.counts = counts;
    const char *base = chunk.buf, *p = base + pos, *stop = base + end;
    if (!plain(run, run_length))
        kinds = 0; /* every line to the Python path */
    Py_ssize_t lines = 0;
    long long tokens = 0;
    double last_t = -INFINITY;
    Line line;
    line.other_run = 0;
    int kind_of_stop = 0; /* the kind of the line the loop stopped at (0: none it reads) */
    while (p < stop) {
        const char *newline = memchr(p, '\n', stop - p);
        const char *line_end = newline != NULL ? newline : stop;
        int kind = read_line(p, line_end, kinds, run, run_length, &line);
        kind_of_stop = kind;
        if (kind == 0)
            break;
        if (lanes.source != Py_None && kind != KIND_ADMIT) {
            int may = lanes_may(&lanes, &line, kind);
            if (may < 0)
                goto done;
            if (may == 0)
                break;
        }
        int applied;
        switch (kind) {
        case KIND_DISPATCH:
            applied = dispatch(&line, run_id, attempts, epochs, watch_dispatch);
            break;
        case KIND_SEAL: applied = seal(&line, run_id, attempts, groups, watch_seal, &h); break;
        case KIND_RESERVE:
            applied = reserve(&line, run_id, groups, epochs, group_type, &h);
            break;
        case KIND_GROUP_SEAL: applied = group_seal(&line, groups, trained, seals, waiting); break;
        default: applied = 1; /* group.admit: the pass reads nothing of it */
        }
        if (applied < 0)
            goto done;
        if (applied == 0)
            break;
        if (lanes.source != Py_None && kind != KIND_ADMIT && lanes_draw(&lanes, &line, kind) < 0)
            goto done;
        if (kind == KIND_SEAL)
            tokens += line.tokens;
        if ((kind == KIND_DISPATCH || kind == KIND_SEAL) && counts != Py_None &&
            count_flight(&flight, line.t, PyDict_GET_SIZE(attempts)) < 0)
            goto done;
        if (line.t > last_t)
            last_t = line.t;
        lines++;
        p = newline != NULL ? newline + 1 : stop;
    }
    /* The cold lines: this one, and those after it up to the next that reads as a hot
     * line (another kind stops the read at its "event"; a file whose every line carries an
     * extra field is then one cold run, not one a line), or up to and with the first line
     * of another run: it may begin a new run, whose lines are hot once the engine has
     * begun it (the run's lines would be read as another's to the block's end). */
    const char *cold = p;
    if (cold < stop) {
        const char *newline = memchr(cold, '\n', stop - cold);
        cold = newline != NULL ? newline + 1 : stop;
        int switched = kind_of_stop == 0 && line.other_run;
        while (cold < stop && !switched) {
            newline = memchr(cold, '\n', stop - cold);
            const char *line_end = newline != NULL ? newline : stop;
            if (read_line(cold, line_end, kinds, run, run_length, &line) != 0)
                break;
            cold = newline != NULL ? newline + 1 : stop;
            switched = line.other_run;
        }
    }
    if (lanes_store(&lanes) < 0 || flight_flush(&flight) < 0)
        goto done;
    result = Py_BuildValue("nnndL", (Py_ssize_t)(p - base), lines, (Py_ssize_t)(cold - base),
                           last_t, tokens);
done:
    lanes_release(&lanes);
    PyBuffer_Release(&chunk);
    return result;
}

static PyMethodDef methods[] = {
    {"consume", consume, METH_VARARGS,
     "consume(chunk, pos, end, run_id, attempts, groups, epochs, group_type, kinds, "
     "watch_dispatch, watch_seal, trained, seals, waiting, histories, history_type, "
     "flight_counts, lanes) -> (pos, lines, cold_end, last_t, tokens): see analysis/hot.py."},
    {"fold_flight_counts", fold_flight_counts, METH_VARARGS,
     "fold_flight_counts(counts, buckets, geometry, points) -> None: see _hot_fold.h."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "otel_rollout._hot",
    "The commonest lines applied to the pass's shared state in C (see analysis/hot.py).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__hot(void)
{
    if (apply_init() < 0 || lanes_init() < 0)
        return NULL;
    return PyModule_Create(&module);
}
