/* Native kernels for the models' per-run gradients. models/native.py loads this library with
 * ctypes. setuptools builds it as an extension (so it lands next to the package, named with
 * the interpreter's suffix), but it is plain C: no Python.h, so no python3-dev headers are
 * needed to build it, and it is never imported as a module.
 *
 * gmm_grad: the diagonal Gaussian mixture's gradient of the SGHMC log target for M particles
 * (models/mixture.py, GaussianMixture.run_gradient) in one pass over the rows per particle:
 * log-joint, softmax over the K components and the weighted statistics sum_b w r (1, y, y^2),
 * then the small per-particle algebra with the prior folded in. Torch needs three passes and
 * two [M, K, B] buffers for the same (matrix product, softmax, matrix product); here a block of
 * rows stays in L1 and the exps are vectorised (exp_nonpos).
 *
 * gmm_run: one SGHMC run (the engine's hot loop) in one call, mini-batches gathered from the
 * reservoir inside, the gradient in float32 on centred rows (grad_core32). gather_gram: linear
 * regression's mini-batch Gram matrices straight from the reservoir. t_loglik and t_row_lse: the
 * Student-t model's quadrature (models/heavy.py), sums over rows at its grid nodes. em_stats,
 * em_run and laplace_rows: the mixture's EM fits and the observed information of its Laplace law
 * (models/mixture.py's _em_matrix, _map_em and _laplace_pass: the mode checks' fresh estimates).
 *
 * Determinism: the order of every sum is fixed (per-lane partial sums over blocks of BT rows,
 * then a fixed-order reduction), so a run gives the same bits on one machine whatever the
 * chunking. Different instruction sets (AVX-512, AVX2+FMA, baseline) may differ in the last
 * bits, as torch's own kernels do; CUSP_NATIVE_ISA=0/1/2 caps the one chosen.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BT 64 /* rows per block: K * BT doubles of log-joints stay in L1 */

static const double LOG_2PI = 1.8378770664093453;

/* exp(x) for x <= 0, within about 2e-15 relative: Cody-Waite reduction x = n ln2 + r with
 * |r| <= ln2/2, degree-11 Taylor polynomial, 2^n built in the exponent bits. Branch-free so
 * that the loops calling it vectorise. Exactly 0 below -708 (and for -inf), where the result
 * would go subnormal, as the float32 expf_nonpos is below -87: a floor of 3e-308 gave a component
 * that no row reaches a positive responsibility sum, which an EM step took for rows of its own
 * (numpy's exp gives 0 there). */
static inline __attribute__((always_inline)) double exp_nonpos(double x0)
{
    const double magic = 6755399441055744.0; /* 1.5 * 2^52: adding it rounds to an integer */
    double x = x0 < -708.0 ? -708.0 : x0;
    double t = x * 1.4426950408889634 + magic;
    double n = t - magic;
    double r = x - n * 6.93147180369123816490e-01;
    r = r - n * 1.90821492927058770002e-10;
    double p = r * (1.0 / 39916800.0) + (1.0 / 3628800.0);
    p = p * r + (1.0 / 362880.0);
    p = p * r + (1.0 / 40320.0);
    p = p * r + (1.0 / 5040.0);
    p = p * r + (1.0 / 720.0);
    p = p * r + (1.0 / 120.0);
    p = p * r + (1.0 / 24.0);
    p = p * r + (1.0 / 6.0);
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    uint64_t ti, tm, sb;
    double scale;
    memcpy(&ti, &t, 8);
    memcpy(&tm, &magic, 8);
    sb = (ti - tm + 1023) << 52;
    memcpy(&scale, &sb, 8);
    return x0 < -708.0 ? 0.0 : p * scale;
}

/* log(x) for 1 <= x < 2^1024 (a sum of exps of non-positive log-joints, the largest of them exp(0) = 1),
 * within about 1 ulp: x = 2^k m with m in [sqrt(1/2), sqrt(2)), log m = 2 atanh(s) for
 * s = (m - 1) / (m + 1), |s| <= 0.1716, by its odd series to s^21 (the next term is below 1e-17
 * relative), k ln 2 in two parts. Branch-free and in integer bits (k through the exponent field
 * as a double, not an int64 conversion) so that the loops calling it vectorise on AVX2 too. */
static inline __attribute__((always_inline)) double log_ge1(double x)
{
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    uint64_t ebits = (u >> 52) | 0x4330000000000000ULL; /* 2^52 + biased exponent, as a double */
    uint64_t mbits = (u & 0x000FFFFFFFFFFFFFULL) | 0x3FF0000000000000ULL;
    double ed, m;
    memcpy(&ed, &ebits, sizeof ed);
    memcpy(&m, &mbits, sizeof m);
    double k = ed - (4503599627370496.0 + 1023.0);
    const int big = m > 1.4142135623730951;
    m = big ? 0.5 * m : m;
    k = big ? k + 1.0 : k;
    const double s = (m - 1.0) / (m + 1.0), z = s * s;
    double p = 1.0 / 21.0;
    p = p * z + 1.0 / 19.0;
    p = p * z + 1.0 / 17.0;
    p = p * z + 1.0 / 15.0;
    p = p * z + 1.0 / 13.0;
    p = p * z + 1.0 / 11.0;
    p = p * z + 1.0 / 9.0;
    p = p * z + 1.0 / 7.0;
    p = p * z + 1.0 / 5.0;
    p = p * z + 1.0 / 3.0;
    const double r = 2.0 * s * z * p; /* log m - 2 s */
    const double out = k * 6.93147180369123816490e-01 + (2.0 * s + (r + k * 1.90821492927058770002e-10));
    return x < INFINITY ? out : x; /* NaN and +inf pass through, as log's do (a NaN parameter's rows stay NaN) */
}

static inline __attribute__((always_inline)) double lane_sum(const double *v)
{
    double s = 0.0;
    for (int i = 0; i < BT; i++) s += v[i];
    return s;
}

/* beta = softmax(z [K]): the mixture weights of one particle */
static inline __attribute__((always_inline)) void mixture_weights(int K, const double *z, double *beta)
{
    double zmax = z[0], zs = 0.0;
    for (int k = 1; k < K; k++) zmax = z[k] > zmax ? z[k] : zmax;
    for (int k = 0; k < K; k++) { beta[k] = exp(z[k] - zmax); zs += beta[k]; }
    for (int k = 0; k < K; k++) beta[k] /= zs;
}

/* Per particle: beta = softmax(z) and the log-joint's coefficients, log w_k + log N(y; mu_k,
 * sigma_k^2) = cst_k + sum_j (a_kj y_j + c_kj y_j^2). theta's particle row starts at z. */
static inline __attribute__((always_inline)) void mixture_constants(
    int K, int d, const double *z, double *a, double *c, double *cst, double *beta)
{
    const double *mu = z + K, *s = mu + K * d;
    mixture_weights(K, z, beta);
    for (int k = 0; k < K; k++) {
        double q = 0.0, ss = 0.0;
        for (int j = 0; j < d; j++) {
            int i = k * d + j;
            double prec = exp(-s[i]);
            a[i] = mu[i] * prec;
            c[i] = -0.5 * prec;
            q += mu[i] * a[i];
            ss += s[i];
        }
        cst[k] = log(beta[k]) - 0.5 * (d * LOG_2PI + ss + q);
    }
}

/* lj [K][BT] log-joints of a block <- exp(log-joint - max over k), mx [BT] <- that max, sm [BT]
 * <- sum over k */
static inline __attribute__((always_inline)) void block_softmax_tail(int K, double *lj, double *mx, double *sm)
{
    for (int i = 0; i < BT; i++) mx[i] = lj[i];
    for (int k = 1; k < K; k++) {
        const double *l = lj + (size_t)k * BT;
        for (int i = 0; i < BT; i++) mx[i] = l[i] > mx[i] ? l[i] : mx[i];
    }
    for (int i = 0; i < BT; i++) sm[i] = 0.0;
    for (int k = 0; k < K; k++) {
        double *l = lj + (size_t)k * BT;
        for (int i = 0; i < BT; i++) { double e = exp_nonpos(l[i] - mx[i]); l[i] = e; sm[i] += e; }
    }
}

/* One block of BT rows (columns y_j at ycol + j * padded, y_j^2 at ycol + (d + j) * padded):
 * lj [K][BT] <- exp(log-joint - max over k), mx [BT] <- that max, sm [BT] <- sum over k. */
static inline __attribute__((always_inline)) void block_softmax_terms(
    int K, int d, long padded, const double *ycol, const double *a, const double *c,
    const double *cst, double *lj, double *mx, double *sm)
{
    for (int k = 0; k < K; k++) {
        double *l = lj + (size_t)k * BT;
        for (int i = 0; i < BT; i++) l[i] = cst[k];
        for (int j = 0; j < d; j++) {
            const double *y = ycol + (size_t)j * padded, *y2 = ycol + (size_t)(d + j) * padded;
            const double aa = a[k * d + j], cc = c[k * d + j];
            for (int i = 0; i < BT; i++) l[i] += aa * y[i] + cc * y2[i];
        }
    }
    block_softmax_tail(K, lj, mx, sm);
}

