/* The Python module around _vsn_kernels.c (included at its end): one function per kernel, each
 * taking its sizes, scalars and buffers (the numpy views of float32 CPU tensors, which
 * foxhunt/models/cpu_kernels.py allocates), never a raw pointer. Before any kernel runs, every
 * buffer is checked: C-contiguous float32, writable where the kernel writes, and exactly as
 * many elements as the sizes say. A violation is a ValueError naming the kernel and the
 * argument, and nothing is written. The kernels run without the GIL.
 *
 * ABI: the version of these functions' arguments, which cpu_kernels.py checks before it calls
 * one; SOURCE: the sha256 of the C sources it was built from (setup.py), which cpu_kernels.py
 * compares with the sources beside it, so that an editable install with a stale build runs
 * the PyTorch path instead of a kernel that no longer matches its caller. */

#define KERNELS_ABI 2
#ifndef KERNELS_SOURCE
#define KERNELS_SOURCE "unknown"
#endif

/* One buffer argument: its spec says whether it is written and whether None will do. */
typedef struct {
    const char *name;
    i64 need;       /* its elements */
    int write;      /* the kernel writes it */
    int optional;   /* None is NULL */
    PyObject *obj;
    Py_buffer view;
    int held;
    float *p;
} Arg;

static int is_float32(const Py_buffer *v) {
    const char *f = v->format ? v->format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    return v->itemsize == 4 && f[0] == 'f' && f[1] == '\0';
}

static void release(Arg *args, int k) {
    for (int i = 0; i < k; i++)
        if (args[i].held) {
            PyBuffer_Release(&args[i].view);
            args[i].held = 0;
        }
}

/* Every buffer of `args` taken and checked; 0 with a ValueError (and none held) otherwise. */
static int take(const char *kernel, Arg *args, int k) {
    for (int i = 0; i < k; i++) {
        Arg *a = &args[i];
        a->p = NULL;
        if (a->obj == Py_None) {
            if (a->optional) continue;
            PyErr_Format(PyExc_ValueError, "foxhunt kernel %s: %s is None", kernel, a->name);
            goto fail;
        }
        int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (a->write ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(a->obj, &a->view, flags) != 0) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "foxhunt kernel %s: %s is not a C-contiguous%s buffer",
                         kernel, a->name, a->write ? ", writable" : "");
            goto fail;
        }
        a->held = 1;
        if (!is_float32(&a->view)) {
            PyErr_Format(PyExc_ValueError, "foxhunt kernel %s: %s is not float32 (format %s)",
                         kernel, a->name, a->view.format ? a->view.format : "B");
            goto fail;
        }
        if (a->need < 0 || a->view.len != a->need * 4) {
            PyErr_Format(PyExc_ValueError,
                         "foxhunt kernel %s: %s has %zd float32 elements, the sizes need %lld",
                         kernel, a->name, a->view.len / 4, (long long)a->need);
            goto fail;
        }
        a->p = (float *)a->view.buf;
    }
    return 1;
fail:
    release(args, k);
    return 0;
}

/* The sizes every kernel assumes: none negative, at least one thread, and a width the
 * vectors and a row on the stack fit (`lanes`: 16 for a width the kernels load 16 floats of at
 * a time, 1 for one only `omp simd` loops run over). */
static int check_sizes(const char *kernel, i64 rows, i64 width, int lanes, int nthreads) {
    if (rows < 0 || width <= 0 || width % lanes != 0 || width > MAX_HIDDEN || nthreads < 1) {
        PyErr_Format(PyExc_ValueError,
                     "foxhunt kernel %s: sizes out of range (rows %lld, width %lld, threads %d; "
                     "the width a multiple of %d up to %d)",
                     kernel, (long long)rows, (long long)width, nthreads, lanes, MAX_HIDDEN);
        return 0;
    }
    return 1;
}

#define ARG(n, size, w, opt) {n, size, w, opt, NULL, {0}, 0, NULL}
#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define P(i) (args[i].p)

