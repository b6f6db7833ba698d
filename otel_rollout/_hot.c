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
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_hot_age.h"
#include "_hot_fold.h"
#include "_hot_line.h"
#include "_hot_lanes.h"

static PyObject *ATTEMPTS_NAME, *RUN_ID_NAME, *SEALED_TOKENS_NAME, *ZERO;
static PyObject *RUN_NAME, *SEALED_NAME, *EPOCH_NAME, *PROMPT_ID_NAME, *RESERVED_NAME;
static PyObject *SYS_INTERN;

/* *text replaced by its interned string, as the Python path's sys.intern makes it (not
 * PyUnicode_InternInPlace: from Python 3.12 its strings are never freed, sys.intern's are
 * from 3.13).  -1 on error. */
static int intern(PyObject **text)
{
    PyObject *interned = PyObject_CallOneArg(SYS_INTERN, *text);
    if (interned == NULL)
        return -1;
    Py_SETREF(*text, interned);
    return 0;
}

/* The groups' histories a pass keeps (analysis/history.py), or histories == None. */
typedef struct {
    PyObject *histories, *history_type;
} Histories;

/* Milliseconds in flight from `start` to `t`, as History.seal rounds them: half to even
 * (as Python's round), spans past FAR_S (1e12 s) at that bound, none below zero. */
static long long flight_ms(double start, double t)
{
    double flight = t - start;
    if (!(flight > 0.0))
        return 0;
    if (flight >= 1e12)
        return 1000000000000000LL;
    return (long long)nearbyint(flight * 1000.0);
}

/* The group's history, made on first sight (its ID interned, as Histories.of does): a new
 * reference, or NULL on error. */
static PyObject *history_of(const Histories *h, PyObject *group_id, PyObject *run_id)
{
    PyObject *record = PyDict_GetItemWithError(h->histories, group_id);
    if (record != NULL)
        return Py_NewRef(record);
    if (PyErr_Occurred())
        return NULL;
    PyObject *key = Py_NewRef(group_id);
    if (intern(&key) < 0) {
        Py_DECREF(key);
        return NULL;
    }
    record = PyObject_CallOneArg(h->history_type, run_id);
    if (record != NULL && PyDict_SetItem(h->histories, key, record) < 0)
        Py_CLEAR(record);
    Py_DECREF(key);
    return record;
}

/* History.seal for an attempt in flight whose sealed attempts are packed bytes (or none
 * yet): 1 if it may be applied (*record set: a new reference, or NULL if the group has
 * none yet), 0 if the Python path must apply it, -1 on error. */
static int history_may_seal(const Histories *h, PyObject *group_id, PyObject **record)
{
    *record = Py_XNewRef(PyDict_GetItemWithError(h->histories, group_id));
    if (*record == NULL)
        return PyErr_Occurred() ? -1 : 1;
    PyObject *sealed = PyObject_GetAttr(*record, SEALED_NAME);
    if (sealed == NULL)
        return -1;
    int packed = sealed == Py_None || PyByteArray_CheckExact(sealed);
    Py_DECREF(sealed);
    return packed;
}

/* History.seal's changes, once history_may_seal allowed them. */
static int history_seal(const Histories *h, PyObject *record, PyObject *group_id,
                        PyObject *run_id, long long tokens, long long ms)
{
    int result = -1;
    PyObject *sealed = NULL;
    record = record != NULL ? Py_NewRef(record) : history_of(h, group_id, run_id);
    if (record == NULL || PyObject_SetAttr(record, RUN_NAME, run_id) < 0)
        goto done;
    sealed = PyObject_GetAttr(record, SEALED_NAME);
    if (sealed == NULL)
        goto done;
    if (sealed == Py_None) {
        Py_SETREF(sealed, PyByteArray_FromStringAndSize(NULL, 0));
        if (sealed == NULL || PyObject_SetAttr(record, SEALED_NAME, sealed) < 0)
            goto done;
    }
    Py_ssize_t size = PyByteArray_GET_SIZE(sealed);
    if (PyByteArray_Resize(sealed, size + 16) < 0)
        goto done;
    int64_t pair[2] = {(int64_t)tokens, (int64_t)ms};
    memcpy(PyByteArray_AS_STRING(sealed) + size, pair, sizeof pair);
    result = 0;
done:
    Py_XDECREF(record);
    Py_XDECREF(sealed);
    return result;
}

