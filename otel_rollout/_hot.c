/* The commonest lines of a trace applied to the one pass's shared state in C.
 *
 * consume(chunk, pos, end, run_id, attempts, groups, epochs, group_type, kinds,
 *         watch_dispatch, watch_seal, trained, seals, waiting)
 *     -> (pos, lines, cold_end, last_t, tokens)
 *
 * Most of a trace is attempt.dispatch, attempt.seal, group.reserve, group.admit and
 * group.seal lines (97% of the bench trace).  Through the Python path each one is decoded into its struct
 * by msgspec and handed to the handlers: ~2.8 us a line, most of a cost pass.  consume() reads the whole lines of
 * chunk[pos:end] from pos and applies each to the shared state exactly as its handlers
 * in analysis/state.py do (see analysis/hot.py for when a pass may), until it meets a
 * line it is not certain of:
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
 *     must see it).
 *
 * Such a line is left to the Python path with every line after it up to the next line
 * that reads as a hot line: chunk[pos:cold_end] (at least one line, unless pos == end).
 * The caller decodes those (reporting any problem with its line number), hands them to
 * the engine, and calls consume() again from cold_end.  So the state sees every event in
 * file order, and a line the C side takes is one the Python path would have taken the
 * same way: a hypothesis test runs both paths over hostile files and compares results.
 *
 * Returned: the position after the lines applied, how many they were, the end of the
 * cold lines after them, the latest t among them (-inf for none) and their seals' tokens.
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#define HAVE_SSE2 1
#endif

/* Integers of at most this many digits are read here (15 digits: below 2^53, so an
 * integer t converts to the same double either way); longer ones go to the Python path. */
#define MOST_DIGITS 15
/* A seal's tokens at most 12 digits: a call's sum of seals stays far inside 64 bits. */
#define MOST_TOKEN_DIGITS 12
/* A number t past the common shape (see read_number) of at most this many characters. */
#define MOST_NUMBER_CHARS 32

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
    double t;
    Str group_id, attempt_id;
    long long prompt_id, generation_index, weight_version, epoch, tokens, size;
    int versions; /* a group seal's tokens_by_version, in the order written */
    long long version[MOST_VERSIONS], version_tokens[MOST_VERSIONS];
} Line;

static PyObject *ATTEMPTS_NAME, *RUN_ID_NAME, *SEALED_TOKENS_NAME, *ZERO;

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

/* A JSON integer of at most `most` digits (negative only if allowed); NULL otherwise, or
 * if a fraction or an exponent follows (msgspec refuses a float for an integer field). */
static const char *read_int(const char *p, const char *stop, long long *out, int negative_ok,
                            int most)
{
    int negative = 0;
    if (p < stop && *p == '-') {
        if (!negative_ok)
            return NULL;
        negative = 1;
        p++;
    }
    if (p >= stop || *p < '0' || *p > '9')
        return NULL;
    const char *digits = p;
    long long value = 0;
    if (*p == '0') {
        p++;
    } else {
        while (p < stop && *p >= '0' && *p <= '9') {
            value = value * 10 + (*p - '0');
            p++;
            if (p - digits > most)
                return NULL;
        }
    }
    if (p < stop && (*p == '.' || *p == 'e' || *p == 'E' || (*p >= '0' && *p <= '9')))
        return NULL;
    *out = negative ? -value : value;
    return p;
}

static const uint64_t POWERS_OF_TEN[20] = {
    1ull, 10ull, 100ull, 1000ull, 10000ull, 100000ull, 1000000ull, 10000000ull,
    100000000ull, 1000000000ull, 10000000000ull, 100000000000ull, 1000000000000ull,
    10000000000000ull, 100000000000000ull, 1000000000000000ull, 10000000000000000ull,
    100000000000000000ull, 1000000000000000000ull, 10000000000000000000ull,
};

/* n / d (both >= 1, below 2^64) as the nearest double, ties to even: exact integer
 * division to 55 bits, then IEEE rounding by hand.  The quotient is between 2^-64 and
 * 2^64, far inside the normal doubles. */
static double divide_rounded(uint64_t n, uint64_t d)
{
    int s = 55 - (64 - __builtin_clzll(n)) + (64 - __builtin_clzll(d));
    unsigned __int128 num = n, den = d;
    if (s >= 0)
        num <<= s; /* at most 55 + 64 bits */
    else
        den <<= -s; /* at most 8 bits more */
    unsigned __int128 q = num / den; /* in (2^54, 2^56): the value is q * 2^-s */
    int sticky = (num % den) != 0;
    if (q >> 55) {
        sticky |= (int)(q & 1);
        q >>= 1;
        s -= 1;
    }
    uint64_t m = (uint64_t)(q >> 2), half = (uint64_t)(q >> 1) & 1;
    sticky |= (int)(q & 1);
    if (half && (sticky || (m & 1)))
        m++; /* m == 2^53 is still exact as a double */
    return ldexp((double)m, 2 - s);
}