static PyObject *py_vsn_elu(PyObject *self, PyObject *py) {
    i64 c, M, dh;
    int nt;
    PyObject *o[4];
    if (!PyArg_ParseTuple(py, "LLLOOOOi", &c, &M, &dh, &o[0], &o[1], &o[2], &o[3], &nt))
        return NULL;
    if (!check_sizes("vsn_elu", c * M, dh, 1, nt)) return NULL;
    Arg args[] = {ARG("x", c * M, 0, 0), ARG("A", c * dh, 0, 0), ARG("C", c * dh, 0, 0),
                  ARG("a", c * M * dh, 1, 0)};
    for (int i = 0; i < COUNT(args); i++) args[i].obj = o[i];
    if (!take("vsn_elu", args, COUNT(args))) return NULL;
    Py_BEGIN_ALLOW_THREADS vsn_elu(c, M, dh, P(0), P(1), P(2), P(3), nt);
    Py_END_ALLOW_THREADS release(args, COUNT(args));
    Py_RETURN_NONE;
}

static PyObject *py_vsn_bias_dropout(PyObject *self, PyObject *py) {
    i64 c, M, dh, j0;
    unsigned long long seed;
    unsigned int threshold;
    float scale;
    int nt;
    PyObject *o[3];
    if (!PyArg_ParseTuple(py, "LLLLKIfOOOi", &c, &M, &dh, &j0, &seed, &threshold, &scale, &o[0],
                          &o[1], &o[2], &nt))
        return NULL;
    if (!check_sizes("vsn_bias_dropout", c * M, dh, 1, nt)) return NULL;
    Arg args[] = {ARG("bias", c * dh, 0, 1), ARG("f", c * M * dh, 1, 0),
                  ARG("sums", (i64)nt * c * dh, 1, 1)};
    for (int i = 0; i < COUNT(args); i++) args[i].obj = o[i];
    if (!take("vsn_bias_dropout", args, COUNT(args))) return NULL;
    Py_BEGIN_ALLOW_THREADS vsn_bias_dropout(c, M, dh, j0, seed, threshold, scale, P(0), P(1),
                                            P(2), nt);
    Py_END_ALLOW_THREADS release(args, COUNT(args));
    Py_RETURN_NONE;
}

/* The gate's arguments (`cpu_kernels.Gate`, after g): bias, s, u, v, R0, R1, R2, gamma, beta. */
static void gate_args(Arg *args, i64 c, i64 M, i64 h) {
    Arg gate[] = {ARG("bias", c * 2 * h, 0, 0), ARG("s", c * M, 0, 0), ARG("u", c * M, 0, 0),
                  ARG("v", c * M, 0, 1),        ARG("R0", c * h, 0, 0), ARG("R1", c * h, 0, 0),
                  ARG("R2", c * h, 0, 1),       ARG("gamma", c * h, 0, 0),
                  ARG("beta", c * h, 0, 0)};
    memcpy(args, gate, sizeof(gate));
}

static PyObject *py_vsn_gate_norm_sum(PyObject *self, PyObject *py) {
    i64 c, M, h;
    float scale;
    int nt;
    PyObject *o[11];
    if (!PyArg_ParseTuple(py, "LLLOOfOOOOOOOOOi", &c, &M, &h, &o[0], &o[1], &scale, &o[2], &o[3],
                          &o[4], &o[5], &o[6], &o[7], &o[8], &o[9], &o[10], &nt))
        return NULL;
    if (!check_sizes("vsn_gate_norm_sum", c * M, h, 16, nt)) return NULL;
    Arg args[11];
    args[0] = (Arg)ARG("g", c * M * 2 * h, 0, 0);
    gate_args(args + 1, c, M, h);
    args[10] = (Arg)ARG("out", M * h, 1, 0);
    for (int i = 0; i < 11; i++) args[i].obj = o[i];
    if (!take("vsn_gate_norm_sum", args, 11)) return NULL;
    Py_BEGIN_ALLOW_THREADS vsn_gate_norm_sum(c, M, h, P(0), P(1), scale, P(2), P(3), P(4), P(5),
                                             P(6), P(7), P(8), P(9), P(10), nt);
    Py_END_ALLOW_THREADS release(args, 11);
    Py_RETURN_NONE;
}

