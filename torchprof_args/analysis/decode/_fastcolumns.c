/* One batch of Kineto event text (a JSON array) -> the trace model's columns, without per-event Python
 * objects.
 *
 * The C half of columns.decode_columns (every mode but memory rows): it tokenises the array,
 * validating it as strictly as msgspec does, and writes each complete event's ts, dur, interned
 * (name, cat, pid, tid) key, stream and correlation into growable buffers, returned as bytearrays
 * that Python wraps with numpy; for the comms and FLOPs modes also each event's args.flops, whether
 * it names a collective, and where its text is, so that Python decodes again only the few events
 * whose other fields it needs.  Whenever it meets anything it does not
 * reproduce exactly (a value of an unusual type, an unknown phase, a duplicated field, a number out
 * of range, invalid JSON ...) it returns None and the batch is decoded by the msgspec path, which
 * stays the reference: correctness never depends on what this file covers.  Built by setup.py where a
 * compiler exists (optional); after editing it: python setup.py build_ext --inplace.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#define FAIL (-1) /* not handled here: the caller returns None */
#define PYERR (-2) /* a Python exception is set */
#define MAX_DEPTH 64

/* -- growable buffers ------------------------------------------------------------------------ */
typedef struct {
    char *data;
    size_t len, cap;
} Buf;

static int buf_reserve(Buf *b, size_t extra) {
    if (b->len + extra <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra) cap *= 2;
    char *d = realloc(b->data, cap);
    if (!d) {
        PyErr_NoMemory();
        return PYERR;
    }
    b->data = d;
    b->cap = cap;
    return 0;
}

static int buf_put(Buf *b, const void *src, size_t n) {
    if (!n) return 0; /* (memcpy with a null buffer, even of 0 bytes, is undefined) */
    if (buf_reserve(b, n)) return PYERR;
    memcpy(b->data + b->len, src, n);
    b->len += n;
    return 0;
}

/* -- values ---------------------------------------------------------------------------------- */
/* V_NOINT: a string in an integer field that Python's int() refuses (the field's default, as on the
 * loose path: refused_by_int) */
enum { V_ABSENT = 0, V_STR, V_INT, V_NUM, V_OBJ, V_NULL, V_OTHER, V_NOINT };

typedef struct {
    int type;
    const char *s; /* V_STR: the decoded UTF-8 bytes */
    Py_ssize_t n;
    int64_t i;     /* V_INT */
    double d;      /* V_INT, V_NUM: the value as a float */
} Val;

typedef struct {
    const char *p, *end;
    Buf scratch[5]; /* decoded strings with escapes: name, cat, pid, tid, keys and ph */
} Parser;

static inline void skip_ws(Parser *ps) {
    const char *p = ps->p;
    while (p < ps->end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    ps->p = p;
}

static int hexval(const char *p, const char *end, unsigned *out) {
    if (end - p < 4) return FAIL;
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        char c = p[k];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return FAIL;
    }
    *out = v;
    return 0;
}

/* Length of the valid UTF-8 sequence at p (first byte >= 0x80), 0 if invalid. */
static int utf8_len(const unsigned char *p, const unsigned char *end) {
    unsigned c = p[0];
    if (c >= 0xC2 && c <= 0xDF) {
        return (end - p >= 2 && (p[1] & 0xC0) == 0x80) ? 2 : 0;
    }
    if (c >= 0xE0 && c <= 0xEF) {
        if (end - p < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) return 0;
        if (c == 0xE0 && p[1] < 0xA0) return 0; /* overlong */
        if (c == 0xED && p[1] >= 0xA0) return 0; /* surrogate */
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (end - p < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80) return 0;
        if (c == 0xF0 && p[1] < 0x90) return 0;
        if (c == 0xF4 && p[1] >= 0x90) return 0;
        return 4;
    }
    return 0;
}

