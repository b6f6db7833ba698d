/* The lines emitted and not yet written, and the writer's loop that writes them without
 * the GIL (included by _emit.c, after _emit_json.h and _emit_wait.h; see _pipeline.py).
 *
 * LineBuffer() holds the lines emit appends (append(line, t) for lines made in Python)
 * until the writer takes them.  Its own mutex guards it, so that the writer can take
 * lines without the GIL; the mutex is never held while Python code runs (emit makes its
 * line first, in a buffer of its own, and only copies it in under the mutex).
 *
 * drain(fd, gather, report_after, urgent) is the writer's steady state: without the GIL it
 * takes the lines, writes them, lets the next ones gather for `gather` seconds, and
 * again, until it must hand back to Python: a flush or close asked (interrupt()), it has
 * written for `report_after` seconds (the pipeline counts, the syncer is told), or a
 * batch needs Python: one holding a line with any of the `urgent` byte strings (a
 * checkpoint's, synced at once), or whose write failed or found the file deleted (the
 * log's fault handling).  It returns (reason, lines written, chunk, bytes of the chunk
 * written, errno, deleted): chunk is (data, lines, first_t) for the batch handed back,
 * else None.  With no line, it waits for one: the next line appended wakes it.
 *
 * take() -> (data, lines, first_t) or None, wait() (for a line or an interrupt) and
 * written() serve the writer's Python path (markers, faults, syncs after every write).
 * Lines taken stay counted (taken) until written or handed back and written(): emit's
 * room is the capacity less lines and taken.  drained counts the lines drain wrote.
 *
 * Why: a controller that keeps the GIL busy gives it up to another thread only when the
 * switch interval (5 ms) runs out, and each such forced switch cost this VM's CPU-bound
 * controller far more than the writer's work: a writer taking the GIL ~20 times a second
 * (a batch every 50 ms held) took 2.5-3.5% of its throughput at 1,000 events/s, one that
 * took it only at each flush ~0 (bench/README.md).  Drain takes it only to hand back.
 *
 * After fork, the child's copy of a buffer gets a new mutex and cond on its first use
 * (pthread_atfork counts forks): the parent's writer may have held the mutex then.
 */
#include <string.h>

static unsigned long fork_generation; /* forks this process is a child of (pthread_atfork) */

static void count_fork(void) { fork_generation++; }

typedef struct {
    PyObject_HEAD
    Buf buf;              /* the lines not yet taken: emit appends here */
    Buf spare;            /* the writer's: the lines it took last, written from here */
    Py_ssize_t lines;     /* lines in buf */
    Py_ssize_t taken;     /* lines taken by the writer, not yet written (or handed back) */
    Py_ssize_t drained;   /* lines drain() wrote, all told */
    double first_t;       /* when the oldest line in buf was emitted */
    int idle;             /* the writer waits for a line: the next one signals */
    unsigned long asks;   /* interrupts asked (a flush, a close) */
    unsigned long seen;   /* ...and seen by the writer */
    pthread_mutex_t mutex;
    pthread_cond_t cond;
    int ready;            /* mutex and cond made */
    int monotonic;        /* the cond waits on CLOCK_MONOTONIC */
    unsigned long generation; /* fork_generation when the mutex and cond were made */
} LineBuffer;

/* Counts read without the mutex (emit's room, stats): whole words, never torn, and stored
 * in the order that never shows more room than there is (taken grows before lines
 * shrinks; drained grows before taken shrinks). */
#define LOAD(x) __atomic_load_n(&(x), __ATOMIC_ACQUIRE)
#define STORE(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELEASE)

static PyTypeObject LineBufferType;

static int lines_make_sync(LineBuffer *self)
{
    int failed = pthread_mutex_init(&self->mutex, NULL);
    if (!failed && (failed = cond_make(&self->cond, &self->monotonic)) != 0)
        pthread_mutex_destroy(&self->mutex);
    self->ready = !failed;
    self->generation = fork_generation;
    self->idle = 0;
    return failed;
}

static void lines_lock(LineBuffer *self)
{
    if (self->generation != fork_generation) { /* a forked child's first use: see above */
        /* The parent's lines are the parent's to write, and its writer may have been
         * mid-swap: the child leaves both buffers to it (leaked, not freed twice). */
        self->buf = (Buf){NULL, 0, 0};
        self->spare = (Buf){NULL, 0, 0};
        self->lines = self->taken = 0;
        lines_make_sync(self);
    }
    pthread_mutex_lock(&self->mutex);
}

