/* The TFT's elementwise chains on a CPU, each in one pass over memory: the fused variable
 * selection's (foxhunt/models/fused_vsn.py), GateAddNorm's and dropout's (blocks.py,
 * dropout.py), forward and backward.
 *
 * Why hand-written: in PyTorch every step of these chains (ELU, the dropout mask, the biases,
 * GLU, the skip, LayerNorm, its affine, the weighted sum, and their backwards) is its own pass
 * over a [variables, rows, hidden] tensor, about ten per direction; they took two thirds of the
 * fused selection's time at bench config S, and inductor's C++ code for them was slower than
 * the eager passes (docs/performance.md). The large matmuls stay with PyTorch (MKL, oneDNN);
 * with a small variable_dim the selection does its own, row by row, forward and backward (with
 * tft_small's 16 its g = f Wg, [variables, rows, 2 hidden], was the largest tensor of a step,
 * and writing it, reading it back and its gradient bounded the selection's time). Python calls
 * them as torch ops (foxhunt/models/cpu_kernels.py) with float32 tensors it allocated, through
 * the module at the end of this file (_vsn_module.c), which checks every buffer's size and
 * type first; this file allocates nothing, and the memory estimator, which traces the ops'
 * fake implementations, sees every buffer.
 *
 * Threads: OpenMP over rows, on the runtime PyTorch loaded (its libgomp has the same soname),
 * with the thread count the caller passes. Reductions over rows go to one partial buffer per
 * thread, summed by the caller. Dropout masks come from a counter-based hash of (seed, element
 * index): the same for any thread count or chunking, and drawn again in backward, not stored.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

/* Built three times by setup.py, once per instruction set, each with the vector width of its
 * registers: this file as it is for any CPU (4 floats, SSE2 or NEON), and through
 * _vsn_kernels_avx2.c (8, -march=x86-64-v3) and _vsn_kernels_avx512.c (16, -march=x86-64-v4);
 * cpu_kernels.library loads the widest this CPU runs (vsn_x86_level). One width for all would
 * not do: GCC splits a vector wider than the registers into pieces for arithmetic, but its
 * comparisons into one scalar compare per element, and ELU's and exp's selects ran 2-3x slower
 * than PyTorch on an AVX2 CPU with 16-float vectors. */
#ifndef VL
#define VL 4
#endif
#ifndef MODULE
#define MODULE _vsn_kernels
#endif

#define LN_EPS 1e-5f
#define MAX_HIDDEN 4096 /* a row's scratch lives on the stack */

typedef int64_t i64;

/* vectors pass between static inline functions only: no ABI to keep */
#pragma GCC diagnostic ignored "-Wpsabi"

/* The hidden-wide rows are written with GCC's vector types, VL floats at a time (one register),
 * hence hidden % 16 == 0 for every width (cpu_kernels.available checks it): with `omp simd`
 * loops the compiler kept the per-row sums on the stack and masked every loop, and the backward
 * ran 2-3x slower. */
typedef float vf __attribute__((vector_size(4 * VL)));
typedef float vf_u __attribute__((vector_size(4 * VL), aligned(4)));
typedef int32_t vi __attribute__((vector_size(4 * VL)));

static inline vf load(const float *p) { return *(const vf_u *)p; }
static inline void store(float *p, vf v) { *(vf_u *)p = v; }
static inline vf splat(float x) { return (vf){0} + x; }
static inline vf blend(vi mask, vf a, vf b) { return (vf)(((vi)a & mask) | ((vi)b & ~mask)); }

/* The sum of a vector's lanes: a tree of halves in registers (a chain of VL adds would wait on
 * each, and lanes written to memory and read back one by one waited on the store). */
static inline float hsum(vf v) {
    /* each step adds the upper half of what is left onto its lower half (the lanes a mask
     * leaves out are 0: what they get is not used) */
#if defined(__clang__) /* (no __builtin_shuffle; its vectors of halves take other syntax) */
    float sum = 0.0f;
    for (int k = 0; k < VL; k++) sum += v[k];
    return sum;
#else
#if VL >= 16
    v += __builtin_shuffle(v, (vi){8, 9, 10, 11, 12, 13, 14, 15});
#endif
#if VL >= 8
    v += __builtin_shuffle(v, (vi){4, 5, 6, 7});
#endif
    v += __builtin_shuffle(v, (vi){2, 3});
    v += __builtin_shuffle(v, (vi){1});
    return v[0];
#endif
}

/* exp(x) to about 2 ulp (Cephes' expf polynomial) in vector operations: libm's expf is a call
 * per element. */
static inline vf vexp(vf x) {
    x = blend(x < splat(-87.0f), splat(-87.0f), x);
    x = blend(x > splat(88.0f), splat(88.0f), x);
    const vf magic = splat(12582912.0f); /* 1.5 * 2^23: adding it rounds to an integer */
    vf n = (x * 1.44269504088896341f + magic) - magic;
    vf r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    vf p = splat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    vf y = p * r * r + r + 1.0f;
    vi bits = (__builtin_convertvector(n, vi) + 127) << 23;
    return y * (vf)bits;
}

/* 1 / d: the CPU's reciprocal estimate (14 or 12 bits) and one Newton step, to about 1 ulp
 * (2^-23); a division where there is none. The sigmoids' divisions took a tenth of the
 * selection's forward at S. */
static inline vf vrecip(vf d) {
#if defined(__AVX512F__) && VL == 16
    vf r = (vf)_mm512_rcp14_ps((__m512)d);
#elif defined(__AVX__) && VL == 8
    vf r = (vf)_mm256_rcp_ps((__m256)d);
#elif defined(__SSE__) && VL == 4
    vf r = (vf)_mm_rcp_ps((__m128)d);
#else
    return 1.0f / d;
#endif
    return r * (2.0f - d * r);
}

