/* One line of the kinds _hot.c takes, read from its bytes (included by _hot.c only).
 *
 * read_line() says whether a line is, for certain, an event of those kinds in the shape
 * the schema's rules accept, and reads its fields into a Line; anything it is not certain
 * of (see _hot.c's header) it refuses, and the Python path reads the line.  Numbers are
 * read as msgspec reads them: integers of a few digits exactly, and a time as the nearest
 * double (read_number).
 */
#ifndef OTEL_ROLLOUT_HOT_LINE_H
#define OTEL_ROLLOUT_HOT_LINE_H

#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#define HAVE_SSE2 1
#endif

#include "_hot_number.h"

/* Integers of at most this many digits are read here (15 digits: below 2^53, so an
 * integer t converts to the same double either way); longer ones go to the Python path. */
#define MOST_DIGITS 15
/* A seal's tokens at most 12 digits: a call's sum of seals stays far inside 64 bits. */
#define MOST_TOKEN_DIGITS 12

#define KIND_DISPATCH 1
#define KIND_SEAL 2
#define KIND_RESERVE 4
#define KIND_ADMIT 8
#define KIND_GROUP_SEAL 16
/* A group seal of at most this many versions is read here (a refit makes two). */
#define MOST_VERSIONS 8

enum {
    K_T, K_RUN_ID, K_EVENT, K_GROUP_ID, K_PROMPT_ID, K_ATTEMPT_ID,
    K_GENERATION_INDEX, K_WEIGHT_VERSION, K_EPOCH, K_TOKENS, K_CALLS, K_SIZE,
    K_TOKENS_BY_VERSION, K_COUNT
};

static const struct { const char *name; Py_ssize_t length; } KEYS[K_COUNT] = {
    {"t", 1}, {"run_id", 6}, {"event", 5}, {"group_id", 8}, {"prompt_id", 9},
    {"attempt_id", 10}, {"generation_index", 16}, {"weight_version", 14},
    {"epoch", 5}, {"tokens", 6}, {"calls", 5}, {"size", 4}, {"tokens_by_version", 17},
};

#define BIT(k) (1u << (k))
#define GROUP (BIT(K_T) | BIT(K_RUN_ID) | BIT(K_EVENT) | BIT(K_GROUP_ID) | BIT(K_PROMPT_ID))
#define ATTEMPT (GROUP | BIT(K_ATTEMPT_ID) | BIT(K_GENERATION_INDEX))
/* The schema's fields of each kind: required, and all it may carry. */
#define DISPATCH_NEEDS (ATTEMPT | BIT(K_WEIGHT_VERSION))
#define DISPATCH_MAY (DISPATCH_NEEDS | BIT(K_EPOCH))
#define SEAL_NEEDS (ATTEMPT | BIT(K_TOKENS))
#define SEAL_MAY (SEAL_NEEDS | BIT(K_CALLS))
#define RESERVE_NEEDS (GROUP | BIT(K_SIZE) | BIT(K_WEIGHT_VERSION))
#define RESERVE_MAY (RESERVE_NEEDS | BIT(K_EPOCH))
#define ADMIT_NEEDS GROUP
#define ADMIT_MAY GROUP
#define GROUP_SEAL_NEEDS (GROUP | BIT(K_TOKENS))
#define GROUP_SEAL_MAY (GROUP_SEAL_NEEDS | BIT(K_TOKENS_BY_VERSION))

typedef struct {
    const char *p;
    Py_ssize_t n;
} Str;

typedef struct {
    unsigned seen;
    int kind; /* KIND_*, by its "event" */
    int other_run; /* its "run_id" is not the run's (it may begin a new run) */
    double t;
    Str group_id, attempt_id;
    long long prompt_id, generation_index, weight_version, epoch, tokens, size;
    int versions; /* a group seal's tokens_by_version, in the order written */
    long long version[MOST_VERSIONS], version_tokens[MOST_VERSIONS];
} Line;

/* A string read_string gave (plain ASCII) as a Python str. */
static PyObject *ascii(Str s)
{
    PyObject *text = PyUnicode_New(s.n, 127);
    if (text != NULL)
        memcpy(PyUnicode_DATA(text), s.p, s.n);
    return text;
}

static inline const char *skip_ws(const char *p, const char *stop)
{
    while (p < stop && (*p == ' ' || *p == '\t' || *p == '\r'))
        p++;
    return p;
}

