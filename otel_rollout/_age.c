/* A step's token sums for its batch age, in C: the module otel_rollout._age (compiled,
 * optional; age.step_age uses it, and so the live gauge, the trackers and every view).
 *
 * step_sums(group_ids, seals, trained_version, top) -> (tokens, version_sum, by_age) | None
 *
 * The loop of age.step_age: over the step's groups, each one's sealed counts in `seals`
 * (packed (version, tokens) int64 pairs, age.SealCounts; a group with none is passed
 * over), the tokens, the sum of version × tokens, and the tokens by age (trained_version
 * − version, clamped to 0..top), the ages in the order they first appear, as the Python
 * loop inserts them.  None where the Python loop must do it: seals that are no dict
 * (another mapping), counts held as a dict (past 64 bits), a trained version past 64
 * bits, or any product, sum or age past 64 bits (checked at each step, so a total that
 * wrapped is never returned).  On the 1M-line bench trace the Python loop took ~7.5 us a
 * step in the pass (its seals far apart in memory), some 0.1 s.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#define MOST_AGE_BUCKET 64

static PyObject *step_sums(PyObject *self, PyObject *args)
{
    PyObject *group_ids, *seals, *trained;
    long long top;
    if (!PyArg_ParseTuple(args, "OOOL", &group_ids, &seals, &trained, &top))
        return NULL;
    if (!PyDict_CheckExact(seals) || !PyLong_Check(trained) || top < 0 || top > MOST_AGE_BUCKET)
        Py_RETURN_NONE; /* another mapping may have a .get of its own */
    int overflow;
    long long version_trained = PyLong_AsLongLongAndOverflow(trained, &overflow);
    if (version_trained == -1 && PyErr_Occurred())
        return NULL;
    if (overflow)
        Py_RETURN_NONE;
    PyObject *ids = PySequence_Fast(group_ids, "step_sums: group_ids must be a sequence");
    if (ids == NULL)
        return NULL;
    int64_t tokens = 0, version_sum = 0, by_age[MOST_AGE_BUCKET + 1];
    int order[MOST_AGE_BUCKET + 1], ages = 0;
    unsigned char seen[MOST_AGE_BUCKET + 1];
    memset(seen, 0, sizeof seen);
    PyObject *result = NULL;
    int python = 0; /* 1: the Python loop must do it */
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(ids) && !python; i++) {
        PyObject *counts = PyDict_GetItemWithError(seals, PySequence_Fast_GET_ITEM(ids, i));
        if (counts == NULL) {
            if (PyErr_Occurred())
                goto done;
            continue;
        }
        if (!PyBytes_CheckExact(counts) || PyBytes_GET_SIZE(counts) % 16 != 0) {
            python = PyObject_IsTrue(counts); /* an empty one is passed over there too */
            if (python < 0)
                goto done;
            continue;
        }
        const char *p = PyBytes_AS_STRING(counts), *stop = p + PyBytes_GET_SIZE(counts);
        for (; p < stop && !python; p += 16) {
            int64_t version, n, product, age;
            memcpy(&version, p, 8);
            memcpy(&n, p + 8, 8);
            if (__builtin_add_overflow(tokens, n, &tokens) ||
                __builtin_mul_overflow(version, n, &product) ||
                __builtin_add_overflow(version_sum, product, &version_sum) ||
                __builtin_sub_overflow((int64_t)version_trained, version, &age)) {
                python = 1; /* past 64 bits: Python's integers */
                break;
            }
            int bucket = age > top ? (int)top : age < 0 ? 0 : (int)age;
            if (!seen[bucket]) {
                seen[bucket] = 1;
                by_age[bucket] = 0;
                order[ages++] = bucket;
            }
            if (__builtin_add_overflow(by_age[bucket], n, &by_age[bucket]))
                python = 1;
        }
    }
    if (python) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    PyObject *counted = PyDict_New();
    if (counted == NULL)
        goto done;
    for (int i = 0; i < ages; i++) {
        PyObject *key = PyLong_FromLong(order[i]);
        PyObject *value = PyLong_FromLongLong((long long)by_age[order[i]]);
        int failed = key == NULL || value == NULL || PyDict_SetItem(counted, key, value) < 0;
        Py_XDECREF(key);
        Py_XDECREF(value);
        if (failed) {
            Py_DECREF(counted);
            goto done;
        }
    }
    result = Py_BuildValue("LLN", (long long)tokens, (long long)version_sum, counted);
done:
    Py_DECREF(ids);
    return result;
}

static PyMethodDef methods[] = {
    {"step_sums", step_sums, METH_VARARGS,
     "step_sums(group_ids, seals, trained_version, top) -> (tokens, version_sum, by_age) or "
     "None: see age.step_age."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "otel_rollout._age",
    "A step's batch-age sums in C (see age.step_age).", -1, methods,
};

PyMODINIT_FUNC PyInit__age(void) { return PyModule_Create(&module); }
