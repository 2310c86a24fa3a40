/* The trace reader's hot loop in C: one pass over a block of Kineto trace events
 * (`[` + events + `]`, JSON) straight into columns, without a Python object per event.
 *
 * It does what `trace._Extractor.add` does with the events msgspec decodes, for the
 * common event: the columns of the GPU, CPU and launch tables, the event count, the
 * earliest start and whether some `ts` is fractional. What only a few events need (a
 * step, a collective, a FLOP operator, an allocation record: the events whose name or
 * arguments the Python code looks at) it leaves to Python: it returns where each of
 * those events lies in the block, and Python decodes them with msgspec.
 *
 * Whatever it does not expect (a type msgspec's schema would refuse, an escaped name or
 * key, a number beyond int64, a duplicate key, a non-standard number, invalid UTF-8 in a
 * name), it gives up on the block and returns None: the caller decodes the block with
 * msgspec, as it did before this module existed, and gets the same result or the same
 * error. Names and categories are numbered by calling back into Python the first time
 * each is met, in file order, so their ids are those the Python reader gives.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <stdlib.h>

#define FLAG_SYNC 2 /* trace._SYNC */
#define MAX_DEPTH 256

/* ---------------------------------------------------------------- growable buffer */
typedef struct {
    char *data;
    Py_ssize_t len, cap;
} Buf;

static int buf_reserve(Buf *b, Py_ssize_t more) {
    if (b->len + more <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more) cap *= 2;
    char *d = PyMem_RawRealloc(b->data, cap); /* the GIL is not held while scanning */
    if (!d) return -1;
    b->data = d;
    b->cap = cap;
    return 0;
}

static inline void put_i64(Buf *b, int64_t v) { memcpy(b->data + b->len, &v, 8); b->len += 8; }

/* ``id`` appended to ``order`` the first time this scan (``epoch``) meets it (``*seen``:
 * the last scan that did); -1 when out of memory */
static int note_first(uint32_t *seen, uint32_t epoch, Buf *order, int64_t id) {
    if (*seen == epoch) return 0;
    *seen = epoch;
    if (buf_reserve(order, 8) < 0) return -1;
    put_i64(order, id);
    return 0;
}
static inline void put_f64(Buf *b, double v) { memcpy(b->data + b->len, &v, 8); b->len += 8; }

/* ---------------------------------------------------------------- string table */
typedef struct {
    char *key;
    Py_ssize_t klen;
    uint64_t hash;
    int64_t id;
    int64_t extra; /* a name's flags; a category's "is a CPU operator category" */
    uint32_t epoch; /* the last scan that met it (its first meeting there is recorded) */
} Entry;

typedef struct {
    Entry *slots;
    Py_ssize_t cap, used;
} Table;

static uint64_t hash_bytes(const char *s, Py_ssize_t n) {
    /* eight bytes at a time (kernel names run to hundreds of bytes) */
    uint64_t h = 1469598103934665603ULL ^ (uint64_t)n;
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        h = (h ^ w) * 0x9E3779B97F4A7C15ULL;
        h ^= h >> 29;
    }
    for (; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
    h ^= h >> 32;
    return h | 1; /* 0 marks an empty slot */
}

static Entry *table_find(Table *t, const char *s, Py_ssize_t n, uint64_t h) {
    if (!t->cap) return NULL;
    Py_ssize_t mask = t->cap - 1, i = (Py_ssize_t)(h & (uint64_t)mask);
    for (;;) {
        Entry *e = &t->slots[i];
        if (!e->hash) return NULL;
        if (e->hash == h && e->klen == n && memcmp(e->key, s, n) == 0) return e;
        i = (i + 1) & mask;
    }
}

static int table_grow(Table *t) {
    Py_ssize_t cap = t->cap ? t->cap * 2 : 256;
    Entry *slots = PyMem_RawCalloc(cap, sizeof(Entry));
    if (!slots) return -1;
    for (Py_ssize_t j = 0; j < t->cap; j++) {
        Entry *e = &t->slots[j];
        if (!e->hash) continue;
        Py_ssize_t i = (Py_ssize_t)(e->hash & (uint64_t)(cap - 1));
        while (slots[i].hash) i = (i + 1) & (cap - 1);
        slots[i] = *e;
    }
    PyMem_RawFree(t->slots);
    t->slots = slots;
    t->cap = cap;
    return 0;
}