/* block_softmax_terms with each component's term centred on its mean: log w_k + log N(y; mu_k,
 * sigma_k^2) = cst_k + sum_j hp_kj (y_j - mu_kj)^2 (hp = -1 / 2 sigma^2, cst_k = log w_k - (d log
 * 2 pi + sum_j log sigma_kj^2) / 2). The raw moments' a y + c y^2 - mu^2 / 2 sigma^2 cancel in
 * float64 once |y| / sigma passes about 1e7 (data at 1,000 in steps of 1e-4: 0.04 nats a row;
 * at 1e6 in steps of 1e-2, 8.6), and these are the evidence's terms (gmm_loglik): a subtraction
 * more per term, exact wherever the data sit. */
static inline __attribute__((always_inline)) void block_centred_terms(
    int K, int d, long padded, const double *ycol, const double *mu, const double *hp,
    const double *cst, double *lj, double *mx, double *sm)
{
    for (int k = 0; k < K; k++) {
        double *l = lj + (size_t)k * BT;
        for (int i = 0; i < BT; i++) l[i] = cst[k];
        for (int j = 0; j < d; j++) {
            const double *y = ycol + (size_t)j * padded;
            const double m = mu[k * d + j], h = hp[k * d + j];
            for (int i = 0; i < BT; i++) { const double u = y[i] - m; l[i] += h * u * u; }
        }
    }
    block_softmax_tail(K, lj, mx, sm);
}

/* rows [B] (row b's y_j at rows[b * stride + j], or at rows[idx[b] * stride + j] when idx is not
 * NULL) into columns y_j, then y_j^2, of a [2d][padded] layout, starting at position `at` */
static inline __attribute__((always_inline)) void columns_at(
    int d, long B, long padded, long at, const double *rows, long stride, const int64_t *idx, double *ycol)
{
    for (long b = 0; b < B; b++) {
        const double *row = rows + (idx ? idx[b] : b) * stride;
        for (int j = 0; j < d; j++) {
            double v = row[j];
            ycol[(size_t)j * padded + at + b] = v;
            ycol[(size_t)(d + j) * padded + at + b] = v * v;
        }
    }
}

/* zero the columns and (wcol not NULL) the weights from position `from` to padded: padding
 * rows weigh nothing */
static inline __attribute__((always_inline)) void pad_tail(int d, long from, long padded, double *ycol, double *wcol)
{
    for (int j = 0; j < 2 * d; j++)
        for (long b = from; b < padded; b++) ycol[(size_t)j * padded + b] = 0.0;
    if (wcol)
        for (long b = from; b < padded; b++) wcol[b] = 0.0;
}

/* Scratch for one gradient: rows as columns (y_j, y_j^2) [2d][padded], weights [padded] (zero
 * past the rows), exps of the log-joints [K][BT], per-lane statistics [D][BT], four [BT] rows. */
typedef struct {
    double *buf, *ycol, *wcol, *lj, *acc, *mx, *sm, *inv, *r;
    long padded;
} scratch;

static inline __attribute__((always_inline)) int scratch_alloc(scratch *s, int K, int d, long B)
{
    const int D = K * (1 + 2 * d);
    s->padded = (B + BT - 1) / BT * BT;
    s->buf = aligned_alloc(64, sizeof(double) * ((size_t)(2 * d + 1) * s->padded + (size_t)(K + D + 4) * BT));
    if (!s->buf) return 1;
    s->ycol = s->buf;
    s->wcol = s->buf + (size_t)2 * d * s->padded;
    s->lj = s->wcol + s->padded;
    s->acc = s->lj + (size_t)K * BT;
    s->mx = s->acc + (size_t)D * BT;
    s->sm = s->mx + BT;
    s->inv = s->sm + BT;
    s->r = s->inv + BT;
    return 0;
}

/* theta [M, K + 2Kd] = (z [K], mu [K, d], log sigma^2 [K, d]) row-major; the rows and their
 * weights w (w_total their sum) already in s's columns; out [M, K + 2Kd]: the gradient of
 * sum_b w_b log p(y_b | theta) + log prior(theta). */
static inline __attribute__((always_inline)) void grad_core(
    int M, int K, int d, const scratch *s, double w_total, const double *theta, double *out)
{
    const int D = K * (1 + 2 * d); /* parameters per particle, and statistics per particle: one per gradient entry */
    const long padded = s->padded;
    const double *ycol = s->ycol, *wcol = s->wcol;
    double *lj = s->lj, *acc = s->acc, *mx = s->mx, *sm = s->sm, *inv = s->inv, *r = s->r;
    double a[K * d], c[K * d], cst[K], beta[K];
    for (int m = 0; m < M; m++) {
        const double *z = theta + (size_t)m * D, *mu = z + K;
        mixture_constants(K, d, z, a, c, cst, beta);
        memset(acc, 0, sizeof(double) * (size_t)D * BT);
        for (long b0 = 0; b0 < padded; b0 += BT) {
            block_softmax_terms(K, d, padded, ycol + b0, a, c, cst, lj, mx, sm);
            for (int i = 0; i < BT; i++) inv[i] = wcol[b0 + i] / sm[i];
            for (int k = 0; k < K; k++) {
                const double *l = lj + (size_t)k * BT;
                double *a0 = acc + (size_t)k * BT;
                for (int i = 0; i < BT; i++) { r[i] = l[i] * inv[i]; a0[i] += r[i]; }
                for (int j = 0; j < d; j++) {
                    const double *y = ycol + (size_t)j * padded + b0, *y2 = ycol + (size_t)(d + j) * padded + b0;
                    double *a1 = acc + (size_t)(K + k * d + j) * BT, *a2 = acc + (size_t)(K + K * d + k * d + j) * BT;
                    for (int i = 0; i < BT; i++) { a1[i] += r[i] * y[i]; a2[i] += r[i] * y2[i]; }
                }
            }
        }
        double *o = out + (size_t)m * D;
        for (int k = 0; k < K; k++) {
            const double s0 = lane_sum(acc + (size_t)k * BT);
            o[k] = s0 - beta[k] * w_total + 1.0 - exp(z[k]);
            for (int j = 0; j < d; j++) {
                const int q = k * d + j;
                const double prec = -2.0 * c[q], m1 = mu[q], m2 = m1 * m1;
                const double s1 = lane_sum(acc + (size_t)(K + q) * BT), s2 = lane_sum(acc + (size_t)(K + K * d + q) * BT);
                o[K + q] = prec * (s1 - m1 * s0 - 0.25 * m1);
                o[K + K * d + q] = prec * (0.5 * s2 - m1 * s1 + 0.5 * m2 * s0 + 1.0 + 0.125 * m2) - 0.5 * s0 - 1.5;
            }
        }
    }
}

/* The gradient for rows [B] with y_j at rows[b * stride + j] and weights w [B] (w_total their
 * sum). Returns 0, or 1 when the scratch could not be allocated. */
static inline __attribute__((always_inline)) int gmm_grad_body(
    int M, int K, int d, long B, const double *theta, const double *rows, long stride,
    const double *w, double w_total, double *out)
{
    scratch s;
    if (scratch_alloc(&s, K, d, B)) return 1;
    columns_at(d, B, s.padded, 0, rows, stride, NULL, s.ycol);
    memcpy(s.wcol, w, sizeof(double) * B);
    pad_tail(d, B, s.padded, s.ycol, s.wcol);
    grad_core(M, K, d, &s, w_total, theta, out);
    free(s.buf);
    return 0;
}

/* ---- float32 gradient for the fused SGHMC run ------------------------------------------------
 * The run's gradient only moves particles (the evidence comes from gmm_loglik, in float64), and
 * its mini-batch noise is orders of magnitude above float32 rounding, so the run computes it in
 * float32: twice the lanes per vector and half the memory traffic of the float64 core. To keep
 * float32 safe for data far from zero, the rows are centred on the chunk's mean c in float64
 * before the cast, and every quantity is centred and scaled per component, u = (y - mu) / sigma
 * (one FMA from y - c, as (y - c) / sigma - (mu - c) / sigma), and the statistics are
 * sum w r, sum w r u and sum w r u^2 (no raw moments, so no cancellation). The per-particle
 * constants and the final algebra, prior included, stay in float64. */

#define BTF 48 /* float32 rows per block (48 and 64 measure the same; 48 pads 1,000 rows to 1,008, not 1,024) */