static PyObject *py_vsn_gate_norm_sum_backward(PyObject *self, PyObject *py) {
    i64 c, M, h;
    float scale;
    int nt;
    PyObject *o[16];
    if (!PyArg_ParseTuple(py, "LLLOOfOOOOOOOOOOOOOOi", &c, &M, &h, &o[0], &o[1], &scale, &o[2],
                          &o[3], &o[4], &o[5], &o[6], &o[7], &o[8], &o[9], &o[10], &o[11],
                          &o[12], &o[13], &o[14], &o[15], &nt))
        return NULL;
    if (!check_sizes("vsn_gate_norm_sum_backward", c * M, h, 16, nt)) return NULL;
    Arg args[16];
    args[0] = (Arg)ARG("g", c * M * 2 * h, 0, 0);
    gate_args(args + 1, c, M, h);
    Arg rest[] = {ARG("d_out", M * h, 0, 0), ARG("d_g", c * M * 2 * h, 1, 0),
                  ARG("d_s", c * M, 1, 0),   ARG("d_u", c * M, 1, 0),
                  ARG("d_v", c * M, 1, 1),   ARG("part", (i64)nt * c * P_WIDTH * h, 1, 0)};
    memcpy(args + 10, rest, sizeof(rest));
    for (int i = 0; i < 16; i++) args[i].obj = o[i];
    if (!take("vsn_gate_norm_sum_backward", args, 16)) return NULL;
    Py_BEGIN_ALLOW_THREADS vsn_gate_norm_sum_backward(c, M, h, P(0), P(1), scale, P(2), P(3), P(4),
                                                      P(5), P(6), P(7), P(8), P(9), P(10), P(11),
                                                      P(12), P(13), P(14), P(15), nt);
    Py_END_ALLOW_THREADS release(args, 16);
    Py_RETURN_NONE;
}

static PyObject *py_vsn_forward(PyObject *self, PyObject *py) {
    i64 n, M, dh, h;
    unsigned long long seed;
    unsigned int threshold;
    float scale;
    int nt;
    PyObject *o[17];
    if (!PyArg_ParseTuple(py, "LLLLOOOOOOOKIfOOOOOOOOOOi", &n, &M, &dh, &h, &o[0], &o[1], &o[2],
                          &o[3], &o[4], &o[5], &o[6], &seed, &threshold, &scale, &o[7], &o[8],
                          &o[9], &o[10], &o[11], &o[12], &o[13], &o[14], &o[15], &o[16], &nt))
        return NULL;
    if (!check_sizes("vsn_forward", n * M, h, 16, nt) || !check_sizes("vsn_forward", n * M, dh, 16, nt))
        return NULL;
    Arg args[] = {ARG("x", n * M, 0, 0),       ARG("A", n * dh, 0, 0),
                  ARG("C", n * dh, 0, 0),      ARG("W2", n * dh * dh, 0, 0),
                  ARG("b2", n * dh, 0, 0),     ARG("Wg", n * dh * 2 * h, 0, 0),
                  ARG("bg", n * 2 * h, 0, 0),  ARG("s", n * M, 0, 0),
                  ARG("u", n * M, 0, 0),       ARG("v", n * M, 0, 1),
                  ARG("R0", n * h, 0, 0),      ARG("R1", n * h, 0, 0),
                  ARG("R2", n * h, 0, 1),      ARG("gamma", n * h, 0, 0),
                  ARG("beta", n * h, 0, 0),    ARG("out", M * h, 1, 0),
                  ARG("f_out", n * M * dh, 1, 1)};
    for (int i = 0; i < COUNT(args); i++) args[i].obj = o[i];
    if (!take("vsn_forward", args, COUNT(args))) return NULL;
    Py_BEGIN_ALLOW_THREADS vsn_forward(n, M, dh, h, P(0), P(1), P(2), P(3), P(4), P(5), P(6), seed,
                                       threshold, scale, P(7), P(8), P(9), P(10), P(11), P(12),
                                       P(13), P(14), P(15), P(16), nt);
    Py_END_ALLOW_THREADS release(args, COUNT(args));
    Py_RETURN_NONE;
}