static inline vf vsigmoid(vf x) { return vrecip(1.0f + vexp(-x)); }

/* The scalar exp for the variable_dim-wide loops below, which `omp simd` vectorizes (their
 * width need not be a multiple of 16). */
static inline float fast_exp(float x) {
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    const float magic = 12582912.0f;
    float n = (x * 1.44269504088896341f + magic) - magic;
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return y * scale;
}

/* The dropout hash: lowbias32 (Chris Wellons' integer hash). */
static inline uint32_t mix32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

/* The key of the row that starts at element `start`: the seed and the index's high bits. */
static inline uint32_t row_key(uint64_t seed, uint64_t start) {
    return mix32((uint32_t)seed ^ mix32((uint32_t)(seed >> 32) ^ (uint32_t)(start >> 32)));
}

/* 1 if element `start + k` is kept: its hash's top 16 bits clear `threshold` (p * 65536). */
static inline float kept(uint32_t key, uint64_t start, i64 k, uint32_t threshold) {
    uint32_t h = mix32(((uint32_t)start + (uint32_t)k) * 0x9E3779B9U ^ key);
    return (h >> 16) >= threshold ? 1.0f : 0.0f;
}

static int threads(int n) {
#ifdef _OPENMP
    return n > 0 ? n : 1;
#else
    (void)n;
    return 1;
#endif
}

static int thread_id(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* The team's size, which OpenMP may make smaller than asked (nested in another parallel
 * region, a thread limit): the rows are split among the threads that run. */
static int team(void) {
#ifdef _OPENMP
    return omp_get_num_threads();
#else
    return 1;
#endif
}

static void row_range(i64 rows, int t, int nt, i64 *lo, i64 *hi) {
    i64 per = rows / nt, extra = rows % nt;
    *lo = t * per + (t < extra ? t : extra);
    *hi = *lo + per + (t < extra ? 1 : 0);
}

/* ---- a = ELU(x A + C): [c, M, dh] from x [c, M], A and C [c, dh] ---------------------------- */

static void elu_rows(i64 c, i64 M, i64 dh, const float *x, const float *A,
                     const float *C, float *a, int t, int nt) {
    i64 lo, hi;
    row_range(c * M, t, nt, &lo, &hi);
    for (i64 r = lo; r < hi; r++) {
        i64 j = r / M;
        const float xv = x[r], *Aj = A + j * dh, *Cj = C + j * dh;
        float *ar = a + r * dh;
#pragma omp simd
        for (i64 k = 0; k < dh; k++) {
            float h1 = xv * Aj[k] + Cj[k];
            ar[k] = h1 > 0.0f ? h1 : fast_exp(h1) - 1.0f;
        }
    }
}

void vsn_elu(i64 c, i64 M, i64 dh, const float *x, const float *A, const float *C, float *a,
             int nthreads) {
    int nt = threads(nthreads);
#pragma omp parallel num_threads(nt)
    elu_rows(c, M, dh, x, A, C, a, thread_id(), team());
}

/* ---- f = (f + bias) * keep * scale, with the dropout mask of variables j0.. ---------------- */

static void bias_dropout_rows(i64 c, i64 M, i64 dh, i64 j0, uint64_t seed,
                              uint32_t threshold, float scale, const float *bias,
                              float *f, float *sums, int t, int nt) {
    i64 lo, hi;
    row_range(c * M, t, nt, &lo, &hi);
    for (i64 r = lo; r < hi; r++) {
        i64 j = r / M;
        uint64_t start = (uint64_t)(j0 * M + r) * (uint64_t)dh;
        uint32_t key = row_key(seed, start);
        float *fr = f + r * dh;
        const float *b = bias ? bias + j * dh : NULL;
        if (b) {
#pragma omp simd
            for (i64 k = 0; k < dh; k++) fr[k] += b[k];
        }
        if (threshold) {
#pragma omp simd
            for (i64 k = 0; k < dh; k++) fr[k] *= kept(key, start, k, threshold) * scale;
        }
        if (sums) { /* backward: fc2's bias gradient is the masked gradient's sum */
            float *acc = sums + j * dh;
#pragma omp simd
            for (i64 k = 0; k < dh; k++) acc[k] += fr[k];
        }
    }
}

/* f [c, M, dh] = (f + bias) * keep * scale in place (bias [c, dh] may be NULL; threshold 0:
 * nothing dropped, scale ignored); with `sums` (per-thread partial sums [nthreads, c, dh],
 * zeroed here) also the sums over the rows of the result. */
void vsn_bias_dropout(i64 c, i64 M, i64 dh, i64 j0, uint64_t seed, uint32_t threshold,
                      float scale, const float *bias, float *f, float *sums, int nthreads) {
    int nt = threads(nthreads);
    if (sums) memset(sums, 0, sizeof(float) * (size_t)(nt * c * dh));
#pragma omp parallel num_threads(nt)
    {
        int t = thread_id();
        bias_dropout_rows(c, M, dh, j0, seed, threshold, scale, bias, f,
                          sums ? sums + t * c * dh : NULL, t, team());
    }
}

/* ---- the gate, the skip, LayerNorm and the weighted sum ------------------------------------ */

/* The inputs of one variable's rows: g [M, 2h] as the matmul left it, and what turns it into
 * LayerNorm(GLU(scale g + bias) + R0 + u R1 + v R2) * gamma + beta. */
typedef struct {
    const float *g, *bias, *u, *v, *R0, *R1, *R2, *gamma, *beta;
    float scale;
    const float *skip; /* instead of R0 + u R1 + v R2: a skip of its own per row, [M, h] */
} Gate;