static int put_utf8(Buf *b, unsigned cp) {
    char out[4];
    size_t n;
    if (cp < 0x80) {
        out[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        out[0] = (char)(0xF0 | (cp >> 18));
        out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[3] = (char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    return buf_put(b, out, n);
}

/* A string at ps->p (its opening quote); into v its bytes, decoded into ``into`` where it holds
 * escapes (into NULL: validated and skipped). */
static int parse_string(Parser *ps, Val *v, Buf *into) {
    const unsigned char *p = (const unsigned char *)ps->p + 1, *end = (const unsigned char *)ps->end;
    const unsigned char *start = p;
    for (;;) {
#ifdef __SSE2__
        /* 16 bytes at a time up to the first quote, backslash, control or non-ASCII byte */
        const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\'), space = _mm_set1_epi8(0x20);
        while (end - p >= 16) {
            __m128i chunk = _mm_loadu_si128((const __m128i *)p);
            /* a signed compare: bytes >= 0x80 are negative, so "< 0x20" finds them too */
            __m128i stop = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(chunk, quote), _mm_cmpeq_epi8(chunk, backslash)),
                                        _mm_cmpgt_epi8(space, chunk));
            int mask = _mm_movemask_epi8(stop);
            if (mask) {
                p += __builtin_ctz((unsigned)mask);
                break;
            }
            p += 16;
        }
#endif
        while (p < end && *p >= 0x20 && *p != '"' && *p != '\\' && *p < 0x80) p++;
        if (p >= end) return FAIL;
        if (*p == '"') break;
        if (*p >= 0x80) {
            int n = utf8_len(p, end);
            if (!n) return FAIL;
            p += n;
            continue;
        }
        if (*p < 0x20) return FAIL;
        break; /* a backslash: the slow loop below */
    }
    if (*p == '"') {
        if (v) {
            v->type = V_STR;
            v->s = (const char *)start;
            v->n = (const char *)p - (const char *)start;
        }
        ps->p = (const char *)p + 1;
        return 0;
    }
    /* escapes: decode from the start into the scratch buffer */
    if (into) {
        into->len = 0;
        if (buf_put(into, start, (size_t)(p - start))) return PYERR;
    }
    while (p < end) {
        unsigned c = *p;
        if (c == '"') {
            if (v) {
                v->type = V_STR;
                v->s = into ? into->data : NULL;
                v->n = into ? (Py_ssize_t)into->len : 0;
            }
            ps->p = (const char *)p + 1;
            return 0;
        }
        if (c < 0x20) return FAIL;
        if (c >= 0x80) {
            int n = utf8_len(p, end);
            if (!n) return FAIL;
            if (into && buf_put(into, p, (size_t)n)) return PYERR;
            p += n;
            continue;
        }
        if (c != '\\') {
            if (into && buf_put(into, p, 1)) return PYERR;
            p++;
            continue;
        }
        if (end - p < 2) return FAIL;
        char e = (char)p[1], out;
        switch (e) {
        case '"': out = '"'; break;
        case '\\': out = '\\'; break;
        case '/': out = '/'; break;
        case 'b': out = '\b'; break;
        case 'f': out = '\f'; break;
        case 'n': out = '\n'; break;
        case 'r': out = '\r'; break;
        case 't': out = '\t'; break;
        case 'u': {
            unsigned cp;
            if (hexval((const char *)p + 2, (const char *)end, &cp)) return FAIL;
            p += 6;
            if (cp >= 0xDC00 && cp <= 0xDFFF) return FAIL; /* a lone low surrogate */
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                unsigned lo;
                if (end - p < 6 || p[0] != '\\' || p[1] != 'u') return FAIL;
                if (hexval((const char *)p + 2, (const char *)end, &lo)) return FAIL;
                if (lo < 0xDC00 || lo > 0xDFFF) return FAIL;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                p += 6;
            }
            if (into && put_utf8(into, cp)) return PYERR;
            continue;
        }
        default: return FAIL;
        }
        if (into && buf_put(into, &out, 1)) return PYERR;
        p += 2;
    }
    return FAIL;
}

static const double POW10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* A number at ps->p: V_INT for an integer within int64 (its float value too), V_NUM for any
 * other finite number, FAIL where out of range or malformed. */