/* History.reserve: the group's latest reservation. */
static int history_reserve(const Histories *h, PyObject *group_id, PyObject *run_id,
                           PyObject *epoch, long long prompt_id, PyObject *t)
{
    PyObject *prompt = PyLong_FromLongLong(prompt_id);
    if (prompt == NULL)
        return -1;
    PyObject *record = history_of(h, group_id, run_id);
    int result = record == NULL || PyObject_SetAttr(record, RUN_NAME, run_id) < 0 ||
                         PyObject_SetAttr(record, EPOCH_NAME, epoch) < 0 ||
                         PyObject_SetAttr(record, PROMPT_ID_NAME, prompt) < 0 ||
                         PyObject_SetAttr(record, RESERVED_NAME, t) < 0
                     ? -1
                     : 0;
    Py_XDECREF(record);
    Py_DECREF(prompt);
    return result;
}


/* 1 if `key` is in one of `sets`, 0 if not, -1 on error.  An empty set (a cost pass's
 * rollouts to match, most of a file) is passed over without hashing the key. */
static int watched(PyObject *sets, PyObject *key)
{
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(sets); i++) {
        PyObject *set = PyTuple_GET_ITEM(sets, i);
        int found;
        if (PyAnySet_CheckExact(set))
            found = PySet_GET_SIZE(set) == 0 ? 0 : PySet_Contains(set, key);
        else
            found = PySequence_Contains(set, key);
        if (found != 0)
            return found;
    }
    return 0;
}

/* State._hot_dispatch: attempts[attempt_id] = (run_id, (epoch, prompt_id, index), t).
 * 1 applied, 0 left to the Python path, -1 on error. */
static int dispatch(const Line *line, PyObject *run_id, PyObject *attempts, PyObject *epochs,
                    PyObject *watch)
{
    PyObject *epoch = NULL, *prompt = NULL, *index = NULL, *key = NULL, *id = NULL;
    PyObject *t = NULL, *record = NULL;
    int result = -1;
    if (line->seen & BIT(K_EPOCH)) {
        epoch = PyLong_FromLongLong(line->epoch);
    } else {
        PyObject *group_id = ascii(line->group_id);
        if (group_id == NULL)
            goto done;
        epoch = PyDict_GetItemWithError(epochs, group_id);
        Py_DECREF(group_id);
        if (epoch == NULL && PyErr_Occurred())
            goto done;
        epoch = epoch != NULL ? Py_NewRef(epoch) : Py_NewRef(ZERO);
    }
    prompt = PyLong_FromLongLong(line->prompt_id);
    index = PyLong_FromLongLong(line->generation_index);
    if (epoch == NULL || prompt == NULL || index == NULL)
        goto done;
    key = PyTuple_Pack(3, epoch, prompt, index);
    if (key == NULL)
        goto done;
    int seen = watched(watch, key);
    if (seen != 0) {
        result = seen > 0 ? 0 : -1;
        goto done;
    }
    id = ascii(line->attempt_id);
    t = PyFloat_FromDouble(line->t);
    if (id == NULL || t == NULL)
        goto done;
    record = PyTuple_Pack(3, run_id, key, t);
    if (record == NULL || PyDict_SetItem(attempts, id, record) < 0)
        goto done;
    result = 1;
done:
    Py_XDECREF(epoch);
    Py_XDECREF(prompt);
    Py_XDECREF(index);
    Py_XDECREF(key);
    Py_XDECREF(id);
    Py_XDECREF(t);
    Py_XDECREF(record);
    return result;
}

/* State._hot_attempt_seal, for an attempt and a group both in flight:
 * group.attempts[key] += tokens, group.run_id = run_id, the attempt out of flight.
 * 1 applied, 0 left to the Python path, -1 on error. */