static PyObject *py_vsn_backward_rows(PyObject *self, PyObject *py) {
    i64 c, M, dh, h;
    unsigned long long seed;
    unsigned int threshold;
    float scale;
    int nt;
    PyObject *o[24];
    if (!PyArg_ParseTuple(py, "LLLLOfOOOOOOOOOOOOOOOOOOKIOOOOOi", &c, &M, &dh, &h, &o[0], &scale,
                          &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &o[8], &o[9], &o[10],
                          &o[11], &o[12], &o[13], &o[14], &o[15], &o[16], &o[17], &o[18], &seed,
                          &threshold, &o[19], &o[20], &o[21], &o[22], &o[23], &nt))
        return NULL;
    if (!check_sizes("vsn_backward_rows", c * M, h, 16, nt) ||
        !check_sizes("vsn_backward_rows", c * M, dh, 16, nt))
        return NULL;
    const i64 width = P_WIDTH * h + R_WIDTH * dh + dh * 2 * h + dh * dh;
    Arg args[24];
    gate_args(args, c, M, h);
    Arg rest[] = {ARG("d_out", M * h, 0, 0),        ARG("x", c * M, 0, 0),
                  ARG("A", c * dh, 0, 0),           ARG("C", c * dh, 0, 0),
                  ARG("W2", c * dh * dh, 0, 0),     ARG("b2", c * dh, 0, 0),
                  ARG("Wg", c * dh * 2 * h, 0, 0),  ARG("W2T", c * dh * dh, 0, 0),
                  ARG("WgT", c * 2 * h * dh, 0, 0), ARG("f", c * M * dh, 0, 1),
                  ARG("d_s", c * M, 1, 0),          ARG("d_u", c * M, 1, 0),
                  ARG("d_v", c * M, 1, 1),          ARG("d_x", c * M, 1, 1),
                  ARG("part", (i64)nt * c * width, 1, 0)};
    memcpy(args + 9, rest, sizeof(rest));
    for (int i = 0; i < 24; i++) args[i].obj = o[i];
    if (!take("vsn_backward_rows", args, 24)) return NULL;
    Py_BEGIN_ALLOW_THREADS vsn_backward_rows(
        c, M, dh, h, P(0), scale, P(1), P(2), P(3), P(4), P(5), P(6), P(7), P(8), P(9), P(10),
        P(11), P(12), P(13), P(14), P(15), P(16), P(17), P(18), seed, threshold, P(19), P(20),
        P(21), P(22), P(23), nt);
    Py_END_ALLOW_THREADS release(args, 24);
    Py_RETURN_NONE;
}

static PyObject *py_dropout_flat(PyObject *self, PyObject *py) {
    i64 n;
    unsigned long long seed;
    unsigned int threshold;
    float scale;
    int nt;
    PyObject *o[2];
    if (!PyArg_ParseTuple(py, "LKIfOOi", &n, &seed, &threshold, &scale, &o[0], &o[1], &nt))
        return NULL;
    if (!check_sizes("dropout_flat", n, 1, 1, nt)) return NULL;
    Arg args[] = {ARG("x", n, 0, 0), ARG("out", n, 1, 0)};
    for (int i = 0; i < COUNT(args); i++) args[i].obj = o[i];
    if (!take("dropout_flat", args, COUNT(args))) return NULL;
    Py_BEGIN_ALLOW_THREADS dropout_flat(n, seed, threshold, scale, P(0), P(1), nt);
    Py_END_ALLOW_THREADS release(args, COUNT(args));
    Py_RETURN_NONE;
}

static PyObject *py_gate_add_norm(PyObject *self, PyObject *py) {
    i64 M, h;
    int nt;
    PyObject *o[6];
    if (!PyArg_ParseTuple(py, "LLOOOOOOi", &M, &h, &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &nt))
        return NULL;
    if (!check_sizes("gate_add_norm", M, h, 16, nt)) return NULL;
    Arg args[] = {ARG("g", M * 2 * h, 0, 0), ARG("bias", 2 * h, 0, 0), ARG("skip", M * h, 0, 0),
                  ARG("gamma", h, 0, 0),     ARG("beta", h, 0, 0),     ARG("out", M * h, 1, 0)};
    for (int i = 0; i < COUNT(args); i++) args[i].obj = o[i];
    if (!take("gate_add_norm", args, COUNT(args))) return NULL;
    Py_BEGIN_ALLOW_THREADS gate_add_norm(M, h, P(0), P(1), P(2), P(3), P(4), P(5), nt);
    Py_END_ALLOW_THREADS release(args, COUNT(args));
    Py_RETURN_NONE;
}