static Gate gate_of(i64 j, i64 M, i64 h, const float *g, const float *bias, float scale,
                    const float *u, const float *v, const float *R0, const float *R1,
                    const float *R2, const float *gamma, const float *beta) {
    Gate q = {g ? g + j * M * 2 * h : NULL, bias + j * 2 * h, u + j * M, v ? v + j * M : NULL,
              R0 + j * h, R1 + j * h, R2 ? R2 + j * h : NULL, gamma + j * h, beta + j * h,
              scale, NULL};
    return q;
}

/* Row m of a variable, its g row `gr`: z (scratch, h) = GLU(...) + skip, xhat (into z) and its
 * 1/std; with `ga`, also the GLU's half a and sigmoid(b) for backward (scratch, h each). */
static inline float normalized_row(const Gate *q, i64 h, i64 m, const float *gr, float *z,
                                   float *ga, float *sg) {
    const float u = q->u ? q->u[m] : 0.0f, v = q->v ? q->v[m] : 0.0f;
    const float *skip = q->skip ? q->skip + m * h : NULL;
    /* the moments of z - shift, shift one of its elements: one pass for both sums, without the
     * cancellation of sum(z^2) - sum(z)^2 when the mean is large against the spread */
    vf sum = {0}, sq = {0};
    float shift = 0.0f;
    for (i64 k = 0; k < h; k += VL) {
        vf a = load(gr + k) * q->scale + load(q->bias + k);
        vf s = vsigmoid(load(gr + h + k) * q->scale + load(q->bias + h + k));
        vf zk = a * s;
        if (skip) {
            zk += load(skip + k);
        } else {
            zk += load(q->R0 + k) + u * load(q->R1 + k);
            if (q->R2) zk += v * load(q->R2 + k);
        }
        store(z + k, zk);
        if (ga) {
            store(ga + k, a);
            store(sg + k, s);
        }
        if (k == 0) shift = zk[0];
        vf d = zk - shift;
        sum += d;
        sq += d * d;
    }
    const float mean_d = hsum(sum) / (float)h, var = hsum(sq) / (float)h - mean_d * mean_d;
    const float mean = shift + mean_d;
    const float rstd = 1.0f / sqrtf((var > 0.0f ? var : 0.0f) + LN_EPS);
    for (i64 k = 0; k < h; k += VL) store(z + k, (load(z + k) - mean) * rstd);
    return rstd;
}

static void gate_rows(i64 c, i64 M, i64 h, const float *g, const float *bias,
                      float scale, const float *s, const float *u, const float *v,
                      const float *R0, const float *R1, const float *R2,
                      const float *gamma, const float *beta, float *out, int t, int nt) {
    float z[MAX_HIDDEN];
    i64 lo, hi;
    row_range(M, t, nt, &lo, &hi);
    for (i64 j = 0; j < c; j++) {
        Gate q = gate_of(j, M, h, g, bias, scale, u, v, R0, R1, R2, gamma, beta);
        for (i64 m = lo; m < hi; m++) {
            normalized_row(&q, h, m, q.g + m * 2 * h, z, NULL, NULL);
            const float w = s[j * M + m];
            float *o = out + m * h;
            for (i64 k = 0; k < h; k += VL)
                store(o + k, load(o + k) + w * (load(z + k) * load(q.gamma + k) + load(q.beta + k)));
        }
    }
}

/* out [M, h] += sum_j s_j (LayerNorm_j(GLU(scale g_j + bias_j) + R0_j + u_j R1_j + v_j R2_j))
 * over the c variables of a chunk: g [c, M, 2h]; bias [c, 2h]; s, u, v [c, M]; R0, R1, R2,
 * gamma, beta [c, h]. v and R2 may be NULL (no resampled skip). */
void vsn_gate_norm_sum(i64 c, i64 M, i64 h, const float *g, const float *bias, float scale,
                       const float *s, const float *u, const float *v, const float *R0,
                       const float *R1, const float *R2, const float *gamma, const float *beta,
                       float *out, int nthreads) {
    int nt = threads(nthreads);
#pragma omp parallel num_threads(nt)
    gate_rows(c, M, h, g, bias, scale, s, u, v, R0, R1, R2, gamma, beta, out, thread_id(), team());
}

/* Where a row's gradients of the gate's parameters add up (per thread and variable, each h
 * wide, bias 2h). */
typedef struct {
    float *gamma, *beta, *R0, *R1, *R2, *bias;
} GateSums;

/* The backward of row m of a variable (its g row `gr`, weight w = s_m): d_g (2h, the gradient
 * of scale g + bias) and the row's d_s, d_u, d_v in *ds, *du, *dv (with q->skip: the skip's
 * gradient in d_skip, h), its parts of the parameters' gradients added to `acc`. Scratch: xh,
 * ga, sg, dx, h each. */