/* exp(x) for x <= 0 in float32, within about 2e-7 relative (Cephes expf's polynomial on a
 * Cody-Waite reduction); exactly 0 below -87 (and for -inf), where float32 would go subnormal.
 * Zero, not a floor: a responsibility floor of 1e-38 times u^2 = 1e40 would not be small.
 * Branch-free, so that the loops calling it vectorise. */
static inline __attribute__((always_inline)) float expf_nonpos(float x0)
{
    const float magic = 12582912.0f; /* 1.5 * 2^23 */
    float x = x0 < -87.0f ? -87.0f : x0;
    float t = x * 1.44269504088896341f + magic;
    float n = t - magic;
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    uint32_t ti, tm, sb;
    float scale;
    memcpy(&ti, &t, 4);
    memcpy(&tm, &magic, 4);
    sb = (ti - tm + 127) << 23;
    memcpy(&scale, &sb, 4);
    return x0 < -87.0f ? 0.0f : p * scale;
}

static inline __attribute__((always_inline)) double lane_sum_f(const float *v)
{
    double s = 0.0;
    for (int i = 0; i < BTF; i++) s += v[i];
    return s;
}

/* Scratch for the float32 gradient: rows as columns y_j [d][padded], weights [padded] (zero past
 * the rows), exps [K][BTF], per-lane statistics [D][BTF], three [BTF] rows. */
typedef struct {
    float *buf, *ycol, *wcol, *lj, *acc, *mx, *sm, *r;
    long padded;
} scratch32;

static inline __attribute__((always_inline)) int scratch32_alloc(scratch32 *s, int K, int d, long B)
{
    const int D = K * (1 + 2 * d);
    s->padded = (B + BTF - 1) / BTF * BTF;
    s->buf = aligned_alloc(64, sizeof(float) * ((size_t)(d + 1) * s->padded + (size_t)(K + D + 3) * BTF));
    if (!s->buf) return 1;
    s->ycol = s->buf;
    s->wcol = s->buf + (size_t)d * s->padded;
    s->lj = s->wcol + s->padded;
    s->acc = s->lj + (size_t)K * BTF;
    s->mx = s->acc + (size_t)D * BTF;
    s->sm = s->mx + BTF;
    s->r = s->sm + BTF;
    return 0;
}

/* cen [d] <- the column means of rows [B] (row b's y_j at rows[b * stride + j]), summed in row
 * order; 0 without rows. The centre the float32 kernels cast rows around. */
static inline __attribute__((always_inline)) void column_means(int d, long B, const double *rows, long stride, double *cen)
{
    for (int j = 0; j < d; j++) {
        double t = 0.0;
        for (long b = 0; b < B; b++) t += rows[b * stride + j];
        cen[j] = B > 0 ? t / (double)B : 0.0;
    }
}

/* rows [B] (row b at rows[b * stride], or rows[idx[b] * stride] when idx is not NULL) into the
 * float32 columns y_j - cen_j of a [d][padded] layout, from position `at` (centred in float64
 * first: raw units far from zero lose nothing to the cast) */
static inline __attribute__((always_inline)) void columns32_at(
    int d, long B, long padded, long at, const double *rows, long stride, const int64_t *idx, const double *cen,
    float *ycol)
{
    for (long b = 0; b < B; b++) {
        const double *row = rows + (idx ? idx[b] : b) * stride;
        for (int j = 0; j < d; j++) ycol[(size_t)j * padded + at + b] = (float)(row[j] - cen[j]);
    }
}

/* One block of BTF float32 rows (columns y_j at ycol + j * padded): each component's log joint
 * cst_k - |u|^2 / 2 with u_j = y_j isd_kj + nmu_kj, then lj [K][BTF] <- exp(log joint - max),
 * mx [BTF] <- the max over k (starting at `floor`, not at component 0: -inf - -inf would be
 * NaN), sm [BTF] <- the sum of the exps. */
static inline __attribute__((always_inline)) void block32_softmax_terms(
    int K, int d, long padded, const float *ycol, const float *isd, const float *nmu, const float *cst,
    float floor_, float *lj, float *mx, float *sm)
{
    for (int k = 0; k < K; k++) {
        float *l = lj + (size_t)k * BTF;
        for (int i = 0; i < BTF; i++) l[i] = cst[k];
        for (int j = 0; j < d; j++) {
            const float *y = ycol + (size_t)j * padded;
            const float is = isd[k * d + j], nm = nmu[k * d + j];
            for (int i = 0; i < BTF; i++) { float u = y[i] * is + nm; l[i] -= 0.5f * u * u; }
        }
    }
    for (int i = 0; i < BTF; i++) mx[i] = floor_;
    for (int k = 0; k < K; k++) {
        const float *l = lj + (size_t)k * BTF;
        for (int i = 0; i < BTF; i++) mx[i] = l[i] > mx[i] ? l[i] : mx[i];
    }
    for (int i = 0; i < BTF; i++) sm[i] = 0.0f;
    for (int k = 0; k < K; k++) {
        float *l = lj + (size_t)k * BTF;
        for (int i = 0; i < BTF; i++) { float e = expf_nonpos(l[i] - mx[i]); l[i] = e; sm[i] += e; }
    }
}

/* The gradient of grad_core, in float32 on the centred and scaled rows (see above); the columns
 * hold y - cen (columns32_at). */
static inline __attribute__((always_inline)) void grad_core32(
    int M, int K, int d, const scratch32 *s, double w_total, const double *theta, const double *cen, double *out)
{
    const int D = K * (1 + 2 * d);
    const long padded = s->padded;
    const float *ycol = s->ycol, *wcol = s->wcol;
    float *lj = s->lj, *acc = s->acc, *mx = s->mx, *sm = s->sm, *r = s->r;
    float isd[K * d], nmu[K * d], cst[K];
    double beta[K], prec[K * d], isd_d[K * d];
    for (int m = 0; m < M; m++) {
        const double *z = theta + (size_t)m * D, *mu = z + K, *ls = mu + K * d;
        mixture_weights(K, z, beta);
        for (int k = 0; k < K; k++) {
            double ss = 0.0;
            for (int j = 0; j < d; j++) {
                const int q = k * d + j;
                isd_d[q] = exp(-0.5 * ls[q]);
                prec[q] = isd_d[q] * isd_d[q];
                isd[q] = (float)isd_d[q];
                nmu[q] = (float)(-(mu[q] - cen[j]) * isd_d[q]);
                ss += ls[q];
            }
            cst[k] = (float)(log(beta[k]) - 0.5 * (d * LOG_2PI + ss));
        }
        memset(acc, 0, sizeof(float) * (size_t)D * BTF);
        for (long b0 = 0; b0 < padded; b0 += BTF) {
            block32_softmax_terms(K, d, padded, ycol + b0, isd, nmu, cst, -1e30f, lj, mx, sm);
            /* sm 0: a row every component puts at -inf (u * u past float32) weighs nothing */
            for (int i = 0; i < BTF; i++) sm[i] = sm[i] > 0.0f ? wcol[b0 + i] / sm[i] : 0.0f;
            for (int k = 0; k < K; k++) {
                const float *l = lj + (size_t)k * BTF;
                float *a0 = acc + (size_t)k * BTF;
                for (int i = 0; i < BTF; i++) { r[i] = l[i] * sm[i]; a0[i] += r[i]; }
                for (int j = 0; j < d; j++) {
                    const float *y = ycol + (size_t)j * padded + b0;
                    const float is = isd[k * d + j], nm = nmu[k * d + j];
                    float *a1 = acc + (size_t)(K + k * d + j) * BTF, *a2 = acc + (size_t)(K + K * d + k * d + j) * BTF;
                    for (int i = 0; i < BTF; i++) { float u = y[i] * is + nm, ru = r[i] * u; a1[i] += ru; a2[i] += ru * u; }
                }
            }
        }
        double *o = out + (size_t)m * D;
        for (int k = 0; k < K; k++) {
            const double s0 = lane_sum_f(acc + (size_t)k * BTF);
            o[k] = s0 - beta[k] * w_total + 1.0 - exp(z[k]);
            for (int j = 0; j < d; j++) {
                const int q = k * d + j;
                const double m1 = mu[q];
                const double s1 = lane_sum_f(acc + (size_t)(K + q) * BTF), s2 = lane_sum_f(acc + (size_t)(K + K * d + q) * BTF);
                o[K + q] = isd_d[q] * s1 - 0.25 * prec[q] * m1;
                o[K + K * d + q] = 0.5 * s2 - 0.5 * s0 + prec[q] * (1.0 + 0.125 * m1 * m1) - 1.5;
            }
        }
    }
}

