/* The critical path's replay kernel in C: replay_kernel.kernel, line for line, over numpy arrays.
 *
 * An optional extension (setup.py builds it where a compiler exists); replay_kernel.compiled() uses
 * it first, then numba, then the plain Python kernel, which is the reference: tests/test_replay_kernel.py
 * checks that all give the same values on real and generated graphs.  It takes the arrays through
 * the buffer protocol (no numpy headers), checks their types, lengths and every index before the
 * loop (a bad index is a ValueError, never a write out of bounds), and releases the GIL while it
 * runs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define WINDOW (-1)
#define NONE (-2)

typedef struct {
    Py_buffer view;
    int held;
} Array;

/* Format characters of an 8-byte integer, a double and a bool, as numpy exports them. */
static int is_format(const char *format, char kind, Py_ssize_t itemsize, Py_ssize_t want) {
    if (itemsize != want || format == NULL)
        return 0;
    while (*format == '<' || *format == '=' || *format == '@' || *format == '!' || *format == '>')
        format++;
    if (kind == 'i')
        return strcmp(format, "l") == 0 || strcmp(format, "q") == 0;
    if (kind == 'f')
        return strcmp(format, "d") == 0;
    return strcmp(format, "?") == 0 || strcmp(format, "b") == 0 || strcmp(format, "B") == 0;
}

static int take(PyObject *obj, Array *a, char kind, int writable, const char *name) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &a->view, flags) < 0)
        return -1;
    a->held = 1;
    if (!is_format(a->view.format, kind, a->view.itemsize, kind == 'b' ? 1 : 8)) {
        PyErr_Format(PyExc_TypeError, "replay: %s must be a contiguous %s array", name,
                     kind == 'i' ? "int64" : kind == 'f' ? "float64" : "bool");
        return -1;
    }
    return 0;
}

static Py_ssize_t len_of(const Array *a) { return a->view.len / a->view.itemsize; }

#define N_ARRAYS 24
static const char *NAMES[N_ARRAYS] = {
    "order", "ptr", "ins", "src", "w", "done", "start_label", "early", "restart", "t",
    "l1", "t1", "w1", "l2", "t2", "w2", "via", "s_l1", "s_t1", "s_w1", "s_l2", "s_t2", "s_w2", "s_via"};
static const char KINDS[N_ARRAYS + 1] = "iiiiffibif" "iffiffi" "iffiffi";

/* Every index the loop follows is in range: nodes, edges, steps. */
static int check(Array *a) {
    const Py_ssize_t n = len_of(&a[9]), n_edges = len_of(&a[3]), n_steps = len_of(&a[17]);
    const int64_t *order = a[0].view.buf, *ptr = a[1].view.buf, *ins = a[2].view.buf, *src = a[3].view.buf;
    const int64_t *restart = a[8].view.buf;
    for (int k = 4; k < 7; k++)
        if (len_of(&a[k]) != (k == 6 ? n : n_edges))
            goto lengths;
    if (len_of(&a[1]) != n + 1 || len_of(&a[7]) != n || len_of(&a[8]) != n)
        goto lengths;
    for (int k = 10; k < 17; k++)
        if (len_of(&a[k]) != n)
            goto lengths;
    for (int k = 17; k < N_ARRAYS; k++)
        if (len_of(&a[k]) != n_steps)
            goto lengths;
    for (Py_ssize_t i = 0; i < len_of(&a[0]); i++)
        if (order[i] < 0 || order[i] >= n)
            goto index;
    if (ptr[0] < 0 || ptr[n] > len_of(&a[2]))
        goto index;
    for (Py_ssize_t v = 0; v < n; v++)
        if (ptr[v] > ptr[v + 1] || restart[v] >= n_steps)
            goto index;
    for (Py_ssize_t j = 0; j < len_of(&a[2]); j++)
        if (ins[j] < 0 || ins[j] >= n_edges)
            goto index;
    for (Py_ssize_t e = 0; e < n_edges; e++)
        if (src[e] < 0 || src[e] >= n)
            goto index;
    return 0;
lengths:
    PyErr_SetString(PyExc_ValueError, "replay: the arrays' lengths do not agree (nodes, edges, steps)");
    return -1;
index:
    PyErr_SetString(PyExc_ValueError, "replay: a node, edge or step index is out of range");
    return -1;
}

/* A node's best and second-best (label, time, work) so far, and the edge of its best. */
typedef struct {
    int64_t bl;
    double bt, bw;
    int64_t sl;
    double st, sw;
    int64_t be;
} Slots;