static void lines_unlock(LineBuffer *self) { pthread_mutex_unlock(&self->mutex); }

static PyObject *linebuffer_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    if (!PyArg_ParseTuple(args, ":LineBuffer") || !_PyArg_NoKeywords("LineBuffer", kwargs))
        return NULL;
    LineBuffer *self = (LineBuffer *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    int failed = lines_make_sync(self);
    if (failed) {
        Py_DECREF(self);
        errno = failed;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return (PyObject *)self;
}

static void linebuffer_dealloc(LineBuffer *self)
{
    if (self->ready && self->generation == fork_generation) {
        pthread_cond_destroy(&self->cond);
        pthread_mutex_destroy(&self->mutex);
        PyMem_RawFree(self->buf.data);
        PyMem_RawFree(self->spare.data);
    } /* (a forked child's copy, never used there: its buffers are left, as above) */
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Under the mutex: a line was added to buf, emitted at t; a writer waiting is woken. */
static void lines_added(LineBuffer *self, double t)
{
    if (self->lines == 0)
        self->first_t = t;
    STORE(self->lines, self->lines + 1);
    if (self->idle) {
        self->idle = 0;
        pthread_cond_signal(&self->cond);
    }
}

/* Appends one line made elsewhere (by emit, or append()); -1 with MemoryError set (once
 * the mutex is released: making the error may collect garbage, whose finalizers may emit). */
static int lines_put(LineBuffer *self, const char *line, Py_ssize_t len, double t)
{
    lines_lock(self);
    int failed = buf_reserve(&self->buf, len);
    if (!failed) {
        memcpy(self->buf.data + self->buf.len, line, len);
        self->buf.len += len;
        lines_added(self, t);
    }
    lines_unlock(self);
    if (failed)
        PyErr_NoMemory();
    return failed;
}

static PyObject *linebuffer_append(LineBuffer *self, PyObject *args)
{
    Py_buffer line;
    double t;
    if (!PyArg_ParseTuple(args, "y*d:append", &line, &t))
        return NULL;
    int failed = lines_put(self, line.buf, line.len, t);
    PyBuffer_Release(&line);
    if (failed)
        return NULL;
    Py_RETURN_NONE;
}

/* A burst's buffer is not kept for good. */
static void buf_shrink(Buf *b)
{
    b->len = 0;
    if (b->cap > (1 << 22)) {
        PyMem_RawFree(b->data);
        b->data = NULL;
        b->cap = 0;
    }
}

/* Under the mutex: buf's lines become the writer's (spare, empty before), and counted taken;
 * how many. */
static Py_ssize_t lines_swap(LineBuffer *self, double *first_t)
{
    Buf empty = self->spare;
    self->spare = self->buf;
    self->buf = empty;
    Py_ssize_t n = self->lines;
    *first_t = self->first_t;
    STORE(self->taken, self->taken + n);
    STORE(self->lines, 0);
    return n;
}

static PyObject *linebuffer_take(LineBuffer *self, PyObject *unused)
{
    lines_lock(self);
    if (self->lines == 0) {
        lines_unlock(self);
        Py_RETURN_NONE;
    }
    double first_t;
    Py_ssize_t n = lines_swap(self, &first_t);
    lines_unlock(self);
    PyObject *data = PyBytes_FromStringAndSize(self->spare.data, self->spare.len);
    buf_shrink(&self->spare);
    if (data == NULL) /* (still counted taken: the writer counts them lost) */
        return NULL;
    return Py_BuildValue("(Nnd)", data, n, first_t);
}

static PyObject *linebuffer_written(LineBuffer *self, PyObject *unused)
{
    lines_lock(self);
    STORE(self->taken, 0);
    lines_unlock(self);
    Py_RETURN_NONE;
}

static PyObject *linebuffer_interrupt(LineBuffer *self, PyObject *unused)
{
    lines_lock(self);
    self->asks++;
    pthread_cond_broadcast(&self->cond);
    lines_unlock(self);
    Py_RETURN_NONE;
}

static PyObject *linebuffer_wait(LineBuffer *self, PyObject *unused)
{
    Py_BEGIN_ALLOW_THREADS
    lines_lock(self);
    while (self->lines == 0 && self->asks == self->seen) {
        self->idle = 1;
        pthread_cond_wait(&self->cond, &self->mutex);
    }
    self->idle = 0;
    self->seen = self->asks;
    lines_unlock(self);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static int past(const struct timespec *at, int monotonic)
{
    struct timespec now = deadline_at(monotonic, 0.0);
    return now.tv_sec > at->tv_sec || (now.tv_sec == at->tv_sec && now.tv_nsec >= at->tv_nsec);
}

#define MAX_URGENT 8

typedef struct {
    int n;
    const char *text[MAX_URGENT];
    size_t len[MAX_URGENT];
} Urgent;

static int urgent_in(const Buf *b, const Urgent *urgent)
{
    for (int i = 0; i < urgent->n; i++)
        if (memmem(b->data, (size_t)b->len, urgent->text[i], urgent->len[i]))
            return 1;
    return 0;
}

/* Without the GIL: all of data written to fd unless its file was deleted (fstat: no links;
 * nothing written); the bytes written, *error the errno that stopped it, if one did. */
static Py_ssize_t write_all(int fd, const char *data, Py_ssize_t len, int *error, int *deleted)
{
    struct stat st;
    Py_ssize_t done = 0;
    if (fstat(fd, &st) != 0)
        *error = errno;
    else if (st.st_nlink == 0)
        *deleted = 1;
    else
        while (done < len) {
            ssize_t n = write(fd, data + done, (size_t)(len - done));
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0) { /* (a write of nothing would loop here for good) */
                *error = n < 0 ? errno : EIO;
                break;
            }
            done += n;
        }
    return done;
}

/* write_whole(fd, data) -> (written, errno, deleted): write_all, for the log's writes made
 * in Python (one release of the GIL for the check and the write, not two). */
static PyObject *write_whole(PyObject *module, PyObject *args)
{
    int fd;
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "iy*:write_whole", &fd, &data))
        return NULL;
    Py_ssize_t done;
    int error = 0, deleted = 0;
    Py_BEGIN_ALLOW_THREADS
    done = write_all(fd, data.buf, data.len, &error, &deleted);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    return Py_BuildValue("(nii)", done, error, deleted);
}