static PyObject *py_gate_add_norm_backward(PyObject *self, PyObject *py) {
    i64 M, h;
    int nt;
    PyObject *o[9];
    if (!PyArg_ParseTuple(py, "LLOOOOOOOOOi", &M, &h, &o[0], &o[1], &o[2], &o[3], &o[4], &o[5],
                          &o[6], &o[7], &o[8], &nt))
        return NULL;
    if (!check_sizes("gate_add_norm_backward", M, h, 16, nt)) return NULL;
    Arg args[] = {ARG("g", M * 2 * h, 0, 0),    ARG("bias", 2 * h, 0, 0),
                  ARG("skip", M * h, 0, 0),     ARG("gamma", h, 0, 0),
                  ARG("beta", h, 0, 0),         ARG("d_out", M * h, 0, 0),
                  ARG("d_g", M * 2 * h, 1, 0),  ARG("d_skip", M * h, 1, 0),
                  ARG("part", (i64)nt * 4 * h, 1, 0)};
    for (int i = 0; i < COUNT(args); i++) args[i].obj = o[i];
    if (!take("gate_add_norm_backward", args, COUNT(args))) return NULL;
    Py_BEGIN_ALLOW_THREADS gate_add_norm_backward(M, h, P(0), P(1), P(2), P(3), P(4), P(5), P(6),
                                                  P(7), P(8), nt);
    Py_END_ALLOW_THREADS release(args, COUNT(args));
    Py_RETURN_NONE;
}

static PyObject *py_vsn_elu_backward(PyObject *self, PyObject *py) {
    i64 c, M, dh;
    int nt;
    PyObject *o[6];
    if (!PyArg_ParseTuple(py, "LLLOOOOOOi", &c, &M, &dh, &o[0], &o[1], &o[2], &o[3], &o[4], &o[5],
                          &nt))
        return NULL;
    if (!check_sizes("vsn_elu_backward", c * M, dh, 1, nt)) return NULL;
    Arg args[] = {ARG("x", c * M, 0, 0),         ARG("A", c * dh, 0, 0),
                  ARG("a", c * M * dh, 0, 0),    ARG("d_a", c * M * dh, 0, 0),
                  ARG("d_x", c * M, 1, 1),       ARG("part", (i64)nt * c * 2 * dh, 1, 0)};
    for (int i = 0; i < COUNT(args); i++) args[i].obj = o[i];
    if (!take("vsn_elu_backward", args, COUNT(args))) return NULL;
    Py_BEGIN_ALLOW_THREADS vsn_elu_backward(c, M, dh, P(0), P(1), P(2), P(3), P(4), P(5), nt);
    Py_END_ALLOW_THREADS release(args, COUNT(args));
    Py_RETURN_NONE;
}

static PyObject *py_x86_level(PyObject *self, PyObject *unused) {
    return PyLong_FromLong(vsn_x86_level());
}

/* The OpenMP runtime's thread count for this thread's next parallel region, as the runtime this
 * module is bound to sees it (-1: built without OpenMP): cpu_kernels.py sets torch's and reads
 * it back here, which proves the two share one runtime. */
static PyObject *py_openmp_max_threads(PyObject *self, PyObject *unused) {
#ifdef _OPENMP
    return PyLong_FromLong(omp_get_max_threads());
#else
    return PyLong_FromLong(-1);
#endif
}

#define KERNEL(name) {#name, py_##name, METH_VARARGS, NULL}

static PyMethodDef methods[] = {
    KERNEL(vsn_elu),
    KERNEL(vsn_bias_dropout),
    KERNEL(vsn_gate_norm_sum),
    KERNEL(vsn_gate_norm_sum_backward),
    KERNEL(vsn_forward),
    KERNEL(vsn_backward_rows),
    KERNEL(dropout_flat),
    KERNEL(gate_add_norm),
    KERNEL(gate_add_norm_backward),
    KERNEL(vsn_elu_backward),
    {"x86_level", py_x86_level, METH_NOARGS, "This CPU's x86-64 level (4, 3, or 1)."},
    {"openmp_max_threads", py_openmp_max_threads, METH_NOARGS,
     "omp_get_max_threads() of the runtime this module is bound to (-1: none)."},
    {NULL, NULL, 0, NULL}};

#define STR_(a) #a
#define STR(a) STR_(a)
#define INIT_(name) PyInit_##name
#define INIT(name) INIT_(name)

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, STR(MODULE),
                                    "foxhunt's CPU kernels (foxhunt.models.cpu_kernels)", -1,
                                    methods};

PyMODINIT_FUNC INIT(MODULE)(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "ABI", KERNELS_ABI) < 0 ||
        PyModule_AddIntConstant(m, "VECTOR_WIDTH", VL) < 0 ||
        PyModule_AddStringConstant(m, "SOURCE", KERNELS_SOURCE) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