/* One SGHMC run's gradients on the engine's rows, without gathering them first: the chunk
 * [Bc] (y_j at chunk[b * cstride + j]) with weight lam, then evaluation i's mini-batch of Bm
 * rows pool[idx[i * Bm + b]] (y_j at pool[idx * pstride + j]) with weight wp. The chunk's
 * columns are built once per run; each evaluation gathers only its mini-batch.
 *
 * v NULL: out [M, D] <- the gradient at theta on evaluation 0's rows (idx already offset by
 * the caller). v not NULL: `steps` steps of the paper's Euler update (service/sgais/kernel.py,
 * euler) in place on theta and v [M, D], v <- decay v + eta grad + noise[i] (noise [steps, M, D],
 * or NULL for none), theta <- theta + v, with out [M, D] as the gradient's buffer. Returns 0,
 * or 1 when the scratch could not be allocated. */
static inline __attribute__((always_inline)) int gmm_run_body(
    int M, int K, int d, long Bc, const double *chunk, long cstride, double lam,
    long Bm, const double *pool, long pstride, const int64_t *idx, double wp,
    int steps, double eta, double decay, const double *noise, double *theta, double *v, double *out)
{
    const int D = K * (1 + 2 * d);
    const long B = Bc + Bm;
    const double w_total = (double)Bc * lam + (double)Bm * wp;
    scratch32 s;
    if (scratch32_alloc(&s, K, d, B)) return 1;
    /* the chunk's column means: the rows are cast to float32 as y - cen (u = (y - mu) / sigma was
     * y / sigma - mu / sigma from raw float32 y, noise once |y| / sigma passed about 1e6) */
    double cen[d];
    column_means(d, Bc, chunk, cstride, cen);
    columns32_at(d, Bc, s.padded, 0, chunk, cstride, NULL, cen, s.ycol);
    for (long b = 0; b < Bc; b++) s.wcol[b] = (float)lam;
    for (long b = Bc; b < B; b++) s.wcol[b] = (float)wp;
    for (long b = B; b < s.padded; b++) {
        s.wcol[b] = 0.0f;
        for (int j = 0; j < d; j++) s.ycol[(size_t)j * s.padded + b] = 0.0f;
    }
    const int evals = v ? steps : 1;
    for (int i = 0; i < evals; i++) {
        if (Bm) columns32_at(d, Bm, s.padded, Bc, pool, pstride, idx + (size_t)i * Bm, cen, s.ycol);
        grad_core32(M, K, d, &s, w_total, theta, cen, out);
        if (!v) break;
        const double *nz = noise ? noise + (size_t)i * M * D : NULL;
        for (size_t q = 0; q < (size_t)M * D; q++) {
            double u = v[q] * decay;
            u = u + eta * out[q];
            if (nz) u = u + nz[q];
            v[q] = u;
            theta[q] += u;
        }
    }
    free(s.buf);
    return 0;
}


/* out [M, B]: log sum_k w_k N(y_b; mu_k, sigma_k^2) per particle and row (GaussianMixture.log_likelihood),
 * each component's term centred on its mean (block_centred_terms). */
static inline __attribute__((always_inline)) int gmm_loglik_body(
    int M, int K, int d, long B, const double *theta, const double *rows, long stride, double *out)
{
    const int D = K * (1 + 2 * d);
    const long nblocks = (B + BT - 1) / BT, padded = nblocks * BT;
    double *buf = aligned_alloc(64, sizeof(double) * ((size_t)2 * d * padded + (size_t)(K + 2) * BT));
    if (!buf) return 1;
    double *ycol = buf, *lj = buf + (size_t)2 * d * padded, *mx = lj + (size_t)K * BT, *sm = mx + BT;
    columns_at(d, B, padded, 0, rows, stride, NULL, ycol);
    pad_tail(d, B, padded, ycol, NULL);
    double hp[K * d], cst[K], beta[K];
    for (int m = 0; m < M; m++) {
        const double *z = theta + (size_t)m * D, *mu = z + K, *sv = mu + K * d;
        double *o = out + (size_t)m * B;
        int bad = 0;
        for (int q = 0; q < D; q++) bad |= !isfinite(z[q]);
        if (bad) { /* a NaN or infinite parameter: NaN rows (centred, an infinite mean would drop its component) */
            for (long b = 0; b < B; b++) o[b] = NAN;
            continue;
        }
        mixture_weights(K, z, beta);
        for (int k = 0; k < K; k++) {
            double ss = 0.0;
            for (int j = 0; j < d; j++) {
                hp[k * d + j] = -0.5 * exp(-sv[k * d + j]);
                ss += sv[k * d + j];
            }
            cst[k] = log(beta[k]) - 0.5 * (d * LOG_2PI + ss);
        }
        for (long b0 = 0; b0 < padded; b0 += BT) {
            block_centred_terms(K, d, padded, ycol + b0, mu, hp, cst, lj, mx, sm);
            const long n = B - b0 < BT ? B - b0 : BT;
            for (long i = 0; i < n; i++) o[b0 + i] = mx[i] + log_ge1(sm[i]);
        }
    }
    free(buf);
    return 0;
}

/* out [M]: sum_b log p(y_b | theta_m), the mixture's log-likelihood of B rows summed per particle
 * (GaussianMixture.total_log_likelihood: importance draws' weights, Metropolis-Hastings ratios and
 * mode checks over the whole reservoir, where gmm_loglik's [M, B] float64 terms cost most of a
 * late check). The terms in float32, as grad_core32 computes them, on rows centred in float64
 * first (y - c, c their mean: raw units far from zero lose nothing to the cast): each component's
 * u = (y - c) / sigma - (mu - c) / sigma in one FMA, l_k = log w_k - log sigma_k - d log(2 pi) / 2
 * - |u|^2 / 2, then the row's max and log-sum-exp; each row's value is added in float64 lanes.
 * What float32 costs: 2-6e-7 nats a row, mostly the same way in every row of a component (its
 * constants rounded to float32: the likelihood of parameters within float32 rounding of theta),
 * so about 0.05 nats over 10^5 rows, against importance weights and acceptance ratios that span
 * tens to thousands of nats (tests/test_native.py holds it to a float64 reference, raw units
 * included). Like gmm_loglik's terms centred on each component (block_centred_terms; the raw
 * moments mu y / sigma^2 - y^2 / 2 sigma^2 cancel in float64 once |y| / sigma passes about 1e7),
 * centred rows hold at any location. A row that every
 * component puts at -inf (u * u past float32's range) is -inf. The error grows with the rows'
 * reach in each particle's sigmas (max |y - c| / sigma): a particle beyond ``reach`` (or with a
 * NaN parameter) is left to the caller (far[m] = 1, out[m] = NaN). Returns 0, or 1 when the scratch
 * could not be allocated. */
static inline __attribute__((always_inline)) int gmm_total32_body(
    int M, int K, int d, long B, const double *theta, const double *rows, long stride, double reach,
    double *out, int8_t *far)
{
    const int D = K * (1 + 2 * d);
    scratch32 s;
    if (scratch32_alloc(&s, K, d, B)) return 1;
    const long padded = s.padded;
    double cen[d];
    column_means(d, B, rows, stride, cen);
    double span[d]; /* the rows' farthest distance from the centre, per column */
    for (int j = 0; j < d; j++) span[j] = 0.0;
    for (long b = 0; b < B; b++)
        for (int j = 0; j < d; j++) {
            const double v = rows[b * stride + j] - cen[j];
            s.ycol[(size_t)j * padded + b] = (float)v;
            span[j] = fabs(v) > span[j] ? fabs(v) : span[j];
        }
    for (long b = B; b < padded; b++)
        for (int j = 0; j < d; j++) s.ycol[(size_t)j * padded + b] = 0.0f;
    float *lj = s.lj, *mx = s.mx, *sm = s.sm;
    float isd[K * d], nmu[K * d], cst[K];
    double beta[K], acc[BTF], isd_d[K * d];
    for (int m = 0; m < M; m++) {
        const double *z = theta + (size_t)m * D, *mu = z + K, *ls = mu + K * d;
        /* beyond the reach (or 1 / sigma past 1e18, whose float32 squares overflow; or NaN): not
         * computed here, far[m] = 1 and out[m] = NaN, for the caller's float64 sum */
        double widest = 0.0, steepest = 0.0;
        for (int q = 0; q < K * d; q++) {
            const double is = isd_d[q] = exp(-0.5 * ls[q]), w = is * span[q % d];
            widest = w > widest || w != w ? w : widest;
            steepest = is > steepest || is != is ? is : steepest;
        }
        far[m] = !(widest <= reach && steepest <= 1e18);
        if (far[m]) {
            out[m] = NAN;
            continue;
        }
        mixture_weights(K, z, beta);
        for (int k = 0; k < K; k++) {
            double ss = 0.0, bad = 0.0;
            for (int j = 0; j < d; j++) {
                const int q = k * d + j;
                const double is = isd_d[q];
                isd[q] = (float)is;
                nmu[q] = (float)(-(mu[q] - cen[j]) * is);
                ss += ls[q];
                bad += 0.0 * (mu[q] + ls[q]); /* NaN when either is NaN or infinite */
            }
            cst[k] = (float)(log(beta[k]) - 0.5 * (d * LOG_2PI + ss) + bad);
        }
        for (int i = 0; i < BTF; i++) acc[i] = 0.0;
        for (long b0 = 0; b0 < padded; b0 += BTF) {
            /* from -FLT_MAX: only a row every component puts at -inf has sm 0 */
            block32_softmax_terms(K, d, padded, s.ycol + b0, isd, nmu, cst, -3.4028234663852886e38f, lj, mx, sm);
            const long n = B - b0 < BTF ? B - b0 : BTF; /* the rows of this block, padding left out */
            for (long i = 0; i < n; i++) acc[i] += sm[i] < 1.0f ? -INFINITY : (double)mx[i] + log_ge1((double)sm[i]);
        }
        double t = 0.0;
        for (int i = 0; i < BTF; i++) t += acc[i];
        out[m] = t;
    }
    free(s.buf);
    return 0;
}