static int parse_number(Parser *ps, Val *v) {
    const char *p = ps->p, *end = ps->end, *start = p;
    int neg = 0;
    if (p < end && *p == '-') {
        neg = 1;
        p++;
    }
    if (p >= end) return FAIL;
    uint64_t mant = 0;
    int digits = 0, exp10 = 0, is_int = 1, overflow = 0;
    if (*p == '0') {
        p++;
    } else if (*p >= '1' && *p <= '9') {
        while (p < end && *p >= '0' && *p <= '9') {
            if (digits < 19) {
                mant = mant * 10 + (uint64_t)(*p - '0');
                digits++;
            } else {
                overflow = 1;
                exp10++;
            }
            p++;
        }
    } else {
        return FAIL;
    }
    if (p < end && *p == '.') {
        is_int = 0;
        p++;
        if (p >= end || *p < '0' || *p > '9') return FAIL;
        while (p < end && *p >= '0' && *p <= '9') {
            if (mant == 0 && *p == '0') {
                exp10--;
            } else if (digits < 19) {
                mant = mant * 10 + (uint64_t)(*p - '0');
                digits++;
                exp10--;
            } else {
                overflow = 1;
            }
            p++;
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        is_int = 0;
        p++;
        int eneg = 0, e = 0;
        if (p < end && (*p == '+' || *p == '-')) eneg = *p++ == '-';
        if (p >= end || *p < '0' || *p > '9') return FAIL;
        while (p < end && *p >= '0' && *p <= '9') {
            if (e < 100000) e = e * 10 + (*p - '0');
            p++;
        }
        exp10 += eneg ? -e : e;
    }
    ps->p = p;
    if (is_int && !overflow && (mant <= (uint64_t)INT64_MAX || (neg && mant == (uint64_t)INT64_MAX + 1))) {
        int64_t i = neg ? (int64_t)(0 - mant) : (int64_t)mant;
        v->type = V_INT;
        v->i = i;
        v->d = (double)i; /* "-0" is the integer 0: +0.0, as msgspec makes it */
        return 0;
    }
    double d;
    if (!overflow && mant < (1ULL << 53) && exp10 >= -22 && exp10 <= 22) {
        d = (double)mant;
        d = exp10 >= 0 ? d * POW10[exp10] : d / POW10[-exp10];
        if (neg) d = -d;
    } else { /* correctly rounded, locale-independent */
        char small[128], *tmp = small;
        size_t n = (size_t)(p - start);
        if (n >= sizeof(small)) {
            tmp = malloc(n + 1);
            if (!tmp) {
                PyErr_NoMemory();
                return PYERR;
            }
        }
        memcpy(tmp, start, n);
        tmp[n] = 0;
        d = PyOS_string_to_double(tmp, NULL, NULL);
        if (tmp != small) free(tmp);
        if (d == -1.0 && PyErr_Occurred()) return PYERR;
    }
    if (!isfinite(d)) return FAIL; /* msgspec: "Number out of range" */
    v->type = V_NUM;
    v->d = d;
    return 0;
}

/* past an array's "[" or an object's "{" (the text at it): 1 when it is empty, its "]" or "}" (close)
 * passed too */
static int opened_empty(Parser *ps, char close) {
    ps->p++;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        return 1;
    }
    return 0;
}

/* an object member's key (decoded into key; NULL: only checked) and its ":" */
static int member_key(Parser *ps, Val *key) {
    int r;
    skip_ws(ps);
    if (ps->p >= ps->end || *ps->p != '"') return FAIL;
    if ((r = parse_string(ps, key, key ? &ps->scratch[4] : NULL))) return r;
    skip_ws(ps);
    if (ps->p >= ps->end || *ps->p != ':') return FAIL;
    ps->p++;
    return 0;
}

/* after an element or a member's value: 1 at a "," (another follows), 0 past the closing "]" or "}"
 * (close), FAIL else */
static int member_end(Parser *ps, char close) {
    skip_ws(ps);
    if (ps->p >= ps->end) return FAIL;
    if (*ps->p == ',') {
        ps->p++;
        return 1;
    }
    if (*ps->p == close) {
        ps->p++;
        return 0;
    }
    return FAIL;
}

static int skip_value(Parser *ps, int depth);

/* Any value, validated; its type in v (strings and numbers with their value). */
static int parse_value(Parser *ps, Val *v, Buf *into, int depth) {
    skip_ws(ps);
    if (ps->p >= ps->end) return FAIL;
    char c = *ps->p;
    if (c == '"') return parse_string(ps, v, into);
    if (c == '-' || (c >= '0' && c <= '9')) return parse_number(ps, v);
    v->type = V_OTHER;
    return skip_value(ps, depth);
}