/* p at the byte c, past any whitespace before it (the writer writes none); NULL if another
 * byte comes first. */
static inline const char *at(const char *p, const char *stop, char c)
{
    if (p < stop && *p == c)
        return p;
    p = skip_ws(p, stop);
    return p < stop && *p == c ? p : NULL;
}

/* A string of printable ASCII with no escape; NULL where it is not one.  (An escaped
 * quote may end the span early, but its backslash then refuses it.)  Sixteen bytes a step
 * where SSE2 is there: the strings are most of a line's bytes. */
static const char *read_string(const char *p, const char *stop, Str *out)
{
    if (p >= stop || *p != '"')
        return NULL;
    const char *s = ++p;
#ifdef HAVE_SSE2
    const __m128i quote = _mm_set1_epi8('"'), space = _mm_set1_epi8(0x20);
    const __m128i del = _mm_set1_epi8(0x7f), backslash = _mm_set1_epi8('\\');
    while (stop - p >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)p);
        /* signed: a byte of 0x80 or more is below 0x20 too */
        __m128i bad = _mm_or_si128(_mm_cmplt_epi8(v, space),
                                   _mm_or_si128(_mm_cmpeq_epi8(v, del),
                                                _mm_cmpeq_epi8(v, backslash)));
        unsigned quotes = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(v, quote));
        unsigned bads = (unsigned)_mm_movemask_epi8(bad);
        if (quotes) {
            unsigned at = (unsigned)__builtin_ctz(quotes);
            if (bads & ((1u << at) - 1))
                return NULL;
            out->p = s;
            out->n = p + at - s;
            return p + at + 1;
        }
        if (bads)
            return NULL;
        p += 16;
    }
#endif
    for (; p < stop; p++) {
        unsigned char b = (unsigned char)*p;
        if (b == '"') {
            out->p = s;
            out->n = p - s;
            return p + 1;
        }
        if (b < 0x20 || b >= 0x7f || b == '\\')
            return NULL;
    }
    return NULL;
}

/* calls: [[call_id, began_version, tokens], ...], call_id a plain string or an integer. */
static const char *read_calls(const char *p, const char *stop)
{
    long long ignored;
    Str id;
    if (p >= stop || *p != '[')
        return NULL;
    p = skip_ws(p + 1, stop);
    if (p < stop && *p == ']')
        return p + 1;
    for (;;) {
        if (p >= stop || *p != '[')
            return NULL;
        p = skip_ws(p + 1, stop);
        if (p < stop && *p == '"')
            p = read_string(p, stop, &id);
        else
            p = read_int(p, stop, &ignored, 1, MOST_DIGITS);
        for (int i = 0; i < 2 && p != NULL; i++) {
            p = skip_ws(p, stop);
            if (p >= stop || *p != ',')
                return NULL;
            p = read_int(skip_ws(p + 1, stop), stop, &ignored, 0, MOST_DIGITS);
        }
        if (p == NULL)
            return NULL;
        p = skip_ws(p, stop);
        if (p >= stop || *p != ']')
            return NULL;
        p = skip_ws(p + 1, stop);
        if (p < stop && *p == ',') {
            p = skip_ws(p + 1, stop);
            continue;
        }
        if (p < stop && *p == ']')
            return p + 1;
        return NULL;
    }
}

/* tokens_by_version: {"version": tokens, ...}, each version a decimal string with no sign
 * or leading zero (what validate takes), told once, its tokens summing to the seal's. */
static const char *read_versions(const char *p, const char *stop, Line *line)
{
    line->versions = 0;
    if (p >= stop || *p != '{')
        return NULL;
    p = skip_ws(p + 1, stop);
    if (p < stop && *p == '}')
        return p + 1;
    for (;;) {
        Str key;
        long long version = 0, tokens;
        if (line->versions == MOST_VERSIONS || (p = read_string(p, stop, &key)) == NULL)
            return NULL;
        if (key.n == 0 || key.n > MOST_DIGITS || (key.p[0] == '0' && key.n > 1))
            return NULL;
        for (Py_ssize_t i = 0; i < key.n; i++) {
            if (key.p[i] < '0' || key.p[i] > '9')
                return NULL;
            version = version * 10 + (key.p[i] - '0');
        }
        for (int i = 0; i < line->versions; i++)
            if (line->version[i] == version)
                return NULL;
        if ((p = at(p, stop, ':')) == NULL)
            return NULL;
        p = read_int(skip_ws(p + 1, stop), stop, &tokens, 0, MOST_TOKEN_DIGITS);
        if (p == NULL)
            return NULL;
        line->version[line->versions] = version;
        line->version_tokens[line->versions++] = tokens;
        p = skip_ws(p, stop);
        if (p < stop && *p == ',') {
            p = skip_ws(p + 1, stop);
            continue;
        }
        if (p < stop && *p == '}')
            return p + 1;
        return NULL;
    }
}