static inline void gate_row_backward(const Gate *q, i64 h, i64 m, const float *gr, float w,
                                     const float *dy, GateSums acc, float *dg, float *ds_out,
                                     float *du_out, float *dv_out, float *d_skip, float *xh,
                                     float *ga, float *sg, float *dx) {
    const float rstd = normalized_row(q, h, m, gr, xh, ga, sg);
    /* the weighted sum and the affine (d_s, d_gamma, d_beta); LayerNorm's input gradient from
     * d_xhat = w d_out gamma */
    vf ds = {0}, sum_dx = {0}, sum_dx_xh = {0};
    for (i64 k = 0; k < h; k += VL) {
        vf x = load(xh + k), d = load(dy + k), gm = load(q->gamma + k);
        vf e = x * d;
        store(acc.gamma + k, load(acc.gamma + k) + w * e);
        store(acc.beta + k, load(acc.beta + k) + w * d);
        ds += e * gm + d * load(q->beta + k);
        vf dxk = w * d * gm;
        store(dx + k, dxk);
        sum_dx += dxk;
        sum_dx_xh += dxk * x;
    }
    *ds_out = hsum(ds);
    const float a1 = hsum(sum_dx) / (float)h, a2 = hsum(sum_dx_xh) / (float)h;
    const float uu = q->u ? q->u[m] : 0.0f, vv = q->v ? q->v[m] : 0.0f;
    vf du = {0}, dv = {0};
    for (i64 k = 0; k < h; k += VL) {
        vf dz = rstd * (load(dx + k) - a1 - load(xh + k) * a2); /* d(GLU + skip) */
        if (d_skip) {
            store(d_skip + k, dz);
        } else {
            store(acc.R0 + k, load(acc.R0 + k) + dz);
            store(acc.R1 + k, load(acc.R1 + k) + uu * dz);
            du += dz * load(q->R1 + k);
            if (q->R2) {
                store(acc.R2 + k, load(acc.R2 + k) + vv * dz);
                dv += dz * load(q->R2 + k);
            }
        }
        vf sk = load(sg + k);
        vf da = dz * sk, db = dz * load(ga + k) * sk * (1.0f - sk);
        store(dg + k, da);
        store(dg + h + k, db);
        store(acc.bias + k, load(acc.bias + k) + da);
        store(acc.bias + h + k, load(acc.bias + h + k) + db);
    }
    *du_out = hsum(du);
    *dv_out = hsum(dv);
}

/* Partial sums per thread and variable, in this order, each h wide except d_bias (2h). */
enum { P_GAMMA, P_BETA, P_R0, P_R1, P_R2, P_BIAS, P_WIDTH = 7 };

static void gate_backward_rows(i64 c, i64 M, i64 h, const float *g, const float *bias,
                               float scale, const float *s, const float *u,
                               const float *v, const float *R0, const float *R1,
                               const float *R2, const float *gamma, const float *beta,
                               const float *d_out, float *d_g, float *d_s, float *d_u,
                               float *d_v, float *part, int t, int nt) {
    float xh[MAX_HIDDEN], ga[MAX_HIDDEN], sg[MAX_HIDDEN], dx[MAX_HIDDEN];
    i64 lo, hi;
    row_range(M, t, nt, &lo, &hi);
    for (i64 j = 0; j < c; j++) {
        Gate q = gate_of(j, M, h, g, bias, scale, u, v, R0, R1, R2, gamma, beta);
        float *p = part + j * P_WIDTH * h;
        GateSums acc = {p + P_GAMMA * h, p + P_BETA * h, p + P_R0 * h,
                        p + P_R1 * h,    p + P_R2 * h,   p + P_BIAS * h};
        for (i64 m = lo; m < hi; m++) {
            const i64 r = j * M + m;
            float dv;
            gate_row_backward(&q, h, m, q.g + m * 2 * h, s[r], d_out + m * h, acc,
                              d_g + r * 2 * h, d_s + r, d_u + r, &dv, NULL, xh, ga, sg, dx);
            if (d_v) d_v[r] = dv;
        }
    }
}

/* The backward of vsn_gate_norm_sum: d_g [c, M, 2h] (the gradient of scale g + bias); d_s,
 * d_u, d_v [c, M]; and per-thread partial sums part [nthreads, c, 7h] (zeroed here) of
 * d_gamma, d_beta, d_R0, d_R1, d_R2 and d_bias (2h), in that order. */
void vsn_gate_norm_sum_backward(i64 c, i64 M, i64 h, const float *g, const float *bias,
                                float scale, const float *s, const float *u, const float *v,
                                const float *R0, const float *R1, const float *R2,
                                const float *gamma, const float *beta, const float *d_out,
                                float *d_g, float *d_s, float *d_u, float *d_v, float *part,
                                int nthreads) {
    int nt = threads(nthreads);
    memset(part, 0, sizeof(float) * (size_t)(nt * c * P_WIDTH * h));
#pragma omp parallel num_threads(nt)
    {
        int t = thread_id();
        gate_backward_rows(c, M, h, g, bias, scale, s, u, v, R0, R1, R2, gamma, beta, d_out,
                           d_g, d_s, d_u, d_v, part + t * c * P_WIDTH * h, t, team());
    }
}

/* ---- the whole forward of a variable's rows, for a small variable_dim ----------------------- */

/* Row m of variable j from its scalar x: a = ELU(x A + C) and f = (a W2 + b2) keep, each dh
 * wide, into the scratch given. */
static inline void fc2_row(i64 dh, float xv, const float *A, const float *C, const float *W2,
                           const float *b2, uint64_t seed, uint32_t threshold, uint64_t start,
                           float *a, float *f) {
    for (i64 k = 0; k < dh; k += VL) {
        vf h1 = xv * load(A + k) + load(C + k);
        store(a + k, blend(h1 > 0.0f, h1, vexp(h1) - 1.0f));
    }
    for (i64 k = 0; k < dh; k += VL) { /* four sums: one would wait on each FMA */
        vf acc[4] = {load(b2 + k)};
        for (i64 i = 0; i < dh; i += 4)
            for (int u = 0; u < 4; u++) acc[u] += a[i + u] * load(W2 + (i + u) * dh + k);
        store(f + k, (acc[0] + acc[1]) + (acc[2] + acc[3]));
    }
    if (threshold) {
        uint32_t key = row_key(seed, start);
#pragma omp simd
        for (i64 k = 0; k < dh; k++) f[k] *= kept(key, start, k, threshold);
    }
}