static Entry *table_add(Table *t, const char *s, Py_ssize_t n, uint64_t h, int64_t id, int64_t extra) {
    if ((t->used + 1) * 2 > t->cap && table_grow(t) < 0) return NULL; /* no memory */
    char *key = PyMem_RawMalloc(n ? n : 1);
    if (!key) return NULL;
    memcpy(key, s, n);
    Py_ssize_t mask = t->cap - 1, i = (Py_ssize_t)(h & (uint64_t)mask);
    while (t->slots[i].hash) i = (i + 1) & mask;
    Entry *e = &t->slots[i];
    e->key = key; e->klen = n; e->hash = h; e->id = id; e->extra = extra;
    t->used++;
    return e;
}

static void table_free(Table *t) {
    for (Py_ssize_t j = 0; j < t->cap; j++)
        if (t->slots[j].hash) PyMem_RawFree(t->slots[j].key);
    PyMem_RawFree(t->slots);
    t->slots = NULL; t->cap = t->used = 0;
}

/* ---------------------------------------------------------------- JSON lexing */
/* Every function returns 0 when the text is what it expects and -1 when it is not
 * (no Python error set: the block is then handed to msgspec). */
typedef struct {
    const char *p, *end;
} Lex;

static inline void ws(Lex *x) {
    while (x->p < x->end && (*x->p == ' ' || *x->p == '\n' || *x->p == '\r' || *x->p == '\t')) x->p++;
}