static int match_lit(Parser *ps, const char *lit, size_t n) {
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, lit, n) != 0) return FAIL;
    ps->p += n;
    return 0;
}

static int skip_value(Parser *ps, int depth) {
    skip_ws(ps);
    if (ps->p >= ps->end) return FAIL;
    char c = *ps->p;
    Val v;
    int r;
    switch (c) {
    case '"': return parse_string(ps, NULL, NULL);
    case 't': return match_lit(ps, "true", 4);
    case 'f': return match_lit(ps, "false", 5);
    case 'n': return match_lit(ps, "null", 4);
    case '[':
        if (depth >= MAX_DEPTH) return FAIL;
        if (opened_empty(ps, ']')) return 0;
        for (;;) {
            if ((r = skip_value(ps, depth + 1))) return r;
            if ((r = member_end(ps, ']')) <= 0) return r;
        }
    case '{':
        if (depth >= MAX_DEPTH) return FAIL;
        if (opened_empty(ps, '}')) return 0;
        for (;;) {
            if ((r = member_key(ps, NULL))) return r;
            if ((r = skip_value(ps, depth + 1))) return r;
            if ((r = member_end(ps, '}')) <= 0) return r;
        }
    default:
        if (c == '-' || (c >= '0' && c <= '9')) return parse_number(ps, &v);
        return FAIL;
    }
}

/* -- events ---------------------------------------------------------------------------------- */
/* the top-level fields read, and the args fields (both a complete event's and a memory event's) */
enum { F_PH, F_NAME, F_CAT, F_TS, F_DUR, F_PID, F_TID, F_ARGS, N_TOP };
enum { A_STREAM, A_CORR, A_FLOPS, A_KFLOP, A_KGB, A_SEQ, A_TALLOC, A_TRES, A_DTYPE, A_DID, A_ADDR, A_BYTES, A_COLL,
       N_ARGS };

static const char *const TOP_NAMES[N_TOP] = {"ph", "name", "cat", "ts", "dur", "pid", "tid", "args"};
static const char *const ARG_NAMES[N_ARGS] = {
    "stream", "correlation", "flops", "kernel_flop", "kernel_num_gb", "Sequence number",
    "Total Allocated", "Total Reserved", "Device Type", "Device Id", "Addr", "Bytes", "Collective name"};

static int lookup(const char *const *names, int n, const char *s, Py_ssize_t len) {
    if (len == 0 || len > 15) return -1; /* the longest name: 15 bytes */
    for (int k = 0; k < n; k++) {
        if (names[k][0] == s[0] && (Py_ssize_t)strlen(names[k]) == len && memcmp(names[k], s, (size_t)len) == 0)
            return k;
    }
    return -1;
}

/* the args fields read as integers (HTA's rule, the loose path's _int: int(value), else the default) */
static int is_int_arg(int f) {
    return f == A_STREAM || f == A_CORR || f == A_SEQ || f == A_TALLOC || f == A_TRES || f == A_DTYPE
        || f == A_DID || f == A_ADDR || f == A_BYTES;
}

/* A string (its raw text, no escape) that int() refuses for certain: ASCII with a character int()
 * never takes in base 10 (ROCm's stream ids, "0x0").  Anything else (digits, signs, underscores,
 * whitespace, an escape, non-ASCII: Unicode digits) is left to the loose path. */
static int refused_by_int(const Val *v) {
    if (v->s == NULL) return 0; /* it held escapes: not looked at */
    int other = 0;
    for (Py_ssize_t k = 0; k < v->n; k++) {
        unsigned char c = (unsigned char)v->s[k];
        if (c >= 0x80) return 0;
        if (!((c >= '0' && c <= '9') || c == '+' || c == '-' || c == '_' || c == ' ')) other = 1;
    }
    return other;
}