/* out[a, :N] = (add: +=) sum_k P(a, k) W[k, :N] for rows a < na, P(a, k) = P[a sa + k sk]: rows
 * of scalars times a matrix, the row-by-row matmuls of the kernels below (g = f Wg, its
 * gradient's d_g Wg^T, and the weights' gradients, sum over rows of f^T d_g). RB rows and VB
 * vectors of out stay in registers through k, so that each load of W serves RB rows and each
 * scalar of P VB vectors (one row at a time, each multiply-add waited on two loads). */
static inline __attribute__((always_inline)) void rows_block(i64 K, i64 N, const float *P,
                                                             i64 sa, i64 sk, const float *W,
                                                             float *out, int add, int RB,
                                                             int VB) {
    vf acc[8][4];
    for (int a = 0; a < RB; a++)
        for (int b = 0; b < VB; b++) acc[a][b] = add ? load(out + a * N + b * VL) : (vf){0};
    for (i64 k = 0; k < K; k++) {
        vf w[4];
        for (int b = 0; b < VB; b++) w[b] = load(W + k * N + b * VL);
        for (int a = 0; a < RB; a++) {
            const float pa = P[a * sa + k * sk];
            for (int b = 0; b < VB; b++) acc[a][b] += pa * w[b];
        }
    }
    for (int a = 0; a < RB; a++)
        for (int b = 0; b < VB; b++) store(out + a * N + b * VL, acc[a][b]);
}

/* The blocks of rows_block over all rows and columns, each (RB, VB) its own unrolled copy:
 * 16 sums in registers where 32 registers hold them (AVX-512), 8 where there are 16. */
static inline __attribute__((always_inline)) void rows_blocks(i64 na, i64 K, i64 N,
                                                              const float *P, i64 sa, i64 sk,
                                                              const float *W, float *out,
                                                              int add, int RB, int VB) {
    i64 a = 0;
    for (; a + RB <= na; a += RB)
        for (i64 o = 0; o < N; o += VB * VL)
            rows_block(K, N, P + a * sa, sa, sk, W + o, out + a * N + o, add, RB, VB);
    for (; a < na; a++)
        for (i64 o = 0; o < N; o += VB * VL)
            rows_block(K, N, P + a * sa, sa, sk, W + o, out + a * N + o, add, 1, VB);
}

static inline __attribute__((always_inline)) void rows_times(i64 na, i64 K, i64 N,
                                                             const float *P, i64 sa, i64 sk,
                                                             const float *W, float *out,
                                                             int add) {
    const i64 vectors = N / VL;
    if (VL == 16 && vectors % 4 == 0)
        rows_blocks(na, K, N, P, sa, sk, W, out, add, 4, 4);
    else if (vectors % 2 == 0)
        rows_blocks(na, K, N, P, sa, sk, W, out, add, VL == 16 ? 8 : 4, 2);
    else
        rows_blocks(na, K, N, P, sa, sk, W, out, add, 8, 1);
}

/* A block of rows (at most BLOCK_ROWS, their scratch on the stack: BLOCK_FLOATS holds one row
 * of the backward's, 4 hidden + 4 variable_dim floats, at the largest sizes) goes through each
 * matmul together. */
#define BLOCK_FLOATS (8 * MAX_HIDDEN)
#define BLOCK_ROWS 8

static i64 block_rows(i64 per_row) {
    const i64 R = BLOCK_FLOATS / per_row;
    return R > BLOCK_ROWS ? BLOCK_ROWS : R < 1 ? 1 : R;
}

static inline __attribute__((always_inline)) void forward_rows(
    i64 n, i64 M, i64 dh, i64 h, const float *x, const float *A, const float *C, const float *W2,
    const float *b2, const float *Wg, uint64_t seed, uint32_t threshold, const Gate *q0,
    const float *s, float *out, float *f_out, int t, int nt) {
    float a[MAX_HIDDEN], z[MAX_HIDDEN], block[BLOCK_FLOATS];
    const i64 h2 = 2 * h, R = block_rows(dh + h2);
    float *fb = block, *gb = fb + R * dh; /* a block's f and g */
    i64 lo, hi;
    row_range(M, t, nt, &lo, &hi);
    for (i64 j = 0; j < n; j++) {
        Gate q = gate_of(j, M, h, NULL, q0->bias, q0->scale, q0->u, q0->v, q0->R0, q0->R1,
                         q0->R2, q0->gamma, q0->beta);
        const float *Aj = A + j * dh, *Cj = C + j * dh, *W2j = W2 + j * dh * dh;
        const float *b2j = b2 + j * dh, *Wgj = Wg + j * dh * h2;
        for (i64 m0 = lo; m0 < hi; m0 += R) {
            const i64 nb = hi - m0 < R ? hi - m0 : R;
            float *fj = f_out ? f_out + (j * M + m0) * dh : fb;
            for (i64 b = 0; b < nb; b++) {
                const i64 r = j * M + m0 + b;
                fc2_row(dh, x[r], Aj, Cj, W2j, b2j, seed, threshold, (uint64_t)r * (uint64_t)dh,
                        a, fj + b * dh);
            }
            rows_times(nb, dh, h2, fj, dh, 1, Wgj, gb, 0); /* g = f Wg */
            for (i64 b = 0; b < nb; b++) {
                const i64 m = m0 + b;
                normalized_row(&q, h, m, gb + b * h2, z, NULL, NULL);
                const float w = s[j * M + m];
                float *o = out + m * h;
                for (i64 k = 0; k < h; k += VL)
                    store(o + k,
                          load(o + k) + w * (load(z + k) * load(q.gamma + k) + load(q.beta + k)));
            }
        }
    }
}

