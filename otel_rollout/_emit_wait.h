/* The writer's hold: a wait that another thread ends (included by _emit.c; see _hold.py).
 *
 * Waker() is the hold's wake-up: wait(timeout=None) -> bool blocks without the GIL until
 * wake() or the timeout (True if woken; the wake is spent), and clear() spends a wake
 * left over.  wake() takes only the waker's own mutex, which is never held while Python
 * code runs, so a flush on any thread and a signal handler may call it.  Wakes do not
 * count: several before a wait end that one wait.
 *
 * After fork, a child's Waker from its parent is left alone: its wake does nothing (the
 * parent's writer, its only waiter, is not there, and may have held its mutex at the
 * fork) and it is freed without pthread_cond_destroy (which would wait for that waiter).
 *
 * cond_make and deadline_at serve the line buffer's waits too (_emit_lines.h).
 */
#include <errno.h>
#include <pthread.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    PyObject_HEAD
    pthread_mutex_t mutex;
    pthread_cond_t cond;
    int woken;
    int ready;     /* mutex and cond made */
    int monotonic; /* the cond waits on CLOCK_MONOTONIC (else the wall clock) */
    pid_t pid;     /* the process that made it */
} Waker;

static PyTypeObject WakerType;

/* A cond that waits on CLOCK_MONOTONIC where it can (*monotonic says), else the wall
 * clock; 0, or the error. */
static int cond_make(pthread_cond_t *cond, int *monotonic)
{
    pthread_condattr_t attr;
    int failed = pthread_condattr_init(&attr);
    if (failed)
        return failed;
    *monotonic = 0;
#if defined(CLOCK_MONOTONIC) && !defined(__APPLE__)
    *monotonic = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC) == 0;
#endif
    failed = pthread_cond_init(cond, &attr);
    pthread_condattr_destroy(&attr);
    return failed;
}

static PyObject *waker_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    if (!PyArg_ParseTuple(args, ":Waker") || !_PyArg_NoKeywords("Waker", kwargs))
        return NULL;
    Waker *self = (Waker *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    int failed = pthread_mutex_init(&self->mutex, NULL);
    if (!failed && (failed = cond_make(&self->cond, &self->monotonic)) != 0)
        pthread_mutex_destroy(&self->mutex);
    if (failed) {
        Py_DECREF(self);
        errno = failed;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    self->ready = 1;
    self->pid = getpid();
    return (PyObject *)self;
}

static void waker_dealloc(Waker *self)
{
    if (self->ready && self->pid == getpid()) {
        pthread_cond_destroy(&self->cond);
        pthread_mutex_destroy(&self->mutex);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The deadline seconds from now on a cond's clock (monotonic, or the wall clock). */
static struct timespec deadline_at(int monotonic, double seconds)
{
    struct timespec at;
#if defined(CLOCK_MONOTONIC)
    clock_gettime(monotonic ? CLOCK_MONOTONIC : CLOCK_REALTIME, &at);
#else
    clock_gettime(CLOCK_REALTIME, &at);
#endif
    if (seconds > 1e9)
        seconds = 1e9;
    time_t whole = (time_t)seconds;
    long nanos = (long)((seconds - (double)whole) * 1e9);
    at.tv_sec += whole;
    at.tv_nsec += nanos;
    if (at.tv_nsec >= 1000000000L) {
        at.tv_sec += 1;
        at.tv_nsec -= 1000000000L;
    }
    return at;
}

/* Without the GIL: wait until woken or seconds pass (forever if seconds < 0; not at all if
 * 0: a timed wait whose deadline has passed still cost ~0.25 ms here, arming a timer). */
static int waker_wait_nogil(Waker *self, double seconds)
{
    pthread_mutex_lock(&self->mutex);
    if (seconds < 0) {
        while (!self->woken)
            pthread_cond_wait(&self->cond, &self->mutex);
    }
    else if (seconds > 0) {
        struct timespec at = deadline_at(self->monotonic, seconds);
        while (!self->woken)
            if (pthread_cond_timedwait(&self->cond, &self->mutex, &at) != 0)
                break; /* timed out (or a deadline it will not take: no wait for good) */
    }
    int woken = self->woken;
    self->woken = 0;
    pthread_mutex_unlock(&self->mutex);
    return woken;
}

static PyObject *waker_wake(Waker *self, PyObject *unused)
{
    if (self->pid != getpid()) /* a forked child's copy: see above */
        Py_RETURN_NONE;
    pthread_mutex_lock(&self->mutex);
    self->woken = 1;
    pthread_cond_signal(&self->cond);
    pthread_mutex_unlock(&self->mutex);
    Py_RETURN_NONE;
}

static PyObject *waker_clear(Waker *self, PyObject *unused)
{
    pthread_mutex_lock(&self->mutex);
    self->woken = 0;
    pthread_mutex_unlock(&self->mutex);
    Py_RETURN_NONE;
}

static PyObject *waker_wait(Waker *self, PyObject *args)
{
    PyObject *timeout = Py_None;
    if (!PyArg_ParseTuple(args, "|O:wait", &timeout))
        return NULL;
    double seconds = -1.0;
    if (timeout != Py_None) {
        seconds = PyFloat_AsDouble(timeout);
        if (seconds == -1.0 && PyErr_Occurred())
            return NULL;
        if (!(seconds >= 0)) /* a negative or NaN timeout: do not wait */
            seconds = 0;
    }
    int woken;
    Py_BEGIN_ALLOW_THREADS
    woken = waker_wait_nogil(self, seconds);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(woken);
}

static PyMethodDef waker_methods[] = {
    {"wake", (PyCFunction)waker_wake, METH_NOARGS, "wake(): end the wait (or the next one)."},
    {"clear", (PyCFunction)waker_clear, METH_NOARGS, "clear(): spend a wake left over."},
    {"wait", (PyCFunction)waker_wait, METH_VARARGS,
     "wait(timeout=None) -> bool: until woken (True) or timeout seconds pass (False)."},
    {NULL},
};

static PyTypeObject WakerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "otel_rollout._emit.Waker",
    .tp_basicsize = sizeof(Waker),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The writer's wait, ended by wake() from any thread (see _emit_wait.h).",
    .tp_new = waker_new,
    .tp_dealloc = (destructor)waker_dealloc,
    .tp_methods = waker_methods,
};