/* EM on a diagonal Gaussian mixture (models/mixture.py, _em_matrix and _map_em): the E step's
 * responsibilities under (w [K], mu [K, d], var [K, d]) of the rows y [n] (y_j at y[b * stride + j])
 * and their sums in one pass, stats [K, 1 + 2d] = sum_b r_kb (1, y_b, y_b^2), without the [K, n]
 * responsibilities numpy writes. Returns 0, or 1 when the scratch could not be allocated. */
/* One E step's sums over the rows already in s's columns (s.wcol: 1 on the rows, 0 on the padding) */
static inline __attribute__((always_inline)) void em_pass(
    int K, int d, scratch *s, const double *w, const double *mu, const double *var, double *stats)
{
    const int S = 1 + 2 * d;
    double a[K * d], c[K * d], cst[K];
    for (int k = 0; k < K; k++) {
        double q = 0.0, lv = 0.0;
        for (int j = 0; j < d; j++) {
            const int i = k * d + j;
            const double prec = 1.0 / var[i];
            a[i] = mu[i] * prec;
            c[i] = -0.5 * prec;
            q += mu[i] * a[i];
            lv += log(var[i]);
        }
        cst[k] = log(w[k]) - 0.5 * (lv + q);
    }
    double *lj = s->lj, *acc = s->acc, *mx = s->mx, *sm = s->sm, *inv = s->inv, *r = s->r;
    memset(acc, 0, sizeof(double) * (size_t)K * S * BT);
    for (long b0 = 0; b0 < s->padded; b0 += BT) {
        block_softmax_terms(K, d, s->padded, s->ycol + b0, a, c, cst, lj, mx, sm);
        for (int i = 0; i < BT; i++) inv[i] = s->wcol[b0 + i] / sm[i];
        for (int k = 0; k < K; k++) {
            const double *l = lj + (size_t)k * BT;
            double *a0 = acc + (size_t)k * S * BT;
            for (int i = 0; i < BT; i++) { r[i] = l[i] * inv[i]; a0[i] += r[i]; }
            for (int j = 0; j < 2 * d; j++) {
                const double *yc = s->ycol + (size_t)j * s->padded + b0;
                double *a1 = a0 + (size_t)(1 + j) * BT;
                for (int i = 0; i < BT; i++) a1[i] += r[i] * yc[i];
            }
        }
    }
    for (int q = 0; q < K * S; q++) stats[q] = lane_sum(acc + (size_t)q * BT);
}

static inline __attribute__((always_inline)) int em_scratch(scratch *s, int K, int d, long n, const double *y, long stride)
{
    if (scratch_alloc(s, K, d, n)) return 1;
    columns_at(d, n, s->padded, 0, y, stride, NULL, s->ycol);
    for (long b = 0; b < n; b++) s->wcol[b] = 1.0;
    pad_tail(d, n, s->padded, s->ycol, s->wcol);
    return 0;
}

static inline __attribute__((always_inline)) int em_stats_body(
    int K, int d, long n, const double *y, long stride, const double *w, const double *mu, const double *var, double *stats)
{
    scratch s;
    if (em_scratch(&s, K, d, n, y, stride)) return 1;
    em_pass(K, d, &s, w, mu, var, stats);
    free(s.buf);
    return 0;
}

/* `iterations` EM steps (E step, then M step) on the rows y [n] from (w [K], mu [K, d], var [K, d]),
 * overwritten with the last M step's. map 0: models/mixture.py's _em_matrix (maximum likelihood;
 * nk = N_k + 1e-9, a component without rows keeps `means`' mean, variances floored at `floor`, and
 * unit where N_k <= 1); map 1: _map_em (the posterior's mode, each row standing for `weight`).
 * The sums are em_pass's, in the same order as em_stats, so a step is the numpy path's step up to
 * the last bits of the M step's arithmetic. Returns 0, or 1 when the scratch could not be allocated. */
static inline __attribute__((always_inline)) int em_run_body(
    int K, int d, long n, const double *y, long stride, double *w, double *mu, double *var, const double *means,
    int iterations, double floor_, int map, double weight)
{
    const int S = 1 + 2 * d;
    scratch s;
    if (em_scratch(&s, K, d, n, y, stride)) return 1;
    double st[K * S], nk[K];
    for (int it = 0; it < iterations; it++) {
        em_pass(K, d, &s, w, mu, var, st);
        if (map) {
            for (int q = 0; q < K * S; q++) st[q] *= weight;
            for (int k = 0; k < K; k++) {
                const double *sk = st + (size_t)k * S, nn = sk[0], kappa = 0.25 + nn;
                for (int j = 0; j < d; j++) {
                    const double m = sk[1 + j] / kappa, e = sk[1 + d + j] - kappa * m * m;
                    mu[k * d + j] = m;
                    var[k * d + j] = (1.0 + 0.5 * (e < 0.0 ? 0.0 : e)) / (1.0 + 0.5 * nn + 0.5);
                }
                w[k] = (nn + 1.0) / ((double)n * weight + (double)K);
            }
        } else {
            double tot = 0.0;
            for (int k = 0; k < K; k++) { nk[k] = st[k * S] + 1e-9; tot += nk[k]; }
            for (int k = 0; k < K; k++) {
                const double *sk = st + (size_t)k * S;
                w[k] = nk[k] / tot;
                for (int j = 0; j < d; j++) {
                    const double m = sk[0] > 0.0 ? sk[1 + j] / nk[k] : means[k * d + j];
                    double v = sk[1 + d + j] / nk[k] - m * m;
                    v = v < floor_ ? floor_ : v; /* np.maximum: a NaN stays NaN */
                    mu[k * d + j] = m;
                    var[k * d + j] = sk[0] > 1.0 ? v : 1.0;
                }
            }
        }
    }
    free(s.buf);
    return 0;
}

/* The rows' part of the mixture's observed information in v (models/mixture.py, _laplace_pass), for
 * the rows y [n] under (w [K], mu [K, d], var [K, d]): each row's responsibilities r_k and, with
 * dev = (y - mu_k) / var_k and b_k = (dev, (dev (y - mu_k) - 1) / 2) [2d], its score sc [n, D']
 * (D' = K - 1 + 2Kd: r_k - w_k for k < K - 1, then r_k dev_k for every k, then r_k b_k's second half)
 * written; and added to the sums big_n [K] += r_k, rb [K, 2d] += r_k b_k, rbb [K, 2d, 2d] += r_k
 * b_k b_k'. In blocks of BT rows with per-lane partial sums (em_pass's layout and order). Returns 0, or
 * 1 when the scratch could not be allocated. */