static int seal(const Line *line, PyObject *run_id, PyObject *attempts, PyObject *groups,
                PyObject *watch, const Histories *h)
{
    PyObject *id = ascii(line->attempt_id), *group_id = NULL, *key = NULL, *held = NULL;
    PyObject *tokens = NULL, *sum = NULL, *group = NULL, *record = NULL;
    long long ms = 0;
    int result = -1;
    if (id == NULL)
        goto done;
    PyObject *attempt = PyDict_GetItemWithError(attempts, id);
    if (attempt == NULL) {
        result = PyErr_Occurred() ? -1 : 0;
        goto done;
    }
    if (!PyTuple_CheckExact(attempt) || PyTuple_GET_SIZE(attempt) != 3) {
        result = 0;
        goto done;
    }
    key = Py_NewRef(PyTuple_GET_ITEM(attempt, 1));
    PyObject *start = PyTuple_GET_ITEM(attempt, 2); /* its dispatch's time */
    int timed = PyFloat_CheckExact(start);
    double started = timed ? PyFloat_AS_DOUBLE(start) : 0.0;
    group_id = ascii(line->group_id);
    if (group_id == NULL)
        goto done;
    group = Py_XNewRef(PyDict_GetItemWithError(groups, group_id));
    if (group == NULL) {
        result = PyErr_Occurred() ? -1 : 0;
        goto done;
    }
    int seen = watched(watch, key); /* an analysis's collection: may run any code */
    if (seen != 0) {
        result = seen > 0 ? 0 : -1;
        goto done;
    }
    held = PyObject_GetAttr(group, ATTEMPTS_NAME);
    if (held == NULL || !PyDict_CheckExact(held)) {
        result = held == NULL ? -1 : 0;
        goto done;
    }
    if (h->histories != Py_None) {
        int may = timed ? history_may_seal(h, group_id, &record) : 0;
        if (may <= 0) {
            result = may;
            goto done;
        }
        ms = flight_ms(started, line->t);
    }
    tokens = PyLong_FromLongLong(line->tokens);
    if (tokens == NULL)
        goto done;
    PyObject *before = PyDict_GetItemWithError(held, key);
    if (before == NULL && PyErr_Occurred())
        goto done;
    sum = before != NULL ? PyNumber_Add(before, tokens) : Py_NewRef(tokens);
    if (sum == NULL || PyDict_SetItem(held, key, sum) < 0 ||
        PyObject_SetAttr(group, RUN_ID_NAME, run_id) < 0)
        goto done;
    if (h->histories != Py_None && history_seal(h, record, group_id, run_id, line->tokens, ms) < 0)
        goto done;
    if (PyDict_DelItem(attempts, id) < 0) /* last: `attempt` is borrowed from it */
        goto done;
    result = 1;
done:
    Py_XDECREF(id);
    Py_XDECREF(group_id);
    Py_XDECREF(key);
    Py_XDECREF(held);
    Py_XDECREF(tokens);
    Py_XDECREF(sum);
    Py_XDECREF(group);
    Py_XDECREF(record);
    return result;
}

/* State._group_reserve, for a group not in flight (Cost's handler settles one reserved
 * again): groups[group_id] = Group(run_id, epoch or 0, t), and its epoch if given.
 * 1 applied, 0 left to the Python path, -1 on error. */
static int reserve(const Line *line, PyObject *run_id, PyObject *groups, PyObject *epochs,
                   PyObject *group_type, const Histories *h)
{
    PyObject *group_id = ascii(line->group_id), *epoch = NULL, *t = NULL, *group = NULL;
    int result = -1;
    if (group_id == NULL)
        goto done;
    int held = PyDict_Contains(groups, group_id);
    if (held != 0) {
        result = held > 0 ? 0 : -1;
        goto done;
    }
    epoch = PyLong_FromLongLong(line->seen & BIT(K_EPOCH) ? line->epoch : 0);
    t = PyFloat_FromDouble(line->t);
    if (epoch == NULL || t == NULL)
        goto done;
    group = PyObject_CallFunctionObjArgs(group_type, run_id, epoch, t, NULL);
    if (group == NULL || PyDict_SetItem(groups, group_id, group) < 0)
        goto done;
    if ((line->seen & BIT(K_EPOCH)) && PyDict_SetItem(epochs, group_id, epoch) < 0)
        goto done;
    if (h->histories != Py_None &&
        history_reserve(h, group_id, run_id, epoch, line->prompt_id, t) < 0)
        goto done;
    result = 1;
done:
    Py_XDECREF(group_id);
    Py_XDECREF(epoch);
    Py_XDECREF(t);
    Py_XDECREF(group);
    return result;
}

/* 1 if `tokens` is more than the group's sealed attempts hold (or that is not known here),
 * 0 if not, -1 on error. */
static int names_more(PyObject *group, long long tokens)
{
    PyObject *held = PyObject_GetAttr(group, ATTEMPTS_NAME);
    if (held == NULL)
        return -1;
    int more = 1;
    if (PyDict_CheckExact(held)) {
        Py_ssize_t at = 0;
        PyObject *key, *value;
        long long sum = 0;
        more = 0;
        while (PyDict_Next(held, &at, &key, &value)) {
            int overflow;
            long long n = PyLong_Check(value) ? PyLong_AsLongLongAndOverflow(value, &overflow)
                                              : (overflow = 1, 0);
            if (overflow || n < 0 || n > (1LL << 50) || (sum += n) > (1LL << 60)) {
                more = 1;
                break;
            }
        }
        if (!more)
            more = tokens > sum;
    }
    Py_DECREF(held);
    return more;
}

/* State._group_seal, for a group in flight that no step trained, whose seal names no more
 * tokens than its attempts sealed or while no finished work of a stopped run waits to be
 * carried (else Carries.seal looks for it): its sealed tokens, and its counts packed as
 * age.seal_counts packs them (int64 pairs, native order).
 * 1 applied, 0 left to the Python path, -1 on error. */