/* The whole forward of the n variables at once, for variable_dim % 16 == 0 (and small: the
 * matmuls run here row by row, where MKL's would write g first): out [M, h] +=
 * sum_j s_j LayerNorm_j(GLU(scale g_j + bg_j) + skip_j) with f_j = (ELU(x_j A_j + C_j) W2_j
 * + b2_j) keep_j and g_j = f_j Wg_j; f_out [n, M, dh] receives f when given (training keeps
 * it for backward, which makes g again from it). */
void vsn_forward(i64 n, i64 M, i64 dh, i64 h, const float *x, const float *A, const float *C,
                 const float *W2, const float *b2, const float *Wg, const float *bg,
                 uint64_t seed, uint32_t threshold, float scale, const float *s, const float *u,
                 const float *v, const float *R0, const float *R1, const float *R2,
                 const float *gamma, const float *beta, float *out, float *f_out,
                 int nthreads) {
    int nt = threads(nthreads);
    Gate q0 = {NULL, bg, u, v, R0, R1, R2, gamma, beta, scale, NULL};
#pragma omp parallel num_threads(nt)
    {
        int t = thread_id(), tn = team();
        if (dh == 16) /* tft_small's: its loops unrolled */
            forward_rows(n, M, 16, h, x, A, C, W2, b2, Wg, seed, threshold, &q0, s, out, f_out, t,
                         tn);
        else
            forward_rows(n, M, dh, h, x, A, C, W2, b2, Wg, seed, threshold, &q0, s, out, f_out, t,
                         tn);
    }
}

/* ---- the backward, for a small variable_dim ---------------------------------------------- */

/* Partial sums per thread and variable of vsn_backward_rows, after those of
 * vsn_gate_norm_sum_backward (P_WIDTH h): d_b2, d_A, d_C (dh each), d_Wg (dh x 2h, without the
 * dropout scale), d_W2 (dh x dh). */
enum { R_B2, R_A, R_C, R_WIDTH = 3 };
static inline __attribute__((always_inline)) void backward_rows(
    i64 c, i64 M, i64 dh, i64 h, const float *bias, float scale, const float *s, const float *u,
    const float *v, const float *R0, const float *R1, const float *R2, const float *gamma,
    const float *beta, const float *d_out, const float *x, const float *A, const float *C,
    const float *W2, const float *b2, const float *Wg, const float *W2T, const float *WgT,
    const float *f, uint64_t seed, uint32_t threshold, float *d_s, float *d_u, float *d_v,
    float *d_x, float *part, int t, int nt) {
    float xh[MAX_HIDDEN], ga[MAX_HIDDEN], sg[MAX_HIDDEN], dx[MAX_HIDDEN], block[BLOCK_FLOATS];
    const i64 h2 = 2 * h, width = P_WIDTH * h + R_WIDTH * dh + dh * h2 + dh * dh;
    /* a block of rows: f, g, d_g (of scale g + bias), d_g Wg^T, ELU's output a and d_fp (the
     * gradient of fc2's output, for W2's) */
    const i64 R = block_rows(2 * h2 + 4 * dh);
    float *fb = block, *gb = fb + R * dh, *dgb = gb + R * h2, *dfb = dgb + R * h2;
    float *ab = dfb + R * dh, *dpb = ab + R * dh;
    i64 lo, hi;
    row_range(M, t, nt, &lo, &hi);
    for (i64 j = 0; j < c; j++) {
        Gate q = gate_of(j, M, h, NULL, bias, scale, u, v, R0, R1, R2, gamma, beta);
        float *p = part + j * width, *pb2 = p + P_WIDTH * h + R_B2 * dh;
        float *pA = p + P_WIDTH * h + R_A * dh, *pC = p + P_WIDTH * h + R_C * dh;
        float *pWg = p + P_WIDTH * h + R_WIDTH * dh, *pW2 = pWg + dh * h2;
        GateSums acc = {p + P_GAMMA * h, p + P_BETA * h, p + P_R0 * h,
                        p + P_R1 * h,    p + P_R2 * h,   p + P_BIAS * h};
        const float *Aj = A + j * dh, *Cj = C + j * dh, *W2j = W2 + j * dh * dh;
        const float *b2j = b2 + j * dh, *Wgj = Wg + j * dh * h2;
        const float *W2Tj = W2T + j * dh * dh, *WgTj = WgT + j * h2 * dh;
        for (i64 m0 = lo; m0 < hi; m0 += R) {
            const i64 nb = hi - m0 < R ? hi - m0 : R;
            /* f as the forward kept it, or (recompute mode) as it made it */
            const float *fj = f ? f + (j * M + m0) * dh : fb;
            if (!f)
                for (i64 b = 0; b < nb; b++) {
                    const i64 r = j * M + m0 + b;
                    fc2_row(dh, x[r], Aj, Cj, W2j, b2j, seed, threshold,
                            (uint64_t)r * (uint64_t)dh, ab + b * dh, fb + b * dh);
                }
            rows_times(nb, dh, h2, fj, dh, 1, Wgj, gb, 0); /* g = f Wg */
            for (i64 b = 0; b < nb; b++) {
                const i64 m = m0 + b, r = j * M + m;
                float dv;
                gate_row_backward(&q, h, m, gb + b * h2, s[r], d_out + m * h, acc,
                                  dgb + b * h2, d_s + r, d_u + r, &dv, NULL, xh, ga, sg, dx);
                if (d_v) d_v[r] = dv;
            }
            /* g = f Wg, its dropout scale on the gate: d f = scale d_g Wg^T, then the mask */
            rows_times(nb, h2, dh, dgb, h2, 1, WgTj, dfb, 0);
            for (i64 b = 0; b < nb; b++) {
                const i64 r = j * M + m0 + b;
                const uint64_t start = (uint64_t)r * (uint64_t)dh;
                const uint32_t key = row_key(seed, start);
                const float *df = dfb + b * dh;
                float *dfp = dpb + b * dh;
#pragma omp simd
                for (i64 k = 0; k < dh; k++) {
                    float d = df[k] * scale;
                    if (threshold) d *= kept(key, start, k, threshold);
                    dfp[k] = d;
                    pb2[k] += d;
                }
            }
            /* f before its mask = a W2 + b2, a = ELU(x A + C): ELU' is 1 where a > 0, else
             * a + 1 */
            rows_times(nb, dh, dh, dpb, dh, 1, W2Tj, dfb, 0); /* d_a, into d_f's place */
            for (i64 b = 0; b < nb; b++) {
                const i64 r = j * M + m0 + b;
                const float *da = dfb + b * dh;
                float *ar = ab + b * dh;
                vf dxv = {0};
                const float xv = x[r];
                for (i64 k = 0; k < dh; k += VL) {
                    vf h1 = xv * load(Aj + k) + load(Cj + k);
                    vf ak = blend(h1 > 0.0f, h1, vexp(h1) - 1.0f);
                    store(ar + k, ak);
                    vf d = load(da + k) * blend(ak > 0.0f, splat(1.0f), ak + 1.0f);
                    store(pA + k, load(pA + k) + xv * d);
                    store(pC + k, load(pC + k) + d);
                    dxv += d * load(Aj + k);
                }
                if (d_x) d_x[r] = hsum(dxv);
            }
            /* the weights' gradients: sums over the rows of f^T d_g and a^T d_fp */
            rows_times(dh, nb, h2, fj, 1, dh, dgb, pWg, 1);
            rows_times(dh, nb, dh, ab, 1, dh, dpb, pW2, 1);
        }
    }
}