static int parse_args(Parser *ps, Val *args) {
    int r;
    if (opened_empty(ps, '}')) return 0;
    for (;;) {
        Val key;
        if ((r = member_key(ps, &key))) return r;
        int f = lookup(ARG_NAMES, N_ARGS, key.s, key.n);
        if (f < 0) {
            if ((r = skip_value(ps, 2))) return r;
        } else {
            if (args[f].type != V_ABSENT) return FAIL; /* duplicated */
            skip_ws(ps);
            int null = ps->p < ps->end && *ps->p == 'n';
            if ((r = parse_value(ps, &args[f], NULL, 2))) return r;
            if (null) args[f].type = V_NULL;
            if (args[f].type == V_STR)
                args[f].type = is_int_arg(f) && refused_by_int(&args[f]) ? V_NOINT : V_OTHER;
        }
        if ((r = member_end(ps, '}')) <= 0) return r;
    }
}

/* an event's fields; FAIL where one is duplicated or the JSON is malformed */
static int parse_event(Parser *ps, Val *top, Val *args) {
    int r;
    for (int k = 0; k < N_TOP; k++) top[k].type = V_ABSENT;
    for (int k = 0; k < N_ARGS; k++) args[k].type = V_ABSENT;
    if (opened_empty(ps, '}')) return 0;
    for (;;) {
        Val key;
        if ((r = member_key(ps, &key))) return r;
        int f = lookup(TOP_NAMES, N_TOP, key.s, key.n);
        if (f < 0) {
            if ((r = skip_value(ps, 1))) return r;
        } else {
            if (top[f].type != V_ABSENT) return FAIL;
            skip_ws(ps);
            if (f == F_ARGS && ps->p < ps->end && *ps->p == '{') {
                top[f].type = V_OBJ;
                if ((r = parse_args(ps, args))) return r;
            } else {
                /* ph's scratch: its value is compared at once, before another key is decoded */
                Buf *into = f == F_NAME ? &ps->scratch[0] : f == F_CAT ? &ps->scratch[1]
                          : f == F_PID ? &ps->scratch[2] : f == F_TID ? &ps->scratch[3] : &ps->scratch[4];
                if ((r = parse_value(ps, &top[f], into, 1))) return r;
                if (f == F_PH) {
                    if (top[f].type != V_STR || top[f].n != 1) return FAIL;
                    top[f].i = (unsigned char)top[f].s[0];
                }
            }
        }
        if ((r = member_end(ps, '}')) <= 0) return r;
    }
}

/* -- interning ------------------------------------------------------------------------------- */
/* A key part: a string's bytes, or an integer (pid, tid). */
typedef struct {
    uint64_t hash;
    size_t off;   /* into the key arena: name, cat, pid, tid, each as tag byte + length + bytes */
    size_t len;
    int32_t index;
} Slot;

typedef struct {
    Slot *slots;
    size_t cap, used;
    Buf arena;
    PyObject *keys; /* list of (name, cat, pid, tid) tuples in order of first use */
    Buf flags;      /* per key: 1 when its name is a compiled kernel's or function's */
} Interner;

/* a multiplicative hash, 8 bytes at a time */
static uint64_t hash_bytes(const char *p, size_t n) {
    uint64_t h = 14695981039346656037ULL ^ n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0x9E3779B97F4A7C15ULL;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    h = (h ^ w) * 0x9E3779B97F4A7C15ULL;
    return h ^ (h >> 32);
}

/* the canonical bytes of a key part: tag ('s' or 'i'), then the length or the integer */
static int put_part(Buf *b, const Val *v) {
    char tag = v->type == V_STR ? 's' : 'i';
    if (buf_put(b, &tag, 1)) return PYERR;
    if (v->type == V_STR) {
        uint64_t n = (uint64_t)v->n;
        if (buf_put(b, &n, sizeof n)) return PYERR;
        return buf_put(b, v->s, (size_t)v->n);
    }
    return buf_put(b, &v->i, sizeof v->i);
}

static PyObject *part_object(const Val *v) {
    if (v->type == V_STR) return PyUnicode_DecodeUTF8(v->s, v->n, NULL);
    return PyLong_FromLongLong(v->i);
}

static int grow_table(Interner *in) {
    size_t cap = in->cap ? in->cap * 2 : 256;
    Slot *slots = calloc(cap, sizeof(Slot));
    if (!slots) {
        PyErr_NoMemory();
        return PYERR;
    }
    for (size_t k = 0; k < in->cap; k++) {
        if (!in->slots[k].len) continue;
        size_t at = in->slots[k].hash & (cap - 1);
        while (slots[at].len) at = (at + 1) & (cap - 1);
        slots[at] = in->slots[k];
    }
    free(in->slots);
    in->slots = slots;
    in->cap = cap;
    return 0;
}