/* One value (label lx at time x with work wx) arriving by edge e: the kernel's comparisons. */
static inline void offer(Slots *b, int64_t lx, double x, double wx, int64_t e) {
    if (x > b->bt) {
        if (lx != b->bl) {
            b->sl = b->bl; b->st = b->bt; b->sw = b->bw;
        }
        b->bl = lx; b->bt = x; b->bw = wx; b->be = e;
    } else if (lx != b->bl && x > b->st) {
        b->sl = lx; b->st = x; b->sw = wx;
    }
}

static void run(Array *a) {
    const int64_t *order = a[0].view.buf, *ptr = a[1].view.buf, *ins = a[2].view.buf, *src = a[3].view.buf;
    const double *w = a[4].view.buf, *done = a[5].view.buf;
    const int64_t *start_label = a[6].view.buf;
    const char *early = a[7].view.buf;
    const int64_t *restart = a[8].view.buf;
    const double *t = a[9].view.buf;
    int64_t *l1 = a[10].view.buf, *l2 = a[13].view.buf, *via = a[16].view.buf;
    double *t1 = a[11].view.buf, *w1 = a[12].view.buf, *t2 = a[14].view.buf, *w2 = a[15].view.buf;
    int64_t *s_l1 = a[17].view.buf, *s_l2 = a[20].view.buf, *s_via = a[23].view.buf;
    double *s_t1 = a[18].view.buf, *s_w1 = a[19].view.buf, *s_t2 = a[21].view.buf, *s_w2 = a[22].view.buf;
    const Py_ssize_t n_order = len_of(&a[0]);

    for (Py_ssize_t i = 0; i < n_order; i++) {
        const int64_t v = order[i];
        const int64_t label = start_label[v];
        if (label != NONE) {
            l1[v] = label;
            t1[v] = t[v];
            continue;
        }
        const int64_t lo = ptr[v], hi = ptr[v + 1];
        if (early[v] || lo == hi) {
            l1[v] = WINDOW;
            t1[v] = t[v];
            continue;
        }
        Slots b = {NONE, -INFINITY, 0.0, NONE, -INFINITY, 0.0, -1};
        for (int64_t j = lo; j < hi; j++) {
            const int64_t e = ins[j], u = src[e];
            offer(&b, l1[u], t1[u] + w[e], w1[u] + done[e], e);
            if (l2[u] != NONE)
                offer(&b, l2[u], t2[u] + w[e], w2[u] + done[e], e);
        }
        int64_t bl = b.bl, sl = b.sl, be = b.be;
        double bt = b.bt, bw = b.bw, st = b.st, sw = b.sw;
        if (bl == NONE) {
            bl = WINDOW;
            bt = t[v];
        }
        const int64_t k = restart[v];
        if (k >= 0) {
            s_l1[k] = bl; s_t1[k] = bt; s_w1[k] = bw; s_l2[k] = sl; s_t2[k] = st; s_w2[k] = sw; s_via[k] = be;
            bl = -3 - k; bt = t[v]; bw = 0.0; sl = NONE; st = -INFINITY; sw = 0.0; be = -1;
        }
        l1[v] = bl; t1[v] = bt; w1[v] = bw; l2[v] = sl; t2[v] = st; w2[v] = sw; via[v] = be;
    }
}

static PyObject *kernel(PyObject *self, PyObject *args) {
    (void)self;
    if (PyTuple_GET_SIZE(args) != N_ARRAYS)
        return PyErr_Format(PyExc_TypeError, "replay: kernel takes %d arrays", N_ARRAYS);
    Array a[N_ARRAYS];
    memset(a, 0, sizeof(a));
    PyObject *result = NULL;
    for (int k = 0; k < N_ARRAYS; k++)
        if (take(PyTuple_GET_ITEM(args, k), &a[k], KINDS[k], k >= 10, NAMES[k]) < 0)
            goto done;
    if (check(a) < 0)
        goto done;
    Py_BEGIN_ALLOW_THREADS
    run(a);
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    for (int k = 0; k < N_ARRAYS; k++)
        if (a[k].held)
            PyBuffer_Release(&a[k].view);
    return result;
}

static PyMethodDef METHODS[] = {
    {"kernel", kernel, METH_VARARGS,
     "kernel(order, ptr, ins, src, w, done, start_label, early, restart, t, l1, t1, w1, l2, t2, w2, via, "
     "s_l1, s_t1, s_w1, s_l2, s_t2, s_w2, s_via): replay_kernel.kernel over numpy arrays (int64, "
     "float64, bool), the outputs written in place."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_replay",
                                    "The critical path's replay kernel in C (replay_kernel.py).", -1,
                                    METHODS, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__replay(void) { return PyModule_Create(&MODULE); }