/* vsn_gate_norm_sum_backward for a small variable_dim (dh % 16 == 0), continued through the
 * GLU's matmul, fc2 and ELU row by row, the weights' gradients added up here too: no tensor of
 * [c, M, 2h] is read or written. g = f Wg is made again from f [c, M, dh] (fc2's output, its
 * mask applied, as vsn_forward kept it), or with f NULL (recompute mode) f too from x. Fills
 * d_s, d_u, d_v, d_x [c, M] (d_v, d_x may be NULL) and per-thread partial sums part [nthreads,
 * c, 7h + 3dh + 2h dh + dh dh] (zeroed here) of d_gamma, d_beta, d_R0, d_R1, d_R2, d_bias (2h),
 * d_b2, d_A, d_C, d_Wg (of g, without the dropout scale) and d_W2. W2T [c, dh, dh] and WgT
 * [c, 2h, dh] are W2 and Wg transposed; the mask is the forward's, drawn from `seed`. */
void vsn_backward_rows(i64 c, i64 M, i64 dh, i64 h, const float *bias, float scale,
                       const float *s, const float *u, const float *v, const float *R0,
                       const float *R1, const float *R2, const float *gamma, const float *beta,
                       const float *d_out, const float *x, const float *A, const float *C,
                       const float *W2, const float *b2, const float *Wg, const float *W2T,
                       const float *WgT, const float *f, uint64_t seed, uint32_t threshold,
                       float *d_s, float *d_u, float *d_v, float *d_x, float *part,
                       int nthreads) {
    int nt = threads(nthreads);
    const i64 width = P_WIDTH * h + R_WIDTH * dh + dh * 2 * h + dh * dh;
    memset(part, 0, sizeof(float) * (size_t)(nt * c * width));
#pragma omp parallel num_threads(nt)
    {
        int t = thread_id();
        float *pt = part + t * c * width;
        if (dh == 16) /* tft_small's: its loops unrolled */
            backward_rows(c, M, 16, h, bias, scale, s, u, v, R0, R1, R2, gamma, beta, d_out, x,
                          A, C, W2, b2, Wg, W2T, WgT, f, seed, threshold, d_s, d_u, d_v, d_x, pt,
                          t, team());
        else
            backward_rows(c, M, dh, h, bias, scale, s, u, v, R0, R1, R2, gamma, beta, d_out, x,
                          A, C, W2, b2, Wg, W2T, WgT, f, seed, threshold, d_s, d_u, d_v, d_x, pt,
                          t, team());
    }
}

/* ---- dropout of any tensor, its mask drawn again in backward ---------------------------- */

#define DROPOUT_BLOCK 1024 /* elements that share a row key */

static void dropout_blocks(i64 n, uint64_t seed, uint32_t threshold, float scale,
                           const float *in, float *out, int t, int nt) {
    i64 lo, hi;
    row_range((n + DROPOUT_BLOCK - 1) / DROPOUT_BLOCK, t, nt, &lo, &hi);
    for (i64 b = lo; b < hi; b++) {
        const uint64_t start = (uint64_t)b * DROPOUT_BLOCK;
        const uint32_t key = row_key(seed, start);
        const i64 end = n - b * DROPOUT_BLOCK < DROPOUT_BLOCK ? n - b * DROPOUT_BLOCK : DROPOUT_BLOCK;
        const float *x = in + start;
        float *y = out + start;
#pragma omp simd
        for (i64 k = 0; k < end; k++) y[k] = x[k] * kept(key, start, k, threshold) * scale;
    }
}

/* out = in * keep * scale over n elements, element i kept by the hash of (seed, i): forward
 * and backward (the gradient through the same mask) alike. */
void dropout_flat(i64 n, uint64_t seed, uint32_t threshold, float scale, const float *in,
                  float *out, int nthreads) {
    int nt = threads(nthreads);
#pragma omp parallel num_threads(nt)
    dropout_blocks(n, seed, threshold, scale, in, out, thread_id(), team());
}

