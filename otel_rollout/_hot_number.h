/* Numbers of a line as msgspec reads them (included by _hot_line.h only): an integer of
 * a few digits exactly, a time as the nearest double.  Anything else is refused (NULL),
 * and the Python path reads the line.
 */
#ifndef OTEL_ROLLOUT_HOT_NUMBER_H
#define OTEL_ROLLOUT_HOT_NUMBER_H

#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* A number t past the common shape (see read_number) of at most this many characters. */
#define MOST_NUMBER_CHARS 32

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

#endif