static int key_of(Str key)
{
    int k;
    switch (key.n) { /* one length names one or two keys */
    case 1: k = K_T; break;
    case 4: k = K_SIZE; break;
    case 5: k = key.p[0] == 'e' ? (key.p[1] == 'v' ? K_EVENT : K_EPOCH) : K_CALLS; break;
    case 6: k = key.p[0] == 'r' ? K_RUN_ID : K_TOKENS; break;
    case 8: k = K_GROUP_ID; break;
    case 9: k = K_PROMPT_ID; break;
    case 10: k = K_ATTEMPT_ID; break;
    case 14: k = K_WEIGHT_VERSION; break;
    case 16: k = K_GENERATION_INDEX; break;
    case 17: k = K_TOKENS_BY_VERSION; break;
    default: return -1;
    }
    return memcmp(KEYS[k].name, key.p, key.n) == 0 ? k : -1;
}

/* The key at p (its opening quote) and the position past its closing quote; NULL if it is
 * no key of these kinds.  The keys are compared as constants (a few instructions each)
 * where the line is long enough, else read as a string. */
static const char *read_key(const char *p, const char *stop, int *k)
{
    if (stop - p > 19) { /* the longest, "tokens_by_version", with its quotes */
#define KEY(text, id)                                                                   \
    if (memcmp(p, "\"" text "\"", sizeof(text) + 1) == 0) {                              \
        *k = id;                                                                        \
        return p + sizeof(text) + 1;                                                    \
    }
        switch (p[1]) {
        case 't': KEY("t", K_T) KEY("tokens", K_TOKENS)
                  KEY("tokens_by_version", K_TOKENS_BY_VERSION) break;
        case 'r': KEY("run_id", K_RUN_ID) break;
        case 'e': KEY("event", K_EVENT) KEY("epoch", K_EPOCH) break;
        case 'g': KEY("group_id", K_GROUP_ID) KEY("generation_index", K_GENERATION_INDEX) break;
        case 'p': KEY("prompt_id", K_PROMPT_ID) break;
        case 'a': KEY("attempt_id", K_ATTEMPT_ID) break;
        case 'w': KEY("weight_version", K_WEIGHT_VERSION) break;
        case 'c': KEY("calls", K_CALLS) break;
        case 's': KEY("size", K_SIZE) break;
        }
#undef KEY
        return NULL;
    }
    Str name;
    p = read_string(p, stop, &name);
    if (p == NULL || (*k = key_of(name)) < 0)
        return NULL;
    return p;
}

/* The string at p if it is exactly `text` (its bytes plain: checked by the caller). */
static inline const char *read_exactly(const char *p, const char *stop, const char *text,
                                       Py_ssize_t n)
{
    if (stop - p < n + 2 || p[0] != '"' || memcmp(p + 1, text, n) != 0 || p[n + 1] != '"')
        return NULL;
    return p + n + 2;
}

/* The line [p, stop) as a hot event of `kinds` and of the run whose ID is `run` (plain
 * bytes): its kind (KIND_*), or 0 if not certain. */