enum { DRAIN_ASKED, DRAIN_REPORT, DRAIN_URGENT, DRAIN_FAILED };

static PyObject *linebuffer_drain(LineBuffer *self, PyObject *args)
{
    int fd;
    double gather, report_after;
    PyObject *urgent;
    if (!PyArg_ParseTuple(args, "iddO!:drain", &fd, &gather, &report_after, &PyTuple_Type,
                          &urgent))
        return NULL;
    Urgent marks = {0};
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(urgent); i++) {
        PyObject *u = PyTuple_GET_ITEM(urgent, i);
        if (!PyBytes_Check(u) || !PyBytes_GET_SIZE(u) || marks.n == MAX_URGENT) {
            PyErr_SetString(PyExc_TypeError, "drain: urgent is a tuple of up to 8 non-empty bytes");
            return NULL;
        }
        marks.text[marks.n] = PyBytes_AS_STRING(u); /* (the tuple is the caller's: alive) */
        marks.len[marks.n++] = (size_t)PyBytes_GET_SIZE(u);
    }
    if (!(gather >= 0) || !(report_after >= 0)) {
        PyErr_SetString(PyExc_ValueError, "drain: gather and report_after are seconds >= 0");
        return NULL;
    }
    int reason = DRAIN_ASKED, error = 0, deleted = 0, reporting = 0;
    Py_ssize_t wrote = 0, n = 0, done = 0;
    double first_t = 0.0;
    Py_BEGIN_ALLOW_THREADS
    struct timespec report_at = {0, 0};
    lines_lock(self);
    for (;;) {
        if (self->asks != self->seen) {
            self->seen = self->asks;
            reason = DRAIN_ASKED;
            break;
        }
        if (self->lines == 0) { /* wait for a line (no longer than the report, once due) */
            if (reporting && past(&report_at, self->monotonic)) {
                reason = DRAIN_REPORT;
                break;
            }
            self->idle = 1;
            if (reporting)
                pthread_cond_timedwait(&self->cond, &self->mutex, &report_at);
            else
                pthread_cond_wait(&self->cond, &self->mutex);
            self->idle = 0;
            continue;
        }
        n = lines_swap(self, &first_t);
        done = 0; /* (of this batch: the last one's was whole) */
        lines_unlock(self);
        if (urgent_in(&self->spare, &marks)) {
            lines_lock(self);
            reason = DRAIN_URGENT;
            break;
        }
        done = write_all(fd, self->spare.data, self->spare.len, &error, &deleted);
        lines_lock(self);
        if (error || deleted) {
            reason = DRAIN_FAILED;
            break;
        }
        STORE(self->drained, self->drained + n);
        STORE(self->taken, self->taken - n);
        wrote += n;
        n = 0;
        buf_shrink(&self->spare);
        if (!reporting) {
            reporting = 1;
            report_at = deadline_at(self->monotonic, report_after);
        }
        else if (past(&report_at, self->monotonic)) {
            reason = DRAIN_REPORT;
            break;
        }
        if (gather > 0) { /* lines gather: only an interrupt ends this early */
            struct timespec at = deadline_at(self->monotonic, gather);
            if (at.tv_sec > report_at.tv_sec
                || (at.tv_sec == report_at.tv_sec && at.tv_nsec > report_at.tv_nsec))
                at = report_at;
            while (self->asks == self->seen)
                if (pthread_cond_timedwait(&self->cond, &self->mutex, &at) != 0)
                    break; /* the time is up (or a deadline it will not take) */
        }
    }
    lines_unlock(self);
    Py_END_ALLOW_THREADS
    PyObject *chunk = Py_None;
    if (n) { /* the batch handed back: still counted taken, until written() */
        PyObject *data = PyBytes_FromStringAndSize(self->spare.data, self->spare.len);
        buf_shrink(&self->spare);
        if (data == NULL)
            return NULL;
        chunk = Py_BuildValue("(Nnd)", data, n, first_t);
        if (chunk == NULL)
            return NULL;
    }
    else
        Py_INCREF(chunk);
    return Py_BuildValue("(inNnii)", reason, wrote, chunk, done, error, deleted);
}