static int is_compiled_name(const Val *name) {
    if (name->n >= 6 && memcmp(name->s, "triton", 6) == 0) return 1;
    if (name->n == 16 && memcmp(name->s, "CompiledFunction", 16) == 0) return 1;
    if (name->n == 24 && memcmp(name->s, "CompiledFunctionBackward", 24) == 0) return 1;
    return 0;
}

/* The index of (name, cat, pid, tid), added at the end when new; -> *flag its compiled flag. */
static int intern(Interner *in, const Val *const *parts, int32_t *index, char *flag) {
    size_t mark = in->arena.len;
    for (int k = 0; k < 4; k++) {
        if (put_part(&in->arena, parts[k])) return PYERR;
    }
    size_t len = in->arena.len - mark;
    const char *bytes = in->arena.data + mark;
    uint64_t h = hash_bytes(bytes, len);
    if ((in->used + 1) * 2 > in->cap && grow_table(in)) return PYERR;
    bytes = in->arena.data + mark;
    size_t at = h & (in->cap - 1);
    while (in->slots[at].len) {
        Slot *s = &in->slots[at];
        if (s->hash == h && s->len == len && memcmp(in->arena.data + s->off, bytes, len) == 0) {
            in->arena.len = mark; /* known: drop the copy */
            *index = s->index;
            *flag = in->flags.data[s->index];
            return 0;
        }
        at = (at + 1) & (in->cap - 1);
    }
    PyObject *objs[4];
    for (int k = 0; k < 4; k++) {
        objs[k] = part_object(parts[k]);
        if (!objs[k]) {
            for (int j = 0; j < k; j++) Py_DECREF(objs[j]);
            return PYERR;
        }
    }
    PyObject *tuple = PyTuple_Pack(4, objs[0], objs[1], objs[2], objs[3]);
    for (int k = 0; k < 4; k++) Py_DECREF(objs[k]);
    if (!tuple) return PYERR;
    int err = PyList_Append(in->keys, tuple);
    Py_DECREF(tuple);
    if (err) return PYERR;
    char f = (char)is_compiled_name(parts[0]);
    if (buf_put(&in->flags, &f, 1)) return PYERR;
    Slot s = {h, mark, len, (int32_t)(PyList_GET_SIZE(in->keys) - 1)};
    in->slots[at] = s;
    in->used++;
    *index = s.index;
    *flag = f;
    return 0;
}

/* -- the batch ------------------------------------------------------------------------------- */
enum { C_TS, C_DUR, C_KEY, C_STREAM, C_CORR, C_CIDX, C_CROW, C_MEM, C_FLOPS, C_MARKED, C_SPAN, N_COLS };

static int is_skipped_phase(long ph) {
    return ph && strchr("BEbnestfPNODMVvRcC()", (int)ph) != NULL;
}

/* an int field: absent -> default, an integer -> it, anything else: not handled here */
static int int_field(const Val *v, int64_t dflt, int64_t *out) {
    if (v->type == V_ABSENT || v->type == V_NOINT) *out = dflt;
    else if (v->type == V_INT) *out = v->i;
    else return FAIL;
    return 0;
}

static int float_field(const Val *v, double dflt, double *out) {
    if (v->type == V_ABSENT) *out = dflt;
    else if (v->type == V_INT || v->type == V_NUM) *out = v->d;
    else return FAIL;
    return 0;
}

/* pid / tid: an int or a string; absent: 0 */
static int id_field(Val *v) {
    if (v->type == V_ABSENT) {
        v->type = V_INT;
        v->i = 0;
        return 0;
    }
    return v->type == V_INT || v->type == V_STR ? 0 : FAIL;
}