static inline __attribute__((always_inline)) int laplace_rows_body(
    int K, int d, long n, const double *y, long stride, const double *w, const double *mu, const double *var,
    double *sc, double *big_n, double *rb, double *rbb)
{
    const int D2 = 2 * d, dp = K - 1 + 2 * K * d, Q = K * D2 * D2;
    scratch s;
    if (em_scratch(&s, K, d, n, y, stride)) return 1;
    /* per-lane sums: big_n [K][BT], rb [K * 2d][BT], rbb [K * 2d * 2d][BT] */
    double *lanes = aligned_alloc(64, sizeof(double) * (size_t)(K + K * D2 + Q + 2 * D2) * BT);
    if (!lanes) { free(s.buf); return 1; }
    memset(lanes, 0, sizeof(double) * (size_t)(K + K * D2 + Q) * BT);
    double *ln = lanes, *lrb = ln + (size_t)K * BT, *lrbb = lrb + (size_t)K * D2 * BT;
    double *bv = lrbb + (size_t)Q * BT, *rv = bv + (size_t)D2 * BT; /* b_k and r_k b_k of a block, [2d][BT] each */
    double a[K * d], c[K * d], cst[K], iv[K * d];
    for (int k = 0; k < K; k++) {
        double q = 0.0, lv = 0.0;
        for (int j = 0; j < d; j++) {
            const int i = k * d + j;
            iv[i] = 1.0 / var[i];
            a[i] = mu[i] * iv[i];
            c[i] = -0.5 * iv[i];
            q += mu[i] * a[i];
            lv += log(var[i]);
        }
        cst[k] = log(w[k]) - 0.5 * (lv + q);
    }
    double *lj = s.lj, *mx = s.mx, *sm = s.sm, *inv = s.inv, *r = s.r;
    for (long b0 = 0; b0 < s.padded; b0 += BT) {
        block_softmax_terms(K, d, s.padded, s.ycol + b0, a, c, cst, lj, mx, sm);
        for (int i = 0; i < BT; i++) inv[i] = s.wcol[b0 + i] / sm[i]; /* 0 on the padding */
        const int rows = n - b0 < BT ? (int)(n - b0) : BT;
        for (int k = 0; k < K; k++) {
            const double *l = lj + (size_t)k * BT;
            double *lnk = ln + (size_t)k * BT;
            for (int i = 0; i < BT; i++) { r[i] = l[i] * inv[i]; lnk[i] += r[i]; }
            for (int j = 0; j < d; j++) {
                const double *yc = s.ycol + (size_t)j * s.padded + b0, m = mu[k * d + j], p = iv[k * d + j];
                double *b1 = bv + (size_t)j * BT, *b2 = bv + (size_t)(d + j) * BT;
                for (int i = 0; i < BT; i++) {
                    const double e = yc[i] - m, dev = e * p;
                    b1[i] = dev;
                    b2[i] = 0.5 * (dev * e - 1.0);
                }
            }
            for (int j = 0; j < D2; j++) {
                const double *bj = bv + (size_t)j * BT;
                double *rj = rv + (size_t)j * BT, *acc = lrb + (size_t)(k * D2 + j) * BT;
                for (int i = 0; i < BT; i++) { rj[i] = r[i] * bj[i]; acc[i] += rj[i]; }
            }
            for (int u = 0; u < D2; u++) {
                const double *ru = rv + (size_t)u * BT;
                for (int v = 0; v < D2; v++) {
                    const double *bw = bv + (size_t)v * BT;
                    double *acc = lrbb + (size_t)((k * D2 + u) * D2 + v) * BT;
                    for (int i = 0; i < BT; i++) acc[i] += ru[i] * bw[i];
                }
            }
            for (int i = 0; i < rows; i++) {
                double *row = sc + (size_t)(b0 + i) * dp;
                if (k < K - 1) row[k] = r[i] - w[k];
                for (int j = 0; j < d; j++) {
                    row[K - 1 + k * d + j] = rv[(size_t)j * BT + i];
                    row[K - 1 + K * d + k * d + j] = rv[(size_t)(d + j) * BT + i];
                }
            }
        }
    }
    for (int k = 0; k < K; k++) big_n[k] += lane_sum(ln + (size_t)k * BT);
    for (int q = 0; q < K * D2; q++) rb[q] += lane_sum(lrb + (size_t)q * BT);
    for (int q = 0; q < Q; q++) rbb[q] += lane_sum(lrbb + (size_t)q * BT);
    free(lanes);
    free(s.buf);
    return 0;
}

/* The weights' EM behind the mixture's jump proposals (models/mixture.py, _particle_counts), per
 * particle m of M: lik [K, R] = exp(log N(y_r; mu_k, e^s_k) - max over k) (up to the constant, as
 * numpy forms it) for the rows y [R] (y_j at y[r * stride + j]), then up to `sweeps` EM steps on the
 * weights alone from w [M, K] (normalised; overwritten with the last weights):
 * c_k = w_k sum_r wts_r lik_kr / sum_j w_j lik_jr, w <- c / sum c + 1e-12, stopping once no weight
 * moves more than tol. counts [M, K] <- the last sweep's c. Each particle alone (its counts depend on
 * its means and variances and start only, as the moves' reverse densities need). Returns 0, or 1
 * when the scratch could not be allocated. */
static inline __attribute__((always_inline)) int weight_em_body(
    int M, int K, int d, long R, const double *y, long stride, const double *wts, const double *mu, const double *sv,
    int sweeps, double tol, double *w, double *counts)
{
    const long padded = (R + BT - 1) / BT * BT;
    double *buf = aligned_alloc(64, sizeof(double) * ((size_t)(2 * d + K + 3) * padded + (size_t)(K + 2) * BT));
    if (!buf) return 1;
    double *ycol = buf, *lik = ycol + (size_t)2 * d * padded, *wcol = lik + (size_t)K * padded;
    double *den = wcol + padded, *qr = den + padded, *lj = qr + padded, *mx = lj + (size_t)K * BT, *sm = mx + BT;
    columns_at(d, R, padded, 0, y, stride, NULL, ycol);
    for (long b = 0; b < R; b++) wcol[b] = wts[b];
    pad_tail(d, R, padded, ycol, wcol);
    for (long b = R; b < padded; b++) qr[b] = 0.0; /* padding rows weigh nothing */
    double a[K * d], c[K * d], cst[K], cnt[K], lane[BT];
    for (int m = 0; m < M; m++) {
        const double *mm = mu + (size_t)m * K * d, *ss = sv + (size_t)m * K * d;
        for (int k = 0; k < K; k++) {
            double q = 0.0, st = 0.0;
            for (int j = 0; j < d; j++) {
                const int i = k * d + j;
                const double prec = exp(-ss[i]);
                a[i] = mm[i] * prec;
                c[i] = -0.5 * prec;
                q += mm[i] * a[i];
                st += ss[i];
            }
            cst[k] = -0.5 * (st + q);
        }
        for (long b0 = 0; b0 < padded; b0 += BT) {
            block_softmax_terms(K, d, padded, ycol + b0, a, c, cst, lj, mx, sm);
            for (int k = 0; k < K; k++) memcpy(lik + (size_t)k * padded + b0, lj + (size_t)k * BT, sizeof(double) * BT);
        }
        double *wm = w + (size_t)m * K, *cm = counts + (size_t)m * K;
        for (int t = 0; t < sweeps; t++) {
            for (long b = 0; b < padded; b++) den[b] = 0.0;
            for (int k = 0; k < K; k++) {
                const double wk = wm[k], *l = lik + (size_t)k * padded;
                for (long b = 0; b < padded; b++) den[b] += wk * l[b];
            }
            for (long b = 0; b < R; b++) qr[b] = wcol[b] / den[b];
            double tot = 0.0;
            for (int k = 0; k < K; k++) {
                const double *l = lik + (size_t)k * padded;
                for (int i = 0; i < BT; i++) lane[i] = 0.0;
                for (long b0 = 0; b0 < padded; b0 += BT)
                    for (int i = 0; i < BT; i++) lane[i] += l[b0 + i] * qr[b0 + i];
                cnt[k] = wm[k] * lane_sum(lane);
                tot += cnt[k];
            }
            tot = tot > 1e-300 ? tot : 1e-300;
            double moved = 0.0;
            for (int k = 0; k < K; k++) {
                const double next = cnt[k] / tot + 1e-12, dw = fabs(next - wm[k]);
                moved = dw > moved ? dw : moved;
                wm[k] = next;
                cm[k] = cnt[k];
            }
            if (!(moved > tol)) break;
        }
    }
    free(buf);
    return 0;
}

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define CUSP_X86 1
#endif

static int isa_chosen = -1;