static inline int hexd(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* the bytes a string's scan stops at: its closing quote, an escape, a control character */
static unsigned char STOP[256];

static void init_stop(void) {
    for (int c = 0; c < 0x20; c++) STOP[c] = 1;
    STOP['"'] = 1;
    STOP['\\'] = 1;
}

/* a string at x->p (its opening quote); its bytes between the quotes, and whether it has
 * an escape */
static int lex_string(Lex *x, const char **s, Py_ssize_t *n, int *escaped) {
    if (x->p >= x->end || *x->p != '"') return -1;
    const unsigned char *p = (const unsigned char *)++x->p, *end = (const unsigned char *)x->end;
    int esc = 0;
    for (;;) {
        while (p + 4 <= end && !STOP[p[0]] && !STOP[p[1]] && !STOP[p[2]] && !STOP[p[3]]) p += 4;
        while (p < end && !STOP[*p]) p++;
        if (p >= end) return -1;
        if (*p == '"') {
            *s = x->p; *n = (const char *)p - x->p; *escaped = esc; x->p = (const char *)p + 1;
            return 0;
        }
        if (*p < 0x20) return -1; /* control characters are not allowed in a JSON string */
        esc = 1;
        p++; /* the escape */
        if (p >= end) return -1;
        switch (*p) {
        case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
            p++;
            break;
        case 'u':
            if (end - p < 5 || !hexd(p[1]) || !hexd(p[2]) || !hexd(p[3]) || !hexd(p[4])) return -1;
            p += 5;
            break;
        default:
            return -1;
        }
    }
}

enum { NUM_INT, NUM_FLOAT, NUM_BIG };

static const double POW10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* a JSON number: an integer that fits int64 (at most 18 digits) or a float, correctly
 * rounded (exact fast path, else Python's own conversion) */
static int lex_number(Lex *x, int *kind, int64_t *iv, double *dv) {
    const char *p = x->p, *end = x->end, *start = p;
    int neg = 0;
    if (p < end && *p == '-') { neg = 1; p++; }
    if (p >= end || *p < '0' || *p > '9') return -1;
    uint64_t m = 0;
    int digits = 0, frac_digits = 0;
    if (*p == '0') {
        p++;
        if (p < end && *p >= '0' && *p <= '9') return -1; /* leading zero */
    } else {
        while (p < end && *p >= '0' && *p <= '9') {
            if (digits < 19) m = m * 10 + (uint64_t)(*p - '0');
            digits++; p++;
        }
    }
    int is_float = 0, exp = 0;
    if (p < end && *p == '.') {
        is_float = 1; p++;
        if (p >= end || *p < '0' || *p > '9') return -1;
        while (p < end && *p >= '0' && *p <= '9') {
            if (digits + frac_digits < 19) { m = m * 10 + (uint64_t)(*p - '0'); frac_digits++; }
            else if (*p != '0') digits = 99; /* too many significant digits for the fast path */
            p++;
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        is_float = 1; p++;
        int eneg = 0;
        if (p < end && (*p == '+' || *p == '-')) { eneg = *p == '-'; p++; }
        if (p >= end || *p < '0' || *p > '9') return -1;
        while (p < end && *p >= '0' && *p <= '9') {
            if (exp < 100000) exp = exp * 10 + (*p - '0');
            p++;
        }
        if (eneg) exp = -exp;
    }
    x->p = p;
    if (!is_float) {
        if (digits > 18) { *kind = NUM_BIG; return 0; } /* beyond what every int64 holds */
        *kind = NUM_INT;
        *iv = neg ? -(int64_t)m : (int64_t)m;
        return 0;
    }
    *kind = NUM_FLOAT;
    int e10 = exp - frac_digits;
    if (digits + frac_digits <= 19 && m <= (1ULL << 53) && e10 >= -22 && e10 <= 22) {
        double d = (double)m;
        d = e10 < 0 ? d / POW10[-e10] : d * POW10[e10];
        *dv = neg ? -d : d;
        return 0;
    }
    /* the slow path: the C library's correctly rounded conversion of the token's text
     * (without the GIL; a locale whose decimal point is not '.' stops it short, and the
     * block goes to msgspec) */
    char tmp[64];
    Py_ssize_t n = p - start;
    char *text = n < (Py_ssize_t)sizeof tmp ? tmp : PyMem_RawMalloc(n + 1);
    if (!text) return -1;
    memcpy(text, start, n);
    text[n] = 0;
    char *stop = NULL;
    double d = strtod(text, &stop);
    int ok = stop == text + n;
    if (text != tmp) PyMem_RawFree(text);
    if (!ok) return -1;
    if (!isfinite(d)) return -1; /* out of a double's range: msgspec decides */
    *dv = d;
    return 0;
}

static int skip_value(Lex *x, int depth);

static int skip_container(Lex *x, int depth, char close) {
    if (depth > MAX_DEPTH) return -1;
    x->p++; /* the opening bracket */
    ws(x);
    if (x->p < x->end && *x->p == close) { x->p++; return 0; }
    for (;;) {
        if (close == '}') {
            const char *s; Py_ssize_t n; int esc;
            if (lex_string(x, &s, &n, &esc) < 0) return -1;
            ws(x);
            if (x->p >= x->end || *x->p != ':') return -1;
            x->p++;
            ws(x);
        }
        if (skip_value(x, depth + 1) < 0) return -1;
        ws(x);
        if (x->p >= x->end) return -1;
        if (*x->p == ',') { x->p++; ws(x); continue; }
        if (*x->p == close) { x->p++; return 0; }
        return -1;
    }
}

static int lex_literal(Lex *x, const char *word, Py_ssize_t n) {
    if (x->end - x->p < n || memcmp(x->p, word, n) != 0) return -1;
    x->p += n;
    return 0;
}

static int skip_value(Lex *x, int depth) {
    if (x->p >= x->end) return -1;
    switch (*x->p) {
    case '"': { const char *s; Py_ssize_t n; int esc; return lex_string(x, &s, &n, &esc); }
    case '{': return skip_container(x, depth, '}');
    case '[': return skip_container(x, depth, ']');
    case 't': return lex_literal(x, "true", 4);
    case 'f': return lex_literal(x, "false", 5);
    case 'n': return lex_literal(x, "null", 4);
    default: { int k; int64_t i; double d; return lex_number(x, &k, &i, &d); }
    }
}

static inline int is_null(Lex *x) {
    if (x->end - x->p >= 4 && memcmp(x->p, "null", 4) == 0) { x->p += 4; return 1; }
    return 0;
}

static inline int key_is(const char *s, Py_ssize_t n, const char *word, Py_ssize_t wn) {
    return n == wn && memcmp(s, word, wn) == 0;
}

/* ---------------------------------------------------------------- one event */
enum {
    HAS_NAME = 1, HAS_CAT = 2, HAS_TS = 4, HAS_DUR = 8, HAS_ARGS = 16,
    HAS_STREAM = 32, HAS_CORR = 64, HAS_EXT = 128, HAS_DEV = 256, HAS_COLL = 512,
    SEEN_PID = 1024, SEEN_TID = 2048
};

typedef struct {
    unsigned has;
    const char *name, *cat;
    Py_ssize_t name_n, cat_n;
    int64_t pid, tid, stream, corr, ext, dev;
    double ts, dur;
    int ts_float;
} Event;

/* an optional integer argument: an int or null; anything else gives up */
static int arg_int(Lex *x, Event *ev, unsigned bit, int64_t *out) {
    if (ev->has & bit) return -1; /* a duplicate key */
    if (is_null(x)) return 0;
    int k; double d;
    if (lex_number(x, &k, out, &d) < 0 || k != NUM_INT) return -1;
    ev->has |= bit;
    return 0;
}

/* an object's opening brace: 1 when the object is empty (closed too), 0 when members
 * follow, -1 when it is no object */
static int object_open(Lex *x) {
    if (x->p >= x->end || *x->p != '{') return -1;
    x->p++;
    ws(x);
    if (x->p < x->end && *x->p == '}') { x->p++; return 1; }
    return 0;
}

/* an object's member key and its colon (an escaped key gives up: msgspec reads it) */
static int member_key(Lex *x, const char **k, Py_ssize_t *kn) {
    int esc;
    if (lex_string(x, k, kn, &esc) < 0 || esc) return -1;
    ws(x);
    if (x->p >= x->end || *x->p != ':') return -1;
    x->p++;
    ws(x);
    return 0;
}

/* after a member's value: 0 when another member follows (the comma read), 1 when the
 * object closes, -1 on anything else */
static int member_end(Lex *x) {
    ws(x);
    if (x->p >= x->end) return -1;
    if (*x->p == ',') { x->p++; ws(x); return 0; }
    if (*x->p == '}') { x->p++; return 1; }
    return -1;
}

typedef struct {
    Event *ev;
    unsigned seen; /* the keys met so far that must be met once */
} Members;

/* an object's members, each handed to ``member`` with its key (which reads the value):
 * 0 when the object is read through its closing brace, -1 on anything unexpected */
static int walk_object(Lex *x, int (*member)(Lex *, const char *, Py_ssize_t, Members *), Members *m) {
    int r = object_open(x);
    if (r) return r < 0 ? -1 : 0;
    for (;;) {
        const char *k; Py_ssize_t kn;
        if (member_key(x, &k, &kn) < 0 || member(x, k, kn, m) < 0 || (r = member_end(x)) < 0) return -1;
        if (r == 1) return 0;
    }
}

static int args_member(Lex *x, const char *k, Py_ssize_t kn, Members *m) {
    Event *ev = m->ev;
    int r;
    if (key_is(k, kn, "stream", 6)) r = arg_int(x, ev, HAS_STREAM, &ev->stream);
    else if (key_is(k, kn, "correlation", 11)) r = arg_int(x, ev, HAS_CORR, &ev->corr);
    else if (key_is(k, kn, "External id", 11)) r = arg_int(x, ev, HAS_EXT, &ev->ext);
    else if (key_is(k, kn, "device", 6)) r = arg_int(x, ev, HAS_DEV, &ev->dev);
    else if (key_is(k, kn, "Collective name", 15)) {
        if (m->seen & 1) return -1;
        m->seen |= 1;
        if (is_null(x)) r = 0;
        else { ev->has |= HAS_COLL; r = skip_value(x, 2); }
    } else r = skip_value(x, 2);
    return r;
}

static int lex_args(Lex *x, Event *ev) {
    Members m = {ev, 0};
    return walk_object(x, args_member, &m);
}

static int lex_text_field(Lex *x, Event *ev, unsigned bit, unsigned seen_bit, unsigned *seen,
                          const char **s, Py_ssize_t *n) {
    if (*seen & seen_bit) return -1;
    *seen |= seen_bit;
    if (is_null(x)) return 0;
    int esc;
    if (lex_string(x, s, n, &esc) < 0 || esc) return -1; /* not a string, or escaped: msgspec */
    ev->has |= bit;
    return 0;
}

static int lex_time(Lex *x, Event *ev, unsigned bit, unsigned seen_bit, unsigned *seen, double *out,
                    int *is_float) {
    if (*seen & seen_bit) return -1;
    *seen |= seen_bit;
    if (is_null(x)) return 0;
    int k; int64_t i; double d;
    if (lex_number(x, &k, &i, &d) < 0 || k == NUM_BIG) return -1; /* not a number: msgspec's schema refuses it */
    *out = k == NUM_INT ? (double)i : d;
    if (is_float) *is_float = k == NUM_FLOAT;
    ev->has |= bit;
    return 0;
}

/* pid/tid: an int is kept, anything else reads -1 (as the Python reader does) */
static int lex_id(Lex *x, Event *ev, unsigned seen_bit, int64_t *out) {
    if (ev->has & seen_bit) return -1;
    ev->has |= seen_bit;
    *out = -1;
    if (x->p < x->end && (*x->p == '-' || (*x->p >= '0' && *x->p <= '9'))) {
        int k; int64_t i; double d;
        if (lex_number(x, &k, &i, &d) < 0 || k == NUM_BIG) return -1;
        if (k == NUM_INT) *out = i;
        return 0;
    }
    return skip_value(x, 1);
}

static int event_member(Lex *x, const char *k, Py_ssize_t kn, Members *m) {
    Event *ev = m->ev;
    int r;
    if (key_is(k, kn, "name", 4)) r = lex_text_field(x, ev, HAS_NAME, 1, &m->seen, &ev->name, &ev->name_n);
    else if (key_is(k, kn, "cat", 3)) r = lex_text_field(x, ev, HAS_CAT, 2, &m->seen, &ev->cat, &ev->cat_n);
    else if (key_is(k, kn, "ts", 2)) r = lex_time(x, ev, HAS_TS, 4, &m->seen, &ev->ts, &ev->ts_float);
    else if (key_is(k, kn, "dur", 3)) r = lex_time(x, ev, HAS_DUR, 8, &m->seen, &ev->dur, NULL);
    else if (key_is(k, kn, "pid", 3)) r = lex_id(x, ev, SEEN_PID, &ev->pid);
    else if (key_is(k, kn, "tid", 3)) r = lex_id(x, ev, SEEN_TID, &ev->tid);
    else if (key_is(k, kn, "args", 4)) {
        if (m->seen & 16) return -1;
        m->seen |= 16;
        if (is_null(x)) r = 0;
        else if (x->p < x->end && *x->p == '{') { ev->has |= HAS_ARGS; r = lex_args(x, ev); }
        else r = -1; /* args that are not an object: msgspec's schema refuses them */
    } else r = skip_value(x, 1);
    return r;
}

static int lex_event(Lex *x, Event *ev) {
    memset(ev, 0, sizeof *ev);
    ev->pid = ev->tid = -1;
    Members m = {ev, 0};
    return walk_object(x, event_member, &m);
}

/* ---------------------------------------------------------------- the scanner */
typedef struct {
    PyObject_HEAD
    PyObject *intern_name; /* callable(str | None) -> (id, flags) */
    PyObject *intern_cat;  /* callable(str) -> (id, is_cpu); id -1: events of it are left out */
    Table names, cats;
    int64_t none_id, none_flags; /* the id of a missing name, once met (-1 before) */
    uint32_t none_epoch, epoch; /* the scan that last met a missing name; this scan */
    int busy; /* a scan is running (in another thread: the GIL is let go while scanning) */
} Scanner;

#define GPU_COLS 8
#define CPU_COLS 7
#define LAUNCH_COLS 5

static int call_intern(PyObject *fn, PyObject *arg, int64_t *id, int64_t *extra) {
    PyObject *r = PyObject_CallOneArg(fn, arg);
    if (!r) return -1;
    int ok = PyTuple_Check(r) && PyTuple_GET_SIZE(r) == 2;
    if (ok) {
        *id = PyLong_AsLongLong(PyTuple_GET_ITEM(r, 0));
        *extra = PyLong_AsLongLong(PyTuple_GET_ITEM(r, 1));
        ok = !PyErr_Occurred();
    } else {
        PyErr_SetString(PyExc_TypeError, "an intern callback must return (id, int)");
    }
    Py_DECREF(r);
    return ok ? 0 : -1;
}

/* the entry of a name or category; NULL with a Python error set (or *bad = 1 when the
 * bytes are not UTF-8: msgspec then decides) */
static Entry *intern(Table *t, PyObject *fn, const char *s, Py_ssize_t n, int *bad) {
    uint64_t h = hash_bytes(s, n);
    PyObject *text = PyUnicode_DecodeUTF8(s, n, NULL);
    if (!text) { PyErr_Clear(); *bad = 1; return NULL; }
    int64_t id, extra;
    int r = call_intern(fn, text, &id, &extra);
    Py_DECREF(text);
    if (r < 0) return NULL;
    Entry *e = table_add(t, s, n, h, id, extra);
    if (!e) PyErr_NoMemory();
    return e;
}

/* the callbacks are usually bound methods of the object that owns the scanner: a cycle
 * the garbage collector must be able to see and break */
static int scanner_traverse(Scanner *self, visitproc visit, void *arg) {
    Py_VISIT(self->intern_name);
    Py_VISIT(self->intern_cat);
    return 0;
}

static int scanner_clear(Scanner *self) {
    Py_CLEAR(self->intern_name);
    Py_CLEAR(self->intern_cat);
    return 0;
}

static void scanner_dealloc(Scanner *self) {
    PyObject_GC_UnTrack(self);
    scanner_clear(self);
    table_free(&self->names);
    table_free(&self->cats);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int scanner_init(Scanner *self, PyObject *args, PyObject *kwds) {
    static char *kw[] = {"intern_name", "intern_cat", NULL};
    PyObject *n, *c;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO", kw, &n, &c)) return -1;
    if (!PyCallable_Check(n) || !PyCallable_Check(c)) {
        PyErr_SetString(PyExc_TypeError, "Scanner(intern_name, intern_cat) takes two callables");
        return -1;
    }
    Py_INCREF(n); Py_XSETREF(self->intern_name, n);
    Py_INCREF(c); Py_XSETREF(self->intern_cat, c);
    self->none_id = -1;
    return 0;
}

static PyObject *bytes_of(Buf *b) {
    return PyBytes_FromStringAndSize(b->data ? b->data : "", b->len);
}

/* scan(body) -> None when msgspec must decode the block, else
 * (n_events, ts_fractional, min_ts or None, gpu, cpu, launches, rare, name_order,
 * cat_order): gpu/cpu/launches are tuples of bytes (int64 or float64 columns, in
 * trace._Extractor's order), rare the [start, end) offsets of the events Python must see
 * (flat int64 bytes), name_order and cat_order the ids of the names and categories this
 * block numbers, in the order it first meets them (int64 bytes: a scanner kept across
 * blocks numbers each name once, and the blocks are joined by these). */
static PyObject *scanner_scan(Scanner *self, PyObject *arg) {
    Py_buffer view;
    if (!self->intern_name || !self->intern_cat) {
        PyErr_SetString(PyExc_RuntimeError, "the Scanner was not initialised");
        return NULL;
    }
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "a Scanner scans one block at a time");
        return NULL;
    }
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    self->busy = 1;
    Buf gpu[GPU_COLS] = {{0}}, cpu[CPU_COLS] = {{0}}, lau[LAUNCH_COLS] = {{0}}, rare = {0};
    Buf name_order = {0}, cat_order = {0}; /* ids in the order this block first meets them */
    uint32_t epoch = ++self->epoch;
    PyObject *result = NULL;
    int give_up = 0, fractional = 0, have_min = 0;
    int64_t n_events = 0;
    double min_ts = 0;
    Lex x = {(const char *)view.buf, (const char *)view.buf + view.len};
    Lex *X = &x;
    int nomem = 0;
    /* other threads run while this one scans: it takes the GIL back only to number a
     * new name or category (a callback into Python) and to build the result */
    PyThreadState *ts = PyEval_SaveThread();
#define WITH_GIL(stmt) do { PyEval_RestoreThread(ts); stmt; ts = PyEval_SaveThread(); } while (0)

    ws(X);
    if (x.p >= x.end || *x.p != '[') { give_up = 1; goto done; }
    x.p++;
    ws(X);
    if (x.p < x.end && *x.p == ']') { x.p++; goto tail; }
    for (;;) {
        Event ev;
        const char *ev_start = x.p;
        if (lex_event(X, &ev) < 0) { give_up = 1; goto done; }
        const char *ev_end = x.p;
        n_events++;
        if (!(ev.has & HAS_TS) || ev.ts_float) fractional = 1;
        int is_rare = 0;
        if (!(ev.has & HAS_DUR)) {
            if ((ev.has & HAS_NAME) && key_is(ev.name, ev.name_n, "[memory]", 8) && (ev.has & HAS_ARGS) &&
                (ev.has & HAS_TS))
                is_rare = 1;
            goto next;
        }
        if (!(ev.has & HAS_CAT)) goto next;
        int bad = 0;
        Entry *c = table_find(&self->cats, ev.cat, ev.cat_n, hash_bytes(ev.cat, ev.cat_n));
        if (!c) WITH_GIL(c = intern(&self->cats, self->intern_cat, ev.cat, ev.cat_n, &bad));
        if (!c) { if (bad) give_up = 1; goto done; }
        if (c->id < 0) goto next; /* the Trace span */
        if (note_first(&c->epoch, epoch, &cat_order, c->id) < 0) { nomem = 1; goto done; }
        if (!(ev.has & HAS_TS)) goto next;
        if (!have_min || ev.ts < min_ts) { min_ts = ev.ts; have_min = 1; }
        int64_t nid, flags;
        if (ev.has & HAS_NAME) {
            Entry *e = table_find(&self->names, ev.name, ev.name_n, hash_bytes(ev.name, ev.name_n));
            if (!e) WITH_GIL(e = intern(&self->names, self->intern_name, ev.name, ev.name_n, &bad));
            if (!e) { if (bad) give_up = 1; goto done; }
            nid = e->id; flags = e->extra;
            if (note_first(&e->epoch, epoch, &name_order, nid) < 0) { nomem = 1; goto done; }
        } else {
            if (self->none_id < 0) {
                int r;
                WITH_GIL(r = call_intern(self->intern_name, Py_None, &self->none_id, &self->none_flags));
                if (r < 0) goto done;
            }
            nid = self->none_id; flags = self->none_flags;
            if (note_first(&self->none_epoch, epoch, &name_order, nid) < 0) { nomem = 1; goto done; }
        }
        if ((ev.has & HAS_STREAM) && ev.stream != -1) { /* a GPU event */
            for (int i = 0; i < GPU_COLS; i++) if (buf_reserve(&gpu[i], 8) < 0) { nomem = 1; goto done; }
            put_i64(&gpu[0], nid); put_i64(&gpu[1], c->id); put_i64(&gpu[2], ev.stream);
            put_i64(&gpu[3], ev.has & HAS_DEV ? ev.dev : -1);
            put_i64(&gpu[4], ev.has & HAS_CORR ? ev.corr : -1);
            put_i64(&gpu[5], ev.has & HAS_EXT ? ev.ext : -1);
            put_f64(&gpu[6], ev.ts); put_f64(&gpu[7], ev.dur);
            is_rare = flags || (ev.has & HAS_COLL);
            goto next;
        }
        if (c->extra) { /* a CPU operator */
            for (int i = 0; i < CPU_COLS; i++) if (buf_reserve(&cpu[i], 8) < 0) { nomem = 1; goto done; }
            put_i64(&cpu[0], nid); put_i64(&cpu[1], c->id); put_i64(&cpu[2], ev.pid);
            put_i64(&cpu[3], ev.tid); put_i64(&cpu[4], ev.has & HAS_EXT ? ev.ext : -1);
            put_f64(&cpu[5], ev.ts); put_f64(&cpu[6], ev.dur);
        }
        int launch = (ev.has & HAS_CORR) && !(flags && (flags & FLAG_SYNC));
        if (launch) {
            for (int i = 0; i < LAUNCH_COLS; i++) if (buf_reserve(&lau[i], 8) < 0) { nomem = 1; goto done; }
            put_i64(&lau[0], nid); put_i64(&lau[1], ev.tid); put_i64(&lau[2], ev.corr);
            put_f64(&lau[3], ev.ts); put_f64(&lau[4], ev.dur);
        }
        is_rare = flags || (ev.has & HAS_COLL);
    next:
        if (is_rare) {
            if (buf_reserve(&rare, 16) < 0) { nomem = 1; goto done; }
            put_i64(&rare, ev_start - (const char *)view.buf);
            put_i64(&rare, ev_end - (const char *)view.buf);
        }
        ws(X);
        if (x.p >= x.end) { give_up = 1; goto done; }
        if (*x.p == ',') { x.p++; ws(X); continue; }
        if (*x.p == ']') { x.p++; break; }
        give_up = 1;
        goto done;
    }
tail:
    ws(X);
    if (x.p != x.end) { give_up = 1; goto done; }
    PyEval_RestoreThread(ts);
    ts = NULL;
    {
        PyObject *g = PyTuple_New(GPU_COLS), *cp = PyTuple_New(CPU_COLS), *l = PyTuple_New(LAUNCH_COLS);
        PyObject *r = bytes_of(&rare), *no = bytes_of(&name_order), *co = bytes_of(&cat_order);
        PyObject *mt = have_min ? PyFloat_FromDouble(min_ts) : (Py_INCREF(Py_None), Py_None);
        int ok = g && cp && l && r && mt && no && co;
        for (int i = 0; ok && i < GPU_COLS; i++) { PyObject *b = bytes_of(&gpu[i]); ok = b != NULL; if (b) PyTuple_SET_ITEM(g, i, b); }
        for (int i = 0; ok && i < CPU_COLS; i++) { PyObject *b = bytes_of(&cpu[i]); ok = b != NULL; if (b) PyTuple_SET_ITEM(cp, i, b); }
        for (int i = 0; ok && i < LAUNCH_COLS; i++) { PyObject *b = bytes_of(&lau[i]); ok = b != NULL; if (b) PyTuple_SET_ITEM(l, i, b); }
        if (ok) result = Py_BuildValue("(LOOOOOOOO)", (long long)n_events, fractional ? Py_True : Py_False, mt, g, cp, l,
                                       r, no, co);
        Py_XDECREF(g); Py_XDECREF(cp); Py_XDECREF(l); Py_XDECREF(r); Py_XDECREF(mt); Py_XDECREF(no); Py_XDECREF(co);
    }
done:
    if (ts) PyEval_RestoreThread(ts);
#undef WITH_GIL
    if (nomem) PyErr_NoMemory();
    for (int i = 0; i < GPU_COLS; i++) PyMem_RawFree(gpu[i].data);
    for (int i = 0; i < CPU_COLS; i++) PyMem_RawFree(cpu[i].data);
    for (int i = 0; i < LAUNCH_COLS; i++) PyMem_RawFree(lau[i].data);
    PyMem_RawFree(rare.data);
    PyMem_RawFree(name_order.data);
    PyMem_RawFree(cat_order.data);
    PyBuffer_Release(&view);
    self->busy = 0;
    if (give_up && !PyErr_Occurred()) Py_RETURN_NONE;
    return result;
}

static PyMethodDef scanner_methods[] = {
    {"scan", (PyCFunction)scanner_scan, METH_O,
     "scan(body) -> (n_events, ts_fractional, min_ts, gpu, cpu, launches, rare, name_order, cat_order), or None "
     "when the block must be decoded by msgspec"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ScannerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pardiag.analyzers._scan.Scanner",
    .tp_basicsize = sizeof(Scanner),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)scanner_traverse,
    .tp_clear = (inquiry)scanner_clear,
    .tp_doc = "Scanner(intern_name, intern_cat): Kineto trace events to columns",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)scanner_init,
    .tp_dealloc = (destructor)scanner_dealloc,
    .tp_methods = scanner_methods,
};

static struct PyModuleDef scan_module = {
    PyModuleDef_HEAD_INIT, "_scan", "Kineto trace events to columns, in C (see trace.py).", -1, NULL,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__scan(void) {
    init_stop();
    if (PyType_Ready(&ScannerType) < 0) return NULL;
    PyObject *m = PyModule_Create(&scan_module);
    if (!m) return NULL;
    Py_INCREF(&ScannerType);
    if (PyModule_AddObject(m, "Scanner", (PyObject *)&ScannerType) < 0) {
        Py_DECREF(&ScannerType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