/* A JSON number as a finite double, as msgspec reads it (both round correctly): decimals
 * of at most 19 significant digits whose value is an integer below 2^64 divided by a
 * power of ten up to 10^19 here (a float's repr always is, for any time of day); others
 * by PyOS_string_to_double (about 2,200 instructions against 100). */
static const char *read_number(const char *p, const char *stop, double *out)
{
    const char *s = p;
    int negative = 0, digits = 0, fraction = 0, exponent = 0, integer = 1;
    uint64_t w = 0;
    if (p < stop && *p == '-')
        negative = 1, p++;
    if (p >= stop || *p < '0' || *p > '9')
        return NULL;
    if (*p == '0') {
        p++;
    } else {
        while (p < stop && *p >= '0' && *p <= '9') {
            if (++digits > 19)
                return NULL;
            w = w * 10 + (uint64_t)(*p++ - '0');
        }
    }
    if (p < stop && *p == '.') {
        p++;
        integer = 0;
        if (p >= stop || *p < '0' || *p > '9')
            return NULL;
        while (p < stop && *p >= '0' && *p <= '9') {
            if (w == 0 && *p == '0') { /* leading zeros of a fraction: no digit yet */
                fraction++, p++;
                continue;
            }
            if (++digits > 19)
                return NULL;
            w = w * 10 + (uint64_t)(*p++ - '0');
            fraction++;
        }
    }
    if (p < stop && (*p == 'e' || *p == 'E')) {
        int minus = 0, e = 0;
        p++;
        integer = 0;
        if (p < stop && (*p == '+' || *p == '-'))
            minus = *p++ == '-';
        if (p >= stop || *p < '0' || *p > '9')
            return NULL;
        while (p < stop && *p >= '0' && *p <= '9') {
            if (e > 9999)
                return NULL;
            e = e * 10 + (*p++ - '0');
        }
        exponent = minus ? -e : e;
    }
    int power = exponent - fraction;
    double value;
    if (w == 0) {
        value = 0.0;
    } else if (power < 0 && power >= -19) {
        value = divide_rounded(w, POWERS_OF_TEN[-power]);
    } else if (power >= 0 && power <= 19 && w <= UINT64_MAX / POWERS_OF_TEN[power]) {
        value = divide_rounded(w * POWERS_OF_TEN[power], 1);
    } else {
        if (p - s > MOST_NUMBER_CHARS)
            return NULL;
        char text[MOST_NUMBER_CHARS + 1];
        char *parsed_to;
        memcpy(text, s, p - s);
        text[p - s] = '\0';
        value = PyOS_string_to_double(text, &parsed_to, NULL);
        if (value == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return NULL;
        }
        if (parsed_to != text + (p - s) || !isfinite(value))
            return NULL;
        *out = value;
        return p;
    }
    /* msgspec reads an integer as one and converts it: "-0" is 0.0, "-0.0" is -0.0 */
    *out = negative && !(integer && w == 0) ? -value : value;
    return p;
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
        case K_RUN_ID: p = read_exactly(p, stop, run, run_length); break;
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

static PyObject *ascii(Str s)
{
    PyObject *text = PyUnicode_New(s.n, 127);
    if (text != NULL)
        memcpy(PyUnicode_DATA(text), s.p, s.n);
    return text;
}

/* 1 if `key` is in one of `sets`, 0 if not, -1 on error. */
static int watched(PyObject *sets, PyObject *key)
{
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(sets); i++) {
        int found = PySequence_Contains(PyTuple_GET_ITEM(sets, i), key);
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
                PyObject *watch)
{
    PyObject *id = ascii(line->attempt_id), *group_id = NULL, *key = NULL, *held = NULL;
    PyObject *tokens = NULL, *sum = NULL, *group = NULL;
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
    tokens = PyLong_FromLongLong(line->tokens);
    if (tokens == NULL)
        goto done;
    PyObject *before = PyDict_GetItemWithError(held, key);
    if (before == NULL && PyErr_Occurred())
        goto done;
    sum = before != NULL ? PyNumber_Add(before, tokens) : Py_NewRef(tokens);
    if (sum == NULL || PyDict_SetItem(held, key, sum) < 0 ||
        PyObject_SetAttr(group, RUN_ID_NAME, run_id) < 0 || PyDict_DelItem(attempts, id) < 0)
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
    return result;
}

/* State._group_reserve, for a group not in flight (Cost's handler settles one reserved
 * again): groups[group_id] = Group(run_id, epoch or 0, t), and its epoch if given.
 * 1 applied, 0 left to the Python path, -1 on error. */
static int reserve(const Line *line, PyObject *run_id, PyObject *groups, PyObject *epochs,
                   PyObject *group_type)
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
    if (!known) /* one string a group for every record (as State._seal_counts) */
        PyUnicode_InternInPlace(&group_id);
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

static PyObject *consume(PyObject *self, PyObject *args)
{
    Py_buffer chunk;
    Py_ssize_t pos, end;
    PyObject *run_id, *attempts, *groups, *epochs, *group_type, *watch_dispatch, *watch_seal;
    PyObject *trained, *seals, *waiting;
    int kinds;
    if (!PyArg_ParseTuple(args, "y*nnUO!O!O!OiO!O!O!O!O!", &chunk, &pos, &end, &run_id,
                          &PyDict_Type, &attempts, &PyDict_Type, &groups, &PyDict_Type,
                          &epochs, &group_type, &kinds, &PyTuple_Type, &watch_dispatch,
                          &PyTuple_Type, &watch_seal, &PySet_Type, &trained, &PyDict_Type,
                          &seals, &PyDict_Type, &waiting))
        return NULL;
    PyObject *result = NULL;
    if (pos < 0 || end > chunk.len || pos > end) {
        PyErr_SetString(PyExc_ValueError, "consume: pos and end must lie within chunk");
        goto done;
    }
    Py_ssize_t run_length;
    const char *run = PyUnicode_AsUTF8AndSize(run_id, &run_length);
    if (run == NULL)
        goto done;
    const char *base = chunk.buf, *p = base + pos, *stop = base + end;
    if (!plain(run, run_length))
        kinds = 0; /* every line to the Python path */
    Py_ssize_t lines = 0;
    long long tokens = 0;
    double last_t = -INFINITY;
    Line line;
    while (p < stop) {
        const char *newline = memchr(p, '\n', stop - p);
        const char *line_end = newline != NULL ? newline : stop;
        int kind = read_line(p, line_end, kinds, run, run_length, &line);
        if (kind == 0)
            break;
        int applied;
        switch (kind) {
        case KIND_DISPATCH:
            applied = dispatch(&line, run_id, attempts, epochs, watch_dispatch);
            break;
        case KIND_SEAL: applied = seal(&line, run_id, attempts, groups, watch_seal); break;
        case KIND_RESERVE: applied = reserve(&line, run_id, groups, epochs, group_type); break;
        case KIND_GROUP_SEAL: applied = group_seal(&line, groups, trained, seals, waiting); break;
        default: applied = 1; /* group.admit: the pass reads nothing of it */
        }
        if (applied < 0)
            goto done;
        if (applied == 0)
            break;
        if (kind == KIND_SEAL)
            tokens += line.tokens;
        if (line.t > last_t)
            last_t = line.t;
        lines++;
        p = newline != NULL ? newline + 1 : stop;
    }
    /* The cold lines: this one, and those after it up to the next that reads as a hot
     * line (another kind stops the read at its "event", another run at its "run_id"; a
     * file whose every line carries an extra field is then one cold run, not one a line). */
    const char *cold = p;
    if (cold < stop) {
        const char *newline = memchr(cold, '\n', stop - cold);
        cold = newline != NULL ? newline + 1 : stop;
        while (cold < stop) {
            newline = memchr(cold, '\n', stop - cold);
            const char *line_end = newline != NULL ? newline : stop;
            if (read_line(cold, line_end, kinds, run, run_length, &line) != 0)
                break;
            cold = newline != NULL ? newline + 1 : stop;
        }
    }
    result = Py_BuildValue("nnndL", (Py_ssize_t)(p - base), lines, (Py_ssize_t)(cold - base),
                           last_t, tokens);
done:
    PyBuffer_Release(&chunk);
    return result;
}

static PyMethodDef methods[] = {
    {"consume", consume, METH_VARARGS,
     "consume(chunk, pos, end, run_id, attempts, groups, epochs, group_type, kinds, "
     "watch_dispatch, watch_seal, trained, seals, waiting) -> (pos, lines, cold_end, "
     "last_t, tokens): see analysis/hot.py."},
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
    if (ATTEMPTS_NAME == NULL || RUN_ID_NAME == NULL || SEALED_TOKENS_NAME == NULL || ZERO == NULL)
        return NULL;
    return PyModule_Create(&module);
}
