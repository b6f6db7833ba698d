/* The groups' histories a pass keeps, written by the compiled path (included by
 * _hot_apply.h): the rules of analysis/history.py's Histories and History, each function
 * the C twin of the method it names.  Also intern(), shared with the appliers.
 */
#ifndef OTEL_ROLLOUT_HOT_HISTORY_H
#define OTEL_ROLLOUT_HOT_HISTORY_H

#include <Python.h>
#include <math.h>

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

/* The names and the function this header uses; -1 on error. */
static int history_init(void)
{
    PyObject *sys = PyImport_ImportModule("sys");
    SYS_INTERN = sys != NULL ? PyObject_GetAttrString(sys, "intern") : NULL;
    Py_XDECREF(sys);
    RUN_NAME = PyUnicode_InternFromString("run");
    SEALED_NAME = PyUnicode_InternFromString("sealed");
    EPOCH_NAME = PyUnicode_InternFromString("epoch");
    PROMPT_ID_NAME = PyUnicode_InternFromString("prompt_id");
    RESERVED_NAME = PyUnicode_InternFromString("reserved");
    return SYS_INTERN != NULL && RUN_NAME != NULL && SEALED_NAME != NULL &&
                   EPOCH_NAME != NULL && PROMPT_ID_NAME != NULL && RESERVED_NAME != NULL
               ? 0
               : -1;
}

#endif