/* 2: AVX-512, 1: AVX2 + FMA, 0: the compiler's baseline; capped by CUSP_NATIVE_ISA */
int cusp_isa(void)
{
    if (isa_chosen < 0) {
        const char *cap = getenv("CUSP_NATIVE_ISA");
        int want = cap && *cap ? atoi(cap) : 2;
        isa_chosen = 0;
#ifdef CUSP_X86
        __builtin_cpu_init();
        if (want >= 2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq"))
            isa_chosen = 2;
        else if (want >= 1 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
            isa_chosen = 1;
#else
        (void)want;
#endif
    }
    return isa_chosen;
}

/* A kernel in its three builds (AVX-512, AVX2+FMA, the compiler's baseline), each a call of
 * BODY, and its exported entry point cusp_NAME, which runs the build cusp_isa chose. ARGS and PASS
 * are the kernel's parameter list and argument list (macros of their own: they hold commas). */
#ifdef CUSP_X86
#define CUSP_DISPATCH(NAME, BODY, ARGS, PASS)                                                              \
    __attribute__((target("avx512f,avx512dq,avx2,fma"))) static int NAME##_avx512(ARGS) { return BODY(PASS); } \
    __attribute__((target("avx2,fma"))) static int NAME##_avx2(ARGS) { return BODY(PASS); }               \
    static int NAME##_base(ARGS) { return BODY(PASS); }                                                    \
    int cusp_##NAME(ARGS)                                                                                   \
    {                                                                                                       \
        if (isa_chosen < 0) cusp_isa();                                                                     \
        if (isa_chosen == 2) return NAME##_avx512(PASS);                                                    \
        if (isa_chosen == 1) return NAME##_avx2(PASS);                                                      \
        return NAME##_base(PASS);                                                                           \
    }
#else
#define CUSP_DISPATCH(NAME, BODY, ARGS, PASS)                                                              \
    static int NAME##_base(ARGS) { return BODY(PASS); }                                                    \
    int cusp_##NAME(ARGS)                                                                                   \
    {                                                                                                       \
        if (isa_chosen < 0) cusp_isa();                                                                     \
        return NAME##_base(PASS);                                                                           \
    }
#endif

#define GMM_ARGS int M, int K, int d, long B, const double *theta, const double *rows, long stride, \
                 const double *w, double w_total, double *out
#define GMM_PASS M, K, d, B, theta, rows, stride, w, w_total, out
#define LL_ARGS int M, int K, int d, long B, const double *theta, const double *rows, long stride, double *out
#define LL_PASS M, K, d, B, theta, rows, stride, out
#define RUN_ARGS int M, int K, int d, long Bc, const double *chunk, long cstride, double lam, \
                 long Bm, const double *pool, long pstride, const int64_t *idx, double wp, \
                 int steps, double eta, double decay, const double *noise, double *theta, double *v, double *out
#define RUN_PASS M, K, d, Bc, chunk, cstride, lam, Bm, pool, pstride, idx, wp, steps, eta, decay, noise, theta, v, out
CUSP_DISPATCH(gmm_grad, gmm_grad_body, GMM_ARGS, GMM_PASS)
CUSP_DISPATCH(gmm_loglik, gmm_loglik_body, LL_ARGS, LL_PASS)
#define TOT_ARGS int M, int K, int d, long B, const double *theta, const double *rows, long stride, double reach, \
                 double *out, int8_t *far
#define TOT_PASS M, K, d, B, theta, rows, stride, reach, out, far
CUSP_DISPATCH(gmm_total32, gmm_total32_body, TOT_ARGS, TOT_PASS)
CUSP_DISPATCH(gmm_run, gmm_run_body, RUN_ARGS, RUN_PASS)

#define EM_ARGS int K, int d, long n, const double *y, long stride, const double *w, const double *mu, const double *var, double *stats
#define EM_PASS K, d, n, y, stride, w, mu, var, stats
#define WE_ARGS int M, int K, int d, long R, const double *y, long stride, const double *wts, const double *mu, \
                const double *sv, int sweeps, double tol, double *w, double *counts
#define WE_PASS M, K, d, R, y, stride, wts, mu, sv, sweeps, tol, w, counts
CUSP_DISPATCH(em_stats, em_stats_body, EM_ARGS, EM_PASS)
CUSP_DISPATCH(weight_em, weight_em_body, WE_ARGS, WE_PASS)
#define EMR_ARGS int K, int d, long n, const double *y, long stride, double *w, double *mu, double *var, \
                 const double *means, int iterations, double floor_, int map, double weight
#define EMR_PASS K, d, n, y, stride, w, mu, var, means, iterations, floor_, map, weight
CUSP_DISPATCH(em_run, em_run_body, EMR_ARGS, EMR_PASS)
#define LR_ARGS int K, int d, long n, const double *y, long stride, const double *w, const double *mu, \
                const double *var, double *sc, double *big_n, double *rb, double *rbb
#define LR_PASS K, d, n, y, stride, w, mu, var, sc, big_n, rb, rbb
CUSP_DISPATCH(laplace_rows, laplace_rows_body, LR_ARGS, LR_PASS)

/* Gram matrices of gathered rows (models/linear.py, sampled_stats): out [E, F, F] with
 * out[e] = sum_b r_b r_b^T over the rows r_b = pool[idx[e * Bm + b]] (F columns at row stride
 * `stride`). Each evaluation's rows are gathered into columns (prefetching the next rows: the
 * reservoir is out of cache), then each entry is a dot product of two columns in per-lane
 * partial sums (fixed order: the same bits on one machine whatever the data), mirrored below the
 * diagonal. Replaces index_select + bmm, which materialise the [E, Bm, F] rows. Returns 0, or 1
 * when the scratch could not be allocated. */
#define GL 8 /* lanes of the dot products */
static inline __attribute__((always_inline)) int gather_gram_body(
    int E, long Bm, int F, const double *pool, long stride, const int64_t *idx, double *out)
{
    if (F <= GL) { /* the common case (up to 6 features): rows padded to GL, outer products in registers */
        typedef double vgl __attribute__((vector_size(GL * sizeof(double))));
        vgl *rb = aligned_alloc(64, sizeof(vgl) * (size_t)(Bm > 0 ? Bm : 1));
        if (!rb) return 1;
        for (int e = 0; e < E; e++) {
            const int64_t *ix = idx + (size_t)e * Bm;
            for (long b = 0; b < Bm; b++) {
                if (b + 16 < Bm) __builtin_prefetch(pool + ix[b + 16] * stride);
                const double *row = pool + ix[b] * stride;
                double *t = (double *)(rb + b);
                for (int j = 0; j < F; j++) t[j] = row[j];
                for (int j = F; j < GL; j++) t[j] = 0.0;
            }
            vgl acc[GL];
            for (int p = 0; p < GL; p++) acc[p] = (vgl){0.0};
            for (long b = 0; b < Bm; b++) {
                const vgl r = rb[b];
#pragma GCC unroll 8
                for (int p = 0; p < GL; p++) acc[p] += r[p] * r;
            }
            double *g = out + (size_t)e * F * F;
            for (int p = 0; p < F; p++)
                for (int q = 0; q < F; q++) g[p * F + q] = acc[p][q];
        }
        free(rb);
        return 0;
    }
    const long padded = (Bm + GL - 1) / GL * GL;
    double *col = aligned_alloc(64, sizeof(double) * (size_t)F * padded);
    if (!col) return 1;
    for (int j = 0; j < F; j++)
        for (long b = Bm; b < padded; b++) col[(size_t)j * padded + b] = 0.0;
    for (int e = 0; e < E; e++) {
        const int64_t *ix = idx + (size_t)e * Bm;
        for (long b = 0; b < Bm; b++) {
            if (b + 16 < Bm) __builtin_prefetch(pool + ix[b + 16] * stride);
            const double *row = pool + ix[b] * stride;
            for (int j = 0; j < F; j++) col[(size_t)j * padded + b] = row[j];
        }
        double *g = out + (size_t)e * F * F;
        for (int p = 0; p < F; p++) {
            const double *cp = col + (size_t)p * padded;
            for (int q = p; q < F; q++) {
                const double *cq = col + (size_t)q * padded;
                double lane[GL] = {0.0};
                for (long b = 0; b < padded; b += GL)
                    for (int l = 0; l < GL; l++) lane[l] += cp[b + l] * cq[b + l];
                double sum = 0.0;
                for (int l = 0; l < GL; l++) sum += lane[l];
                g[p * F + q] = sum;
                g[q * F + p] = sum;
            }
        }
    }
    free(col);
    return 0;
}

#define GG_ARGS int E, long Bm, int F, const double *pool, long stride, const int64_t *idx, double *out
#define GG_PASS E, Bm, F, pool, stride, idx, out
CUSP_DISPATCH(gather_gram, gather_gram_body, GG_ARGS, GG_PASS)

/* Student-t quadrature (models/heavy.py): the grid nodes of V degrees of freedom, each a G x G
 * tensor grid with mu = m_v + a sinh(s_i) e^lam_j, at which
 *   q_vij(z) = (z - m_v) e^-lam_j / sqrt(nu_v) - a sinh(s_i) / sqrt(nu_v)
 * is the standardised residual of a row z; er [V, G] = e^-lam_j / sqrt(nu_v), sr [V, G] =
 * a sinh(s_i) / sqrt(nu_v). log1p(q^2) is log_ge1(1 + q^2): 1 + q^2 rounds, so a term differs
 * from log1p's by at most about 1e-16 absolute (torch's path writes the [B, V, G, G] terms; these
 * keep them in registers). The inner loops run over the G nodes i, so one row costs as little as
 * many (a row at a time is the detector's pointwise case).
 *
 * t_loglik: out [V, G, G] (index (v G + i) G + j) = sum over the rows z [B] of log1p(q_vij(z)^2),
 * each node's terms added in row order (the same bits whatever the data). Never fails; returns 0. */
static inline __attribute__((always_inline)) int t_loglik_body(
    int V, int G, long B, const double *z, const double *m, const double *er, const double *sr, double *out)
{
    double acc[G];
    for (int v = 0; v < V; v++) {
        const double *srv = sr + (size_t)v * G;
        for (int j = 0; j < G; j++) {
            const double e = er[v * G + j], mv = m[v];
            for (int i = 0; i < G; i++) acc[i] = 0.0;
            for (long b = 0; b < B; b++) {
                const double sb = (z[b] - mv) * e;
                for (int i = 0; i < G; i++) {
                    const double q = sb - srv[i];
                    acc[i] += log_ge1(1.0 + q * q);
                }
            }
            for (int i = 0; i < G; i++) out[((size_t)v * G + i) * G + j] = acc[i];
        }
    }
    return 0;
}

/* t_row_lse: out [B] = log sum over every node (v, i, j) of exp(base_vji - half_v log1p(q_vij(z_b)^2))
 * for each row z_b: the rows' log predictives, base [V, G, G] in the layout (v G + j) G + i (the
 * log weight and log joint of each node, with the Student-t's log normaliser less lam_j). Each row's
 * terms go to a scratch of V G G doubles, their maximum and then the sum of exps in per-lane
 * partial sums (fixed order; a NaN term makes the row NaN, as torch's logsumexp does). A row whose
 * terms are all -inf gets -inf. Returns 0, or 1 when the scratch could not be allocated. */
#define TL 8
static inline __attribute__((always_inline)) int t_row_lse_body(
    int V, int G, long B, const double *z, const double *m, const double *er, const double *sr, const double *half,
    const double *base, double *out)
{
    const long N = (long)V * G * G, full = N / TL * TL;
    double *t = aligned_alloc(64, sizeof(double) * (size_t)((N + TL - 1) / TL * TL + TL));
    if (!t) return 1;
    for (long b = 0; b < B; b++) {
        const double zb = z[b];
        for (int v = 0; v < V; v++) {
            const double h = half[v], d = zb - m[v];
            const double *srv = sr + (size_t)v * G;
            for (int j = 0; j < G; j++) {
                const double sj = d * er[v * G + j];
                const double *bs = base + ((size_t)v * G + j) * G;
                double *tt = t + ((size_t)v * G + j) * G;
                for (int i = 0; i < G; i++) {
                    const double q = sj - srv[i];
                    tt[i] = bs[i] - h * log_ge1(1.0 + q * q);
                }
            }
        }
        double mx[TL];
        for (int l = 0; l < TL; l++) mx[l] = -INFINITY;
        for (long k0 = 0; k0 < full; k0 += TL)
            for (int l = 0; l < TL; l++) mx[l] = t[k0 + l] > mx[l] ? t[k0 + l] : mx[l];
        for (long k = full; k < N; k++) mx[k - full] = t[k] > mx[k - full] ? t[k] : mx[k - full];
        double top = -INFINITY;
        for (int l = 0; l < TL; l++) top = mx[l] > top ? mx[l] : top;
        if (!(top > -INFINITY)) {  /* no finite term: -inf, or NaN where a term is NaN (a NaN never wins the max) */
            double o = -INFINITY;
            for (long k = 0; k < N; k++)
                if (t[k] != t[k]) { o = t[k]; break; }
            out[b] = o;
            continue;
        }
        double acc[TL] = {0.0};
        for (long k0 = 0; k0 < full; k0 += TL)
            for (int l = 0; l < TL; l++) acc[l] += exp_nonpos(t[k0 + l] - top);
        for (long k = full; k < N; k++) acc[k - full] += exp_nonpos(t[k] - top);
        double total = 0.0;
        for (int l = 0; l < TL; l++) total += acc[l];
        out[b] = top + log_ge1(total);
    }
    free(t);
    return 0;
}

#define TLL_ARGS int V, int G, long B, const double *z, const double *m, const double *er, const double *sr, double *out
#define TLL_PASS V, G, B, z, m, er, sr, out
#define TRL_ARGS int V, int G, long B, const double *z, const double *m, const double *er, const double *sr, \
                 const double *half, const double *base, double *out
#define TRL_PASS V, G, B, z, m, er, sr, half, base, out
CUSP_DISPATCH(t_loglik, t_loglik_body, TLL_ARGS, TLL_PASS)
CUSP_DISPATCH(t_row_lse, t_row_lse_body, TRL_ARGS, TRL_PASS)

/* Linear regression's SGHMC run (models/linear.py, stats_gradient): its log target's gradient
 * is affine in theta, grad_i(theta) = c[i] + theta A[i] (A [E, D, D], c [E, D]), so the run's
 * E Euler steps (service/sgais/kernel.py, euler) need no Python between them:
 * v <- decay v + eta grad_i(theta) + noise[i] (noise [E, M, D], or NULL), theta <- theta + v,
 * in place on theta and v [M, D]. Tiny matrices: plain C, no dispatch. */
void cusp_affine_euler(int M, int D, int E, const double *A, const double *c, double eta, double decay,
                       const double *noise, double *theta, double *v)
{
    double g[D];
    for (int i = 0; i < E; i++) {
        const double *a = A + (size_t)i * D * D, *ci = c + (size_t)i * D;
        const double *nz = noise ? noise + (size_t)i * M * D : NULL;
        for (int m = 0; m < M; m++) {
            double *t = theta + (size_t)m * D, *vm = v + (size_t)m * D;
            for (int q = 0; q < D; q++) g[q] = ci[q];
            for (int p = 0; p < D; p++) {
                const double tp = t[p];
                for (int q = 0; q < D; q++) g[q] += tp * a[p * D + q];
            }
            for (int q = 0; q < D; q++) {
                double u = vm[q] * decay;
                u = u + eta * g[q];
                if (nz) u = u + nz[(size_t)m * D + q];
                vm[q] = u;
                t[q] += u;
            }
        }
    }
}

/* The metric-series regressions' conjugate update (models/timeseries.py, _srif_nig): for each of
 * K components, the square-root information form [R | z] (R [D, D] upper triangular, z [D]) takes
 * B rows [phi_b | y_b] (phi [K, B, D], y [B]) by Givens rotations, row by row: each zeroes a
 * row's entries against R's diagonal, and what is left of the row's y after the D rotations adds
 * to the residual e (e^2 the rows' residual sum of squares beyond the fit). Then the
 * Normal-Inverse-Gamma noise (a, b) -> (a + B/2, b + e^2/2) and the log predictive of the rows,
 * lgamma(a') - lgamma(a) + a log b - a' log b' + log|det R| - log|det R'| - B log(2 pi) / 2.
 * R' keeps a non-negative diagonal where R had one. The same numbers as the QR of the stacked
 * [R z; phi y] up to rounding (that QR's R differs by the signs of its rows). Tiny matrices:
 * plain C, no dispatch. Returns 1 if a scratch row cannot be allocated. */
int cusp_nig_update(int K, int D, long B, const double *R, const double *z, const double *ab, const double *phi,
                    const double *y, double *R2, double *z2, double *ab2, double *lp)
{
    const int W = D + 1;
    double *w = malloc(sizeof(double) * (size_t)W * (W + 1));
    if (!w) return 1;
    double *v = w + (size_t)W * W;
    for (int k = 0; k < K; k++) {
        const double *rk = R + (size_t)k * D * D, *zk = z + (size_t)k * D;
        /* rows 0..D-1: [R | z]; row D: the residual, in its last column */
        for (int i = 0; i < D; i++) {
            for (int j = 0; j < D; j++) w[i * W + j] = rk[i * D + j];
            w[i * W + D] = zk[i];
        }
        double e = 0.0;
        for (long b = 0; b < B; b++) {
            const double *pb = phi + ((size_t)k * B + b) * D;
            for (int j = 0; j < D; j++) v[j] = pb[j];
            v[D] = y[b];
            for (int j = 0; j < D; j++) {
                const double vj = v[j];
                if (vj == 0.0) continue;
                double *wj = w + (size_t)j * W;
                const double h = hypot(wj[j], vj);
                const double c = wj[j] / h, s = vj / h;
                wj[j] = h;
                v[j] = 0.0;
                for (int l = j + 1; l < W; l++) {
                    const double a = wj[l], t = v[l];
                    wj[l] = c * a + s * t;
                    v[l] = c * t - s * a;
                }
            }
            e = hypot(e, v[D]);
        }
        double logdet = 0.0;
        double *r2 = R2 + (size_t)k * D * D, *zo = z2 + (size_t)k * D;
        for (int i = 0; i < D; i++) {
            logdet += log(fabs(rk[i * D + i])) - log(fabs(w[i * W + i]));
            for (int j = 0; j < D; j++) r2[i * D + j] = w[i * W + j];
            zo[i] = w[i * W + D];
        }
        const double a = ab[2 * k], bb = ab[2 * k + 1];
        const double a2 = a + 0.5 * (double)B, b2 = bb + 0.5 * e * e;
        ab2[2 * k] = a2;
        ab2[2 * k + 1] = b2;
        int sign; /* lgamma_r: lgamma writes the global signgam, and two API threads may run this at once */
        lp[k] = lgamma_r(a2, &sign) - lgamma_r(a, &sign) + a * log(bb) - a2 * log(b2) + logdet - 0.5 * (double)B * LOG_2PI;
    }
    free(w);
    return 0;
}