static PyObject *linebuffer_get(LineBuffer *self, void *which)
{
    switch ((int)(Py_intptr_t)which) {
    case 0:
        return PyLong_FromSsize_t(LOAD(self->lines));
    case 1:
        return PyLong_FromSsize_t(LOAD(self->taken));
    case 2:
        return PyLong_FromSsize_t(LOAD(self->drained));
    default:
        return PyBool_FromLong(LOAD(self->idle));
    }
}

static PyMethodDef linebuffer_methods[] = {
    {"written", (PyCFunction)linebuffer_written, METH_NOARGS,
     "written(): the lines taken are written (or counted lost): room for as many more."},
    {"append", (PyCFunction)linebuffer_append, METH_VARARGS,
     "append(line, t): one whole line (ending in a newline), emitted at t."},
    {"take", (PyCFunction)linebuffer_take, METH_NOARGS,
     "take() -> (data, lines, first_t) or None: every line so far, the buffer emptied."},
    {"wait", (PyCFunction)linebuffer_wait, METH_NOARGS,
     "wait(): without the GIL, until a line is appended or interrupt() is called (at once"
     " if one was, or is, since the last wait or drain)."},
    {"interrupt", (PyCFunction)linebuffer_interrupt, METH_NOARGS,
     "interrupt(): end the writer's wait() or drain() (a flush or close is queued)."},
    {"drain", (PyCFunction)linebuffer_drain, METH_VARARGS,
     "drain(fd, gather, report_after, urgent) -> (reason, written, chunk, done, errno,"
     " deleted): write lines as they come, without the GIL, until Python is needed."},
    {NULL},
};

static PyGetSetDef linebuffer_getset[] = {
    {"lines", (getter)linebuffer_get, NULL, "Lines not yet taken.", (void *)0},
    {"taken", (getter)linebuffer_get, NULL,
     "Lines taken by the writer and not yet written (or lost).", (void *)1},
    {"drained", (getter)linebuffer_get, NULL, "Lines drain() wrote, all told.", (void *)2},
    {"idle", (getter)linebuffer_get, NULL, "The writer waits for a line.", (void *)3},
    {NULL},
};

static PyTypeObject LineBufferType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "otel_rollout._emit.LineBuffer",
    .tp_basicsize = sizeof(LineBuffer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The log's lines emitted and not yet written (see _emit_lines.h).",
    .tp_new = linebuffer_new,
    .tp_dealloc = (destructor)linebuffer_dealloc,
    .tp_methods = linebuffer_methods,
    .tp_getset = linebuffer_getset,
};