/* ---- GateAddNorm: LayerNorm(GLU(g) + skip), the TFT's other gates --------------------------- */

static void gate_add_norm_rows(i64 M, i64 h, const Gate *q, float *out, int t, int nt) {
    float z[MAX_HIDDEN];
    i64 lo, hi;
    row_range(M, t, nt, &lo, &hi);
    for (i64 m = lo; m < hi; m++) {
        normalized_row(q, h, m, q->g + m * 2 * h, z, NULL, NULL);
        float *o = out + m * h;
        for (i64 k = 0; k < h; k += VL)
            store(o + k, load(z + k) * load(q->gamma + k) + load(q->beta + k));
    }
}

/* out [M, h] = LayerNorm(GLU(g + bias) + skip) * gamma + beta: g [M, 2h] (a linear layer's
 * matmul), bias [2h], skip [M, h], gamma and beta [h]. */
void gate_add_norm(i64 M, i64 h, const float *g, const float *bias, const float *skip,
                   const float *gamma, const float *beta, float *out, int nthreads) {
    int nt = threads(nthreads);
    Gate q = {g, bias, NULL, NULL, NULL, NULL, NULL, gamma, beta, 1.0f, skip};
#pragma omp parallel num_threads(nt)
    gate_add_norm_rows(M, h, &q, out, thread_id(), team());
}

static void gate_add_norm_backward_rows(i64 M, i64 h, const Gate *q, const float *d_out,
                                        float *d_g, float *d_skip, float *part, int t,
                                        int nt) {
    float xh[MAX_HIDDEN], ga[MAX_HIDDEN], sg[MAX_HIDDEN], dx[MAX_HIDDEN];
    GateSums acc = {part, part + h, NULL, NULL, NULL, part + 2 * h};
    i64 lo, hi;
    row_range(M, t, nt, &lo, &hi);
    for (i64 m = lo; m < hi; m++) {
        float ds, du, dv;
        gate_row_backward(q, h, m, q->g + m * 2 * h, 1.0f, d_out + m * h, acc, d_g + m * 2 * h,
                          &ds, &du, &dv, d_skip + m * h, xh, ga, sg, dx);
    }
}

/* The backward of gate_add_norm: d_g [M, 2h] (also the bias's, summed), d_skip [M, h], and
 * per-thread partial sums part [nthreads, 4h] (zeroed here) of d_gamma, d_beta, d_bias (2h). */
void gate_add_norm_backward(i64 M, i64 h, const float *g, const float *bias, const float *skip,
                            const float *gamma, const float *beta, const float *d_out,
                            float *d_g, float *d_skip, float *part, int nthreads) {
    int nt = threads(nthreads);
    memset(part, 0, sizeof(float) * (size_t)(nt * 4 * h));
    Gate q = {g, bias, NULL, NULL, NULL, NULL, NULL, gamma, beta, 1.0f, skip};
#pragma omp parallel num_threads(nt)
    {
        int t = thread_id();
        gate_add_norm_backward_rows(M, h, &q, d_out, d_g, d_skip, part + t * 4 * h, t, team());
    }
}

/* ---- ELU's backward and the folded fc1 ------------------------------------------------------ */

static void elu_backward_rows(i64 c, i64 M, i64 dh, const float *x, const float *A,
                              const float *a, const float *d_a, float *d_x,
                              float *part, int t, int nt) {
    i64 lo, hi;
    row_range(c * M, t, nt, &lo, &hi);
    for (i64 r = lo; r < hi; r++) {
        i64 j = r / M;
        const float xv = x[r], *Aj = A + j * dh, *ar = a + r * dh, *dr = d_a + r * dh;
        float *dA = part + j * 2 * dh, *dC = dA + dh;
        float dx = 0.0f;
#pragma omp simd reduction(+ : dx)
        for (i64 k = 0; k < dh; k++) {
            /* ELU'(h1) = 1 where h1 > 0 (there a = h1 > 0), else exp(h1) = a + 1 */
            float d = dr[k] * (ar[k] > 0.0f ? 1.0f : ar[k] + 1.0f);
            dA[k] += xv * d;
            dC[k] += d;
            dx += d * Aj[k];
        }
        if (d_x) d_x[r] = dx;
    }
}

/* From d_a [c, M, dh], the gradient of a = ELU(x A + C): d_x [c, M] (may be NULL) and
 * per-thread partial sums part [nthreads, c, 2 dh] (zeroed here) of d_A and d_C. */
void vsn_elu_backward(i64 c, i64 M, i64 dh, const float *x, const float *A, const float *a,
                      const float *d_a, float *d_x, float *part, int nthreads) {
    int nt = threads(nthreads);
    memset(part, 0, sizeof(float) * (size_t)(nt * c * 2 * dh));
#pragma omp parallel num_threads(nt)
    {
        int t = thread_id();
        elu_backward_rows(c, M, dh, x, A, a, d_a, d_x, part + t * c * 2 * dh, t, team());
    }
}

/* ---- which build this CPU runs, and the module that setuptools builds around it ----------- */

/* The x86-64 microarchitecture level of this CPU (4: AVX-512, 3: AVX2 and FMA, 1 below or not
 * x86): asked of this file's baseline build, which runs on any CPU. Feature by feature, as
 * not every compiler names the levels in __builtin_cpu_supports; what a level adds beyond
 * these (F16C, LZCNT, MOVBE; AVX-512CD) every CPU with them has. */
int vsn_x86_level(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    const int v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                   __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2");
    const int v4 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    if (v3 && v4) return 4;
    if (v3) return 3;
#endif
    return 1;
}

#include "_vsn_module.c"