static int group_seal(const Line *line, PyObject *groups, PyObject *trained, PyObject *seals,
                      PyObject *waiting)
{
    PyObject *group_id = ascii(line->group_id), *tokens = NULL, *counts = NULL, *group = NULL;
    int result = -1;
    if (group_id == NULL)
        goto done;
    group = Py_XNewRef(PyDict_GetItemWithError(groups, group_id));
    if (group == NULL) {
        result = PyErr_Occurred() ? -1 : 0;
        goto done;
    }
    if (PyDict_GET_SIZE(waiting) != 0) {
        /* Carries.seal looks for carried work only where the seal names more tokens than
         * the group's own attempts sealed: take the seal here only where it does not. */
        int more = names_more(group, line->tokens);
        if (more != 0) {
            result = more > 0 ? 0 : -1;
            goto done;
        }
    }
    int was_trained = PySet_Contains(trained, group_id);
    if (was_trained != 0) { /* warned of, by the Python path */
        result = was_trained > 0 ? 0 : -1;
        goto done;
    }
    int known = PyDict_Contains(seals, group_id);
    if (known < 0)
        goto done;
    if (!known && intern(&group_id) < 0) /* one string a group (as State._seal_counts) */
        goto done;
    tokens = PyLong_FromLongLong(line->tokens);
    counts = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)line->versions * 16);
    if (tokens == NULL || counts == NULL)
        goto done;
    int64_t *pairs = (int64_t *)PyBytes_AS_STRING(counts);
    for (int i = 0; i < line->versions; i++) {
        pairs[2 * i] = (int64_t)line->version[i];
        pairs[2 * i + 1] = (int64_t)line->version_tokens[i];
    }
    if (PyObject_SetAttr(group, SEALED_TOKENS_NAME, tokens) < 0 ||
        PyDict_SetItem(seals, group_id, counts) < 0)
        goto done;
    result = 1;
done:
    Py_XDECREF(group_id);
    Py_XDECREF(tokens);
    Py_XDECREF(counts);
    Py_XDECREF(group);
    return result;
}

/* Changes of the count of attempts in flight, packed as records.FLIGHT_COUNT packs them,
 * held here and added to the pass's bytearray 256 at a time (a resize a change was ~2% of
 * the 1M-line one pass) and when consume returns: no Python code that reads the
 * bytearray runs between. */
typedef struct {
    PyObject *counts; /* the bytearray, or None */
    int held;
    char buf[256 * 16];
} FlightCounts;

static int flight_flush(FlightCounts *f)
{
    if (f->held == 0)
        return 0;
    Py_ssize_t size = PyByteArray_GET_SIZE(f->counts), more = (Py_ssize_t)f->held * 16;
    if (PyByteArray_Resize(f->counts, size + more) < 0)
        return -1;
    memcpy(PyByteArray_AS_STRING(f->counts) + size, f->buf, more);
    f->held = 0;
    return 0;
}

static int count_flight(FlightCounts *f, double t, Py_ssize_t in_flight)
{
    if (f->held == 256 && flight_flush(f) < 0)
        return -1;
    int64_t n = (int64_t)in_flight;
    memcpy(f->buf + f->held * 16, &t, 8);
    memcpy(f->buf + f->held * 16 + 8, &n, 8);
    f->held++;
    return 0;
}

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
    {"step_sums", step_sums, METH_VARARGS,
     "step_sums(group_ids, seals, trained_version, top) -> (tokens, version_sum, by_age) or "
     "None: see _hot_age.h."},
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
    ATTEMPTS_NAME = PyUnicode_InternFromString("attempts");
    RUN_ID_NAME = PyUnicode_InternFromString("run_id");
    SEALED_TOKENS_NAME = PyUnicode_InternFromString("sealed_tokens");
    ZERO = PyLong_FromLong(0);
    PyObject *sys = PyImport_ImportModule("sys");
    SYS_INTERN = sys != NULL ? PyObject_GetAttrString(sys, "intern") : NULL;
    Py_XDECREF(sys);
    if (SYS_INTERN == NULL)
        return NULL;
    RUN_NAME = PyUnicode_InternFromString("run");
    SEALED_NAME = PyUnicode_InternFromString("sealed");
    EPOCH_NAME = PyUnicode_InternFromString("epoch");
    PROMPT_ID_NAME = PyUnicode_InternFromString("prompt_id");
    RESERVED_NAME = PyUnicode_InternFromString("reserved");
    if (ATTEMPTS_NAME == NULL || RUN_ID_NAME == NULL || SEALED_TOKENS_NAME == NULL ||
        ZERO == NULL || RUN_NAME == NULL || SEALED_NAME == NULL || EPOCH_NAME == NULL ||
        PROMPT_ID_NAME == NULL || RESERVED_NAME == NULL || lanes_init() < 0)
        return NULL;
    return PyModule_Create(&module);
}