static int decode(Parser *ps, int memory, int wide, Buf *cols, Interner *in, Py_ssize_t *n_events) {
    const char *base = ps->p;
    Val top[N_TOP], args[N_ARGS];
    int r;
    skip_ws(ps);
    if (ps->p >= ps->end || *ps->p != '[') return FAIL;
    ps->p++;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == ']') {
        ps->p++;
    } else {
        for (;;) {
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != '{') return FAIL;
            int64_t span[2] = {ps->p - base, 0};
            if ((r = parse_event(ps, top, args))) return r;
            span[1] = ps->p - base;
            (*n_events)++;
            long ph = top[F_PH].type == V_STR ? (long)top[F_PH].i : 0;
            if (ph == 'X') {
                double ts, dur, kf, kgb, flops;
                int64_t stream, corr, seq;
                if (float_field(&top[F_TS], NAN, &ts) || float_field(&top[F_DUR], NAN, &dur)) return FAIL;
                if (top[F_NAME].type == V_ABSENT) {
                    top[F_NAME].type = V_STR;
                    top[F_NAME].s = "";
                    top[F_NAME].n = 0;
                }
                if (top[F_CAT].type == V_ABSENT) { /* NO_CAT */
                    top[F_CAT].type = V_STR;
                    top[F_CAT].s = "\0";
                    top[F_CAT].n = 1;
                }
                if (top[F_NAME].type != V_STR || top[F_CAT].type != V_STR) return FAIL;
                if (id_field(&top[F_PID]) || id_field(&top[F_TID])) return FAIL;
                if (top[F_ARGS].type != V_ABSENT && top[F_ARGS].type != V_OBJ) return FAIL;
                if (int_field(&args[A_STREAM], -1, &stream) || int_field(&args[A_CORR], -1, &corr)
                    || int_field(&args[A_SEQ], -1, &seq) || float_field(&args[A_FLOPS], 0.0, &flops)
                    || float_field(&args[A_KFLOP], -1.0, &kf) || float_field(&args[A_KGB], -1.0, &kgb))
                    return FAIL;
                int32_t index;
                char compiled;
                const Val *parts[4] = {&top[F_NAME], &top[F_CAT], &top[F_PID], &top[F_TID]};
                if ((r = intern(in, parts, &index, &compiled))) return r;
                int64_t event = (int64_t)(cols[C_TS].len / sizeof(double));
                if (buf_put(&cols[C_TS], &ts, 8) || buf_put(&cols[C_DUR], &dur, 8)
                    || buf_put(&cols[C_KEY], &index, 4) || buf_put(&cols[C_STREAM], &stream, 8)
                    || buf_put(&cols[C_CORR], &corr, 8))
                    return PYERR;
                if (wide) { /* the FLOP count, a collective's name (not null), where the event's text is */
                    char marked = args[A_COLL].type != V_ABSENT && args[A_COLL].type != V_NULL;
                    if (buf_put(&cols[C_FLOPS], &flops, 8) || buf_put(&cols[C_MARKED], &marked, 1)
                        || buf_put(&cols[C_SPAN], span, sizeof span))
                        return PYERR;
                }
                if (compiled) {
                    double row[3] = {kf, kgb, (double)seq};
                    if (buf_put(&cols[C_CIDX], &event, 8) || buf_put(&cols[C_CROW], row, sizeof row))
                        return PYERR;
                }
            } else if (ph == 'i' || ph == 'I') {
                double ts;
                int64_t m[N_ARGS];
                if (top[F_NAME].type == V_ABSENT) {
                    top[F_NAME].type = V_STR;
                    top[F_NAME].n = 0;
                }
                if (top[F_NAME].type != V_STR || float_field(&top[F_TS], NAN, &ts)) return FAIL;
                if (id_field(&top[F_PID]) || id_field(&top[F_TID])) return FAIL;
                if (top[F_ARGS].type != V_ABSENT && top[F_ARGS].type != V_OBJ) return FAIL;
                if (int_field(&args[A_TALLOC], -1, &m[A_TALLOC]) || int_field(&args[A_TRES], -1, &m[A_TRES])
                    || int_field(&args[A_DTYPE], 0, &m[A_DTYPE]) || int_field(&args[A_DID], -1, &m[A_DID])
                    || int_field(&args[A_ADDR], 0, &m[A_ADDR]) || int_field(&args[A_BYTES], 0, &m[A_BYTES]))
                    return FAIL;
                if (memory && top[F_NAME].n == 8 && memcmp(top[F_NAME].s, "[memory]", 8) == 0) {
                    int64_t row[4] = {m[A_TALLOC], m[A_TRES], m[A_DTYPE], m[A_DID]};
                    if (buf_put(&cols[C_MEM], row, sizeof row)) return PYERR;
                }
            } else if (!is_skipped_phase(ph)) {
                return FAIL; /* an unknown or missing phase: the loose path's business */
            }
            skip_ws(ps);
            if (ps->p >= ps->end) return FAIL;
            if (*ps->p == ',') {
                ps->p++;
                continue;
            }
            if (*ps->p == ']') {
                ps->p++;
                break;
            }
            return FAIL;
        }
    }
    skip_ws(ps);
    return ps->p == ps->end ? 0 : FAIL;
}

