/* The hot lines applied to the shared state (included by _hot.c): each applier is the C
 * twin of the state's Python handler it names (analysis/state.py), and says 1 (applied),
 * 0 (left to the Python path: consume stops there) or -1 (an error is set).  Also the
 * buffer of changes of the attempts in flight.
 */
#ifndef OTEL_ROLLOUT_HOT_APPLY_H
#define OTEL_ROLLOUT_HOT_APPLY_H

#include <Python.h>
#include <string.h>

#include "_hot_history.h"
#include "_hot_line.h"

static PyObject *ATTEMPTS_NAME, *RUN_ID_NAME, *SEALED_TOKENS_NAME, *ZERO;

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

/* The names and numbers this header uses (its history's too); -1 on error. */
static int apply_init(void)
{
    ATTEMPTS_NAME = PyUnicode_InternFromString("attempts");
    RUN_ID_NAME = PyUnicode_InternFromString("run_id");
    SEALED_TOKENS_NAME = PyUnicode_InternFromString("sealed_tokens");
    ZERO = PyLong_FromLong(0);
    if (ATTEMPTS_NAME == NULL || RUN_ID_NAME == NULL || SEALED_TOKENS_NAME == NULL ||
        ZERO == NULL)
        return -1;
    return history_init();
}

#endif