static int read_line(const char *p, const char *stop, int kinds, const char *run,
                     Py_ssize_t run_length, Line *line)
{
    line->seen = 0;
    line->kind = 0;
    line->other_run = 0;
    line->group_id.n = line->attempt_id.n = 0;
    if ((p = at(p, stop, '{')) == NULL)
        return 0;
    p++;
    for (;;) {
        int k;
        if ((p = at(p, stop, '"')) == NULL || (p = read_key(p, stop, &k)) == NULL)
            return 0;
        if (line->seen & BIT(k))
            return 0;
        line->seen |= BIT(k);
        if ((p = at(p, stop, ':')) == NULL)
            return 0;
        p++;
        if (p < stop && (*p == ' ' || *p == '\t' || *p == '\r'))
            p = skip_ws(p, stop);
        switch (k) {
        case K_T: p = read_number(p, stop, &line->t); break;
        case K_RUN_ID:
            p = read_exactly(p, stop, run, run_length);
            line->other_run = p == NULL;
            break;
        case K_EVENT: {
            const char *q = NULL;
            if ((kinds & KIND_DISPATCH) && (q = read_exactly(p, stop, "attempt.dispatch", 16)))
                line->kind = KIND_DISPATCH;
            else if ((kinds & KIND_SEAL) && (q = read_exactly(p, stop, "attempt.seal", 12)))
                line->kind = KIND_SEAL;
            else if ((kinds & KIND_RESERVE) && (q = read_exactly(p, stop, "group.reserve", 13)))
                line->kind = KIND_RESERVE;
            else if ((kinds & KIND_ADMIT) && (q = read_exactly(p, stop, "group.admit", 11)))
                line->kind = KIND_ADMIT;
            else if ((kinds & KIND_GROUP_SEAL) && (q = read_exactly(p, stop, "group.seal", 10)))
                line->kind = KIND_GROUP_SEAL;
            p = q;
            break;
        }
        case K_GROUP_ID: p = read_string(p, stop, &line->group_id); break;
        case K_ATTEMPT_ID: p = read_string(p, stop, &line->attempt_id); break;
        case K_PROMPT_ID: p = read_int(p, stop, &line->prompt_id, 1, MOST_DIGITS); break;
        case K_GENERATION_INDEX:
            p = read_int(p, stop, &line->generation_index, 0, MOST_DIGITS);
            break;
        case K_WEIGHT_VERSION:
            p = read_int(p, stop, &line->weight_version, 0, MOST_DIGITS);
            break;
        case K_EPOCH: p = read_int(p, stop, &line->epoch, 0, MOST_DIGITS); break;
        case K_TOKENS: p = read_int(p, stop, &line->tokens, 0, MOST_TOKEN_DIGITS); break;
        case K_CALLS: p = read_calls(p, stop); break;
        case K_TOKENS_BY_VERSION: p = read_versions(p, stop, line); break;
        case K_SIZE:
            p = read_int(p, stop, &line->size, 0, MOST_DIGITS);
            if (p != NULL && line->size < 1)
                p = NULL;
            break;
        }
        if (p == NULL)
            return 0;
        if (p < stop && *p == ',') {
            p++;
            continue;
        }
        p = skip_ws(p, stop);
        if (p < stop && *p == ',') {
            p++;
            continue;
        }
        if (p < stop && *p == '}')
            break;
        return 0;
    }
    if (p + 1 != stop && skip_ws(p + 1, stop) != stop)
        return 0;
    if (line->group_id.n == 0)
        return 0;
    unsigned needs, may;
    switch (line->kind) {
    case KIND_DISPATCH: needs = DISPATCH_NEEDS, may = DISPATCH_MAY; break;
    case KIND_SEAL: needs = SEAL_NEEDS, may = SEAL_MAY; break;
    case KIND_RESERVE: needs = RESERVE_NEEDS, may = RESERVE_MAY; break;
    case KIND_ADMIT: needs = ADMIT_NEEDS, may = ADMIT_MAY; break;
    case KIND_GROUP_SEAL: needs = GROUP_SEAL_NEEDS, may = GROUP_SEAL_MAY; break;
    default: return 0;
    }
    if ((line->seen & needs) != needs || (line->seen & ~may))
        return 0;
    if ((needs & BIT(K_ATTEMPT_ID)) && line->attempt_id.n == 0)
        return 0;
    if (line->kind == KIND_GROUP_SEAL) {
        if (!(line->seen & BIT(K_TOKENS_BY_VERSION)))
            line->versions = 0;
        else { /* the schema's rule: tokens is the sum of tokens_by_version */
            long long sum = 0;
            for (int i = 0; i < line->versions; i++)
                sum += line->version_tokens[i];
            if (sum != line->tokens)
                return 0;
        }
    }
    return line->kind;
}

/* Whether a run ID's bytes are written as they are in JSON (none escaped), so that a
 * line's run_id can be compared with them byte for byte. */
static int plain(const char *text, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char b = (unsigned char)text[i];
        if (b < 0x20 || b >= 0x7f || b == '"' || b == '\\')
            return 0;
    }
    return n > 0;
}

#endif