PyDoc_STRVAR(plain_doc,
"plain(text, memory, wide) -> (n_events, ts, dur, key, stream, corr, keys, compiled_idx, compiled_rows,\n"
"memory, flops, marked, spans) or None\n\n"
"The columns of one batch of event text as bytearrays (float64, float64, int32, int64, int64; int64\n"
"indices and float64 rows of (kernel_flop, kernel_num_gb, sequence) of the events named like compiled\n"
"code; int64 rows of the [memory] events' (allocated, reserved, device type, device id), only when\n"
"``memory``) and the interned keys; with ``wide``, per complete event its args.flops (float64),\n"
"whether its args hold a collective name (not null, uint8) and its text's (start, end) in ``text``\n"
"(int64 pairs), else empty.  None where the text holds anything this decoder does not reproduce\n"
"exactly (the caller decodes it with msgspec).");

static PyObject *plain(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    (void)self;
    if (argc != 3) {
        PyErr_SetString(PyExc_TypeError, "plain(text, memory, wide) takes 3 arguments");
        return NULL;
    }
    int memory = PyObject_IsTrue(argv[1]), wide = PyObject_IsTrue(argv[2]);
    if (memory < 0 || wide < 0) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(argv[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    Parser ps;
    memset(&ps, 0, sizeof ps);
    ps.p = view.buf;
    ps.end = (const char *)view.buf + view.len;
    Buf cols[N_COLS];
    memset(cols, 0, sizeof cols);
    Interner in;
    memset(&in, 0, sizeof in);
    PyObject *result = NULL;
    Py_ssize_t n_events = 0;
    in.keys = PyList_New(0);
    int r = in.keys ? grow_table(&in) : PYERR;
    if (!r) {
        size_t guess = (size_t)view.len / 128 + 16; /* events: ~200-400 bytes each */
        for (int c = 0; c < C_CIDX && !r; c++) r = buf_reserve(&cols[c], guess * 8);
    }
    if (!r) r = decode(&ps, memory, wide, cols, &in, &n_events);
    PyBuffer_Release(&view);
    if (r == FAIL) {
        result = Py_None;
        Py_INCREF(result);
    } else if (!r) {
        PyObject *arrays[N_COLS];
        int c;
        for (c = 0; c < N_COLS; c++) {
            arrays[c] = PyByteArray_FromStringAndSize(cols[c].data ? cols[c].data : "", (Py_ssize_t)cols[c].len);
            if (!arrays[c]) break;
        }
        if (c == N_COLS) {
            result = Py_BuildValue("(nNNNNNONNNNNN)", n_events, arrays[C_TS], arrays[C_DUR], arrays[C_KEY],
                                   arrays[C_STREAM], arrays[C_CORR], in.keys, arrays[C_CIDX], arrays[C_CROW],
                                   arrays[C_MEM], arrays[C_FLOPS], arrays[C_MARKED], arrays[C_SPAN]);
        } else {
            for (int j = 0; j < c; j++) Py_DECREF(arrays[j]);
        }
    }
    for (int c = 0; c < N_COLS; c++) free(cols[c].data);
    for (int k = 0; k < 5; k++) free(ps.scratch[k].data);
    free(in.slots);
    free(in.arena.data);
    free(in.flags.data);
    Py_XDECREF(in.keys);
    return result;
}

static PyMethodDef methods[] = {
    {"plain", (PyCFunction)(void (*)(void))plain, METH_FASTCALL, plain_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fastcolumns",
    "A batch of Kineto event text -> columns in C (columns.decode_columns' fast path).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastcolumns(void) { return PyModule_Create(&module); }
