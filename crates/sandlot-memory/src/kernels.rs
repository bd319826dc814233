//! Dense vector kernels of the embedder and the vector index, with runtime CPU dispatch.
//!
//! The crate is compiled for the x86-64 baseline (SSE2); these kernels pick AVX2 + FMA at run
//! time where the CPU has them (through `pulp`, which encapsulates the target-feature calls, so
//! this crate keeps no `unsafe`), and a portable path otherwise (other CPUs, other
//! architectures: `pulp` maps the same code to NEON or scalar lanes).

use std::sync::LazyLock;

use pulp::{Arch, Simd, WithSimd};

/// The instruction set detected once per process.
static ARCH: LazyLock<Arch> = LazyLock::new(Arch::new);

fn arch() -> Arch {
    *ARCH
}

/// `a · b` over the common length, in SIMD lanes (four independent accumulators).
#[inline(always)]
fn dot_lanes<S: Simd>(simd: S, a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (av, at) = S::as_simd_f32s(&a[..n]);
    let (bv, bt) = S::as_simd_f32s(&b[..n]);
    let (a4, a1) = pulp::as_arrays::<4, _>(av);
    let (b4, b1) = pulp::as_arrays::<4, _>(bv);
    let zero = simd.splat_f32s(0.0);
    let mut acc = [zero; 4];
    for (x, y) in a4.iter().zip(b4) {
        acc[0] = simd.mul_add_f32s(x[0], y[0], acc[0]);
        acc[1] = simd.mul_add_f32s(x[1], y[1], acc[1]);
        acc[2] = simd.mul_add_f32s(x[2], y[2], acc[2]);
        acc[3] = simd.mul_add_f32s(x[3], y[3], acc[3]);
    }
    for (x, y) in a1.iter().zip(b1) {
        acc[0] = simd.mul_add_f32s(*x, *y, acc[0]);
    }
    let sum = simd.add_f32s(simd.add_f32s(acc[0], acc[1]), simd.add_f32s(acc[2], acc[3]));
    let mut s = simd.reduce_sum_f32s(sum);
    for (x, y) in at.iter().zip(bt) {
        s += x * y;
    }
    s
}

/// `y += alpha * x` over the common length.
#[inline(always)]
fn axpy_lanes<S: Simd>(simd: S, alpha: f32, x: &[f32], y: &mut [f32]) {
    let n = x.len().min(y.len());
    let (xv, xt) = S::as_simd_f32s(&x[..n]);
    let (yv, yt) = S::as_mut_simd_f32s(&mut y[..n]);
    let a = simd.splat_f32s(alpha);
    for (xi, yi) in xv.iter().zip(yv.iter_mut()) {
        *yi = simd.mul_add_f32s(a, *xi, *yi);
    }
    for (xi, yi) in xt.iter().zip(yt.iter_mut()) {
        *yi += alpha * xi;
    }
}

/// Dot product of two f32 vectors (cosine similarity for unit vectors).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    struct Op<'a>(&'a [f32], &'a [f32]);
    impl WithSimd for Op<'_> {
        type Output = f32;
        #[inline(always)]
        fn with_simd<S: Simd>(self, simd: S) -> f32 {
            dot_lanes(simd, self.0, self.1)
        }
    }
    arch().dispatch(Op(a, b))
}

/// `out = x · wᵀ + bias` for `m` rows of `x` (each `k` wide) and a weight matrix `w` of
/// `bias.len()` rows of `k` (PyTorch's `Linear` layout); `out` is `m × bias.len()`, row-major.
///
/// Made for few rows (a query of a dozen tokens): every weight row is read from memory once,
/// blocks of four weight rows stay in L1 while they meet every pair of input rows.
pub(crate) fn linear(x: &[f32], k: usize, w: &[f32], bias: &[f32], out: &mut [f32]) {
    struct Op<'a> {
        x: &'a [f32],
        k: usize,
        w: &'a [f32],
        bias: &'a [f32],
        out: &'a mut [f32],
    }
    impl WithSimd for Op<'_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: Simd>(self, simd: S) {
            let Op { x, k, w, bias, out } = self;
            let n = bias.len();
            let m = x.len() / k;
            assert_eq!(out.len(), m * n, "output is {m} x {n}");
            linear_lanes(simd, x, k, w, bias, out, n, 0);
        }
    }
    arch().dispatch(Op { x, k, w, bias, out })
}

/// Weights in 16 bits: a half-precision significand (11 bits) with a per-matrix exponent
/// offset, so the encoding needs no subnormals for the weights' range. Two weights per `u32`:
/// in each block of 16 weights, word `j` holds weight `j` in its upper half and weight `8 + j`
/// in its lower half, so that a SIMD register of words widens to two registers of f32 with
/// shifts and masks alone.
pub(crate) struct PackedWeights {
    pub(crate) words: Vec<u32>,
    /// `2^offset`: the decoded bit pattern times this is the weight.
    pub(crate) scale: f32,
}

const PACKED_MAG: u32 = 0x0fff_e000;
const SIGN: u32 = 0x8000_0000;

impl PackedWeights {
    /// Packs `w` (a whole number of 16-weight blocks); `None` when it is not, or has a weight
    /// that is not finite.
    pub(crate) fn pack(w: &[f32]) -> Option<PackedWeights> {
        if !w.len().is_multiple_of(16) || w.iter().any(|x| !x.is_finite()) {
            return None;
        }
        let max = w.iter().fold(0f32, |m, x| m.max(x.abs()));
        // Largest weight's binary exponent; the offset maps it to exponent field 30 (field 31
        // stays free for a rounding carry).
        let e = if max > 0.0 {
            ((max.to_bits() >> 23) & 0xff) as i32 - 127
        } else {
            0
        };
        let offset = (e + 97).clamp(-126, 126);
        let scale = f32::from_bits(((offset + 127) as u32) << 23);
        let inv = f32::from_bits(((127 - offset) as u32) << 23);
        let code = |x: f32| -> u32 {
            let y = (x * inv).to_bits();
            let mag = y & !SIGN;
            // Round to nearest, ties to even, at bit 13.
            let r = mag + 0x0fff + ((mag >> 13) & 1);
            ((y & SIGN) >> 16) | (r >> 13)
        };
        let mut words = Vec::with_capacity(w.len() / 2);
        for block in w.chunks_exact(16) {
            for j in 0..8 {
                words.push((code(block[j]) << 16) | code(block[8 + j]));
            }
        }
        Some(PackedWeights { words, scale })
    }

    /// The weight in the upper half of `w`.
    #[inline(always)]
    fn upper(w: u32, scale: f32) -> f32 {
        f32::from_bits(((w >> 3) & PACKED_MAG) | (w & SIGN)) * scale
    }

    /// The weight in the lower half of `w`.
    #[inline(always)]
    fn lower(w: u32, scale: f32) -> f32 {
        f32::from_bits(((w << 13) & PACKED_MAG) | ((w << 16) & SIGN)) * scale
    }

    /// Every weight, decoded (tests).
    #[cfg(test)]
    pub(crate) fn unpack(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.words.len() * 2];
        decode_scalar(&self.words, self.scale, &mut out);
        out
    }
}

#[cfg(test)]
fn decode_scalar(words: &[u32], scale: f32, out: &mut [f32]) {
    for (wb, ob) in words.chunks_exact(8).zip(out.chunks_exact_mut(16)) {
        for j in 0..8 {
            ob[j] = PackedWeights::upper(wb[j], scale);
            ob[8 + j] = PackedWeights::lower(wb[j], scale);
        }
    }
}

/// Decodes packed weight words into `out` (twice as long), in SIMD lanes.
#[inline(always)]
fn decode_lanes<S: Simd>(simd: S, words: &[u32], scale: f32, out: &mut [f32]) {
    let (mag, sign, sc) = (
        simd.splat_u32s(PACKED_MAG),
        simd.splat_u32s(SIGN),
        simd.splat_f32s(scale),
    );
    let (s3, s13, s16) = (simd.splat_u32s(3), simd.splat_u32s(13), simd.splat_u32s(16));
    for (wb, ob) in words.chunks_exact(8).zip(out.chunks_exact_mut(16)) {
        let (upper, lower) = ob.split_at_mut(8);
        let (wv, wt) = S::as_simd_u32s(wb);
        let (uv, ut) = S::as_mut_simd_f32s(upper);
        let (lv, lt) = S::as_mut_simd_f32s(lower);
        for ((w, u), l) in wv.iter().zip(uv.iter_mut()).zip(lv.iter_mut()) {
            let hi = simd.or_u32s(
                simd.and_u32s(simd.wrapping_dyn_shr_u32s(*w, s3), mag),
                simd.and_u32s(*w, sign),
            );
            *u = simd.mul_f32s(simd.transmute_f32s_u32s(hi), sc);
            let lo = simd.or_u32s(
                simd.and_u32s(simd.wrapping_dyn_shl_u32s(*w, s13), mag),
                simd.and_u32s(simd.wrapping_dyn_shl_u32s(*w, s16), sign),
            );
            *l = simd.mul_f32s(simd.transmute_f32s_u32s(lo), sc);
        }
        for ((w, u), l) in wt.iter().zip(ut.iter_mut()).zip(lt.iter_mut()) {
            *u = PackedWeights::upper(*w, scale);
            *l = PackedWeights::lower(*w, scale);
        }
    }
}

/// [`linear`] with 16-bit weights (`w`: `bias.len()` rows of `k`, packed): blocks of rows are
/// decoded into a buffer that stays in L2, then multiplied as f32. Reads half the memory of
/// the f32 weights, which is what bounds a short query's forward pass.
pub(crate) fn linear_packed(
    x: &[f32],
    k: usize,
    w: &[u32],
    scale: f32,
    bias: &[f32],
    out: &mut [f32],
) {
    struct Op<'a> {
        x: &'a [f32],
        k: usize,
        w: &'a [u32],
        scale: f32,
        bias: &'a [f32],
        out: &'a mut [f32],
    }
    impl WithSimd for Op<'_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: Simd>(self, simd: S) {
            let Op {
                x,
                k,
                w,
                scale,
                bias,
                out,
            } = self;
            let n = bias.len();
            let m = x.len() / k;
            assert_eq!(w.len() * 2, n * k, "weight matrix is {n} x {k}");
            assert_eq!(out.len(), m * n, "output is {m} x {n}");
            // 16 rows at a time: 16 x 1536 x 4 bytes = 96 KiB at most.
            const BLOCK: usize = 16;
            let mut buf = vec![0f32; BLOCK * k];
            let mut o = 0;
            while o < n {
                let rows = BLOCK.min(n - o);
                let dec = &mut buf[..rows * k];
                decode_lanes(simd, &w[o * k / 2..(o + rows) * k / 2], scale, dec);
                linear_lanes(simd, x, k, dec, &bias[o..o + rows], out, n, o);
                o += rows;
            }
        }
    }
    arch().dispatch(Op {
        x,
        k,
        w,
        scale,
        bias,
        out,
    })
}

/// The product of [`linear`] for weight rows `w` (`bias.len()` of them), written to columns
/// `col..col + bias.len()` of `out` (`m × n`).
// Indexing six equally long slices by one counter keeps the loop free of bounds checks.
#[allow(clippy::needless_range_loop, clippy::too_many_arguments)]
#[inline(always)]
fn linear_lanes<S: Simd>(
    simd: S,
    x: &[f32],
    k: usize,
    w: &[f32],
    bias: &[f32],
    out: &mut [f32],
    n: usize,
    col: usize,
) {
    let rows = bias.len();
    let m = x.len() / k;
    assert_eq!(w.len(), rows * k, "weight matrix is {rows} x {k}");
    assert!(col + rows <= n && out.len() == m * n, "output is {m} x {n}");
    let row = |t: usize| S::as_simd_f32s(&x[t * k..(t + 1) * k]);
    let wrow = |o: usize| S::as_simd_f32s(&w[o * k..(o + 1) * k]);
    let tail_dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(p, q)| p * q).sum::<f32>();
    let zero = simd.splat_f32s(0.0);
    let mut o = 0;
    while o + 4 <= rows {
        let ws = [wrow(o), wrow(o + 1), wrow(o + 2), wrow(o + 3)];
        let len = ws[0].0.len();
        let (w0, w1, w2, w3) = (
            &ws[0].0[..len],
            &ws[1].0[..len],
            &ws[2].0[..len],
            &ws[3].0[..len],
        );
        let c = col + o;
        let mut t = 0;
        while t + 2 <= m {
            let (x0, x0t) = row(t);
            let (x1, x1t) = row(t + 1);
            let (x0, x1) = (&x0[..len], &x1[..len]);
            let mut acc = [zero; 8];
            for i in 0..len {
                let (p, q) = (x0[i], x1[i]);
                acc[0] = simd.mul_add_f32s(p, w0[i], acc[0]);
                acc[1] = simd.mul_add_f32s(p, w1[i], acc[1]);
                acc[2] = simd.mul_add_f32s(p, w2[i], acc[2]);
                acc[3] = simd.mul_add_f32s(p, w3[i], acc[3]);
                acc[4] = simd.mul_add_f32s(q, w0[i], acc[4]);
                acc[5] = simd.mul_add_f32s(q, w1[i], acc[5]);
                acc[6] = simd.mul_add_f32s(q, w2[i], acc[6]);
                acc[7] = simd.mul_add_f32s(q, w3[i], acc[7]);
            }
            for j in 0..4 {
                out[t * n + c + j] =
                    simd.reduce_sum_f32s(acc[j]) + tail_dot(x0t, ws[j].1) + bias[o + j];
                out[(t + 1) * n + c + j] =
                    simd.reduce_sum_f32s(acc[4 + j]) + tail_dot(x1t, ws[j].1) + bias[o + j];
            }
            t += 2;
        }
        if t < m {
            let (x0, x0t) = row(t);
            let x0 = &x0[..len];
            let mut acc = [zero; 4];
            for i in 0..len {
                let p = x0[i];
                acc[0] = simd.mul_add_f32s(p, w0[i], acc[0]);
                acc[1] = simd.mul_add_f32s(p, w1[i], acc[1]);
                acc[2] = simd.mul_add_f32s(p, w2[i], acc[2]);
                acc[3] = simd.mul_add_f32s(p, w3[i], acc[3]);
            }
            for j in 0..4 {
                out[t * n + c + j] =
                    simd.reduce_sum_f32s(acc[j]) + tail_dot(x0t, ws[j].1) + bias[o + j];
            }
        }
        o += 4;
    }
    for o in o..rows {
        let wo = &w[o * k..(o + 1) * k];
        for t in 0..m {
            out[t * n + col + o] = dot_lanes(simd, &x[t * k..(t + 1) * k], wo) + bias[o];
        }
    }
}

/// Multi-head self-attention of one sequence without padding: `qkv` holds per token its query,
/// key and value (each `heads * head_dim` wide, in that order); writes the context vectors
/// (`heads * head_dim` per token) to `ctx`.
pub(crate) fn attention(qkv: &[f32], heads: usize, head_dim: usize, ctx: &mut [f32]) {
    struct Op<'a> {
        qkv: &'a [f32],
        heads: usize,
        d: usize,
        ctx: &'a mut [f32],
    }
    impl WithSimd for Op<'_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: Simd>(self, simd: S) {
            let Op { qkv, heads, d, ctx } = self;
            let h = heads * d;
            let len = qkv.len() / (3 * h);
            assert_eq!(ctx.len(), len * h, "context is {len} x {h}");
            let scale = 1.0 / (d as f32).sqrt();
            let mut p = vec![0f32; len];
            ctx.iter_mut().for_each(|c| *c = 0.0);
            for head in 0..heads {
                let at = |t: usize, part: usize| {
                    let s = t * 3 * h + part * h + head * d;
                    &qkv[s..s + d]
                };
                for i in 0..len {
                    let q = at(i, 0);
                    let mut max = f32::NEG_INFINITY;
                    for (j, pj) in p.iter_mut().enumerate() {
                        *pj = dot_lanes(simd, q, at(j, 1)) * scale;
                        max = max.max(*pj);
                    }
                    let mut sum = 0f32;
                    for pj in p.iter_mut() {
                        *pj = (*pj - max).exp();
                        sum += *pj;
                    }
                    let inv = 1.0 / sum;
                    let out = &mut ctx[i * h + head * d..i * h + (head + 1) * d];
                    for (j, pj) in p.iter().enumerate() {
                        axpy_lanes(simd, pj * inv, at(j, 2), out);
                    }
                }
            }
        }
    }
    arch().dispatch(Op {
        qkv,
        heads,
        d: head_dim,
        ctx,
    })
}

/// erf(x) as the rational approximation Eigen and XLA use for f32 (x clamped to [-4, 4],
/// where erf is ±1 to f32 precision): no `exp`, so it vectorises; absolute error below 1e-6.
#[inline(always)]
pub(crate) fn erf(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let mut p = -2.726_142_3e-10_f32;
    for c in [
        2.770_681_4e-8,
        -2.101_024e-6,
        -5.692_506_4e-5,
        -7.349_906_3e-4,
        -2.954_6e-3,
        -1.609_603_3e-2,
    ] {
        p = p * x2 + c;
    }
    let mut q = -1.456_607_2e-5_f32;
    for c in [-2.133_740_6e-4, -1.682_827e-3, -7.373_329e-3, -1.426_474e-2] {
        q = q * x2 + c;
    }
    x * p / q
}

/// GELU (the exact, erf-based form BERT uses), in place.
pub(crate) fn gelu(xs: &mut [f32]) {
    arch().dispatch(|| {
        for x in xs.iter_mut() {
            *x = 0.5 * *x * (1.0 + erf(*x * std::f32::consts::FRAC_1_SQRT_2));
        }
    })
}

/// Layer normalisation of every `gamma.len()`-wide row of `xs`, in place.
pub(crate) fn layer_norm(xs: &mut [f32], gamma: &[f32], beta: &[f32], eps: f32) {
    let n = gamma.len();
    for row in xs.chunks_exact_mut(n) {
        let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64;
        let var = row
            .iter()
            .map(|&v| {
                let d = f64::from(v) - mean;
                d * d
            })
            .sum::<f64>()
            / n as f64;
        let inv = 1.0 / (var + f64::from(eps)).sqrt();
        for ((v, g), b) in row.iter_mut().zip(gamma).zip(beta) {
            *v = ((f64::from(*v) - mean) * inv) as f32 * g + b;
        }
    }
}

/// Integer dot product of two int8 vectors (portable: the compiler widens into 32-bit lanes).
#[inline]
pub(crate) fn dot_i8(a: &[i8], b: &[i8]) -> i32 {
    let mut acc = [0i32; 16];
    let ca = a.chunks_exact(16);
    let cb = b.chunks_exact(16);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for k in 0..16 {
            acc[k] += i32::from(x[k]) * i32::from(y[k]);
        }
    }
    let mut s: i32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        s += i32::from(*x) * i32::from(*y);
    }
    s
}

/// Scores int8 rows of `dim` against the int8 query `q` (values in -127..=127, as
/// [`crate::index`] quantises them) and passes each (row index, integer dot product) to `visit`,
/// in order. With AVX2: 32 bytes per step as |q| (unsigned) times the row with q's sign applied,
/// summed in pairs to i16 (at most 2 * 127 * 127, so it never saturates), then to i32.
pub(crate) fn scan_i8(q: &[i8], rows: &[i8], dim: usize, visit: &mut dyn FnMut(usize, i32)) {
    #[cfg(target_arch = "x86_64")]
    if let Some(simd) = pulp::x86::V3::try_new() {
        return simd.vectorize(|| scan_i8_v3(simd, q, rows, dim, visit));
    }
    for (r, row) in rows.chunks_exact(dim).enumerate() {
        visit(r, dot_i8(q, row));
    }
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn scan_i8_v3(
    simd: pulp::x86::V3,
    q: &[i8],
    rows: &[i8],
    dim: usize,
    visit: &mut dyn FnMut(usize, i32),
) {
    use pulp::bytemuck::cast;
    use pulp::{i16x16, i32x8, i8x32};
    let (qv, qt) = pulp::as_arrays::<32, _>(&q[..dim]);
    let signs: Vec<i8x32> = qv.iter().map(|c| cast::<[i8; 32], i8x32>(*c)).collect();
    // |q| as the sign of q applied to itself.
    let mags: Vec<i8x32> = signs.iter().map(|&s| simd.apply_sign_i8x32(s, s)).collect();
    let ones: i16x16 = simd.splat_i16x16(1);
    for (r, row) in rows.chunks_exact(dim).enumerate() {
        let (rv, rt) = pulp::as_arrays::<32, _>(row);
        let mut acc: i32x8 = simd.splat_i32x8(0);
        for ((c, s), m) in rv.iter().zip(&signs).zip(&mags) {
            let v = simd.apply_sign_i8x32(cast::<[i8; 32], i8x32>(*c), *s);
            let pairs = simd.multiply_saturating_add_adjacent_i8x32(*m, v);
            let quads = simd.multiply_wrapping_add_adjacent_i16x16(pairs, ones);
            acc = simd.wrapping_add_i32x8(acc, quads);
        }
        let lanes = cast::<i32x8, [i32; 8]>(acc);
        let mut s: i32 = lanes.iter().sum();
        for (x, y) in rt.iter().zip(qt) {
            s += i32::from(*x) * i32::from(*y);
        }
        visit(r, s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noise(seed: &mut u64, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                *seed ^= *seed << 13;
                *seed ^= *seed >> 7;
                *seed ^= *seed << 17;
                (*seed % 20001) as f32 / 10000.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn packed_weights_round_to_11_significant_bits() {
        let mut seed = 11;
        let mut w = noise(&mut seed, 1536 * 4);
        // Magnitudes over many binades, zeros and signs.
        for (i, x) in w.iter_mut().enumerate() {
            *x *= [1.0, 0.3, 0.01, 1e-4, 2.5][i % 5];
        }
        w[5] = 0.0;
        w[6] = -0.0;
        let p = PackedWeights::pack(&w).unwrap();
        assert_eq!(p.words.len(), w.len() / 2);
        let back = p.unpack();
        let max = w.iter().fold(0f32, |m, x| m.max(x.abs()));
        for (x, y) in w.iter().zip(&back) {
            // Relative error 2^-11 (half a unit in the 11th bit) for normal codes; absolute
            // below 2^-30 of the largest.
            let err = (x - y).abs();
            assert!(err <= x.abs() / 2048.0 + max * 1e-9, "{x} decoded as {y}");
            assert!(x.signum() == y.signum() || *x == 0.0);
        }
        assert_eq!(back[5], 0.0);
        assert!(PackedWeights::pack(&w[..15]).is_none());
        assert!(PackedWeights::pack(&[f32::NAN; 16]).is_none());
    }

    #[test]
    fn packed_linear_equals_linear_over_the_decoded_weights() {
        let mut seed = 5;
        for (m, k, n) in [(1, 384, 1152), (7, 384, 384), (12, 1536, 384), (3, 16, 20)] {
            let x = noise(&mut seed, m * k);
            let w = noise(&mut seed, n * k);
            let bias = noise(&mut seed, n);
            let p = PackedWeights::pack(&w).unwrap();
            let mut got = vec![0f32; m * n];
            linear_packed(&x, k, &p.words, p.scale, &bias, &mut got);
            let mut want = vec![0f32; m * n];
            linear(&x, k, &p.unpack(), &bias, &mut want);
            assert_eq!(got, want, "{m} x {k} x {n}");
        }
    }

    #[test]
    fn dot_matches_f64_reference_for_every_length() {
        let mut seed = 3;
        for n in [0, 1, 7, 8, 31, 32, 33, 384, 1536, 1541] {
            let (a, b) = (noise(&mut seed, n), noise(&mut seed, n));
            let want: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            assert!((dot(&a, &b) as f64 - want).abs() < 1e-4, "length {n}");
        }
    }

    #[test]
    fn linear_matches_naive_matrix_product() {
        let mut seed = 5;
        for (m, k, n) in [
            (1, 384, 384),
            (2, 16, 8),
            (3, 40, 7),
            (10, 384, 1536),
            (5, 9, 5),
        ] {
            let x = noise(&mut seed, m * k);
            let w = noise(&mut seed, n * k);
            let b = noise(&mut seed, n);
            let mut out = vec![f32::NAN; m * n];
            linear(&x, k, &w, &b, &mut out);
            for t in 0..m {
                for o in 0..n {
                    let want: f64 = (0..k)
                        .map(|i| x[t * k + i] as f64 * w[o * k + i] as f64)
                        .sum::<f64>()
                        + b[o] as f64;
                    let got = out[t * n + o] as f64;
                    assert!(
                        (got - want).abs() < 1e-3,
                        "{m}x{k}x{n} at ({t},{o}): {got} {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn attention_matches_naive_softmax_attention() {
        let mut seed = 11;
        let (heads, d, len) = (3, 8, 5);
        let h = heads * d;
        let qkv = noise(&mut seed, len * 3 * h);
        let mut ctx = vec![f32::NAN; len * h];
        attention(&qkv, heads, d, &mut ctx);
        for head in 0..heads {
            for i in 0..len {
                let q = |t: usize, p: usize, c: usize| qkv[t * 3 * h + p * h + head * d + c] as f64;
                let scores: Vec<f64> = (0..len)
                    .map(|j| {
                        (0..d).map(|c| q(i, 0, c) * q(j, 1, c)).sum::<f64>() / (d as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let z: f64 = e.iter().sum();
                for c in 0..d {
                    let want: f64 = (0..len).map(|j| e[j] / z * q(j, 2, c)).sum();
                    let got = ctx[i * h + head * d + c] as f64;
                    assert!(
                        (got - want).abs() < 1e-5,
                        "head {head} token {i}: {got} {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn erf_is_accurate_over_the_whole_range() {
        let mut x = -6.0f64;
        while x <= 6.0 {
            let got = erf(x as f32) as f64;
            let want = libm::erf(x);
            assert!((got - want).abs() < 2e-6, "erf({x}) = {got}, want {want}");
            x += 0.001;
        }
    }

    #[test]
    fn layer_norm_centres_and_scales() {
        let mut xs = vec![1.0, 2.0, 3.0, 4.0, 10.0, 10.0, 10.0, 10.0];
        layer_norm(&mut xs, &[1.0, 1.0, 2.0, 1.0], &[0.0, 0.0, 0.0, 0.5], 1e-12);
        let s = (1.25f32).sqrt();
        let want = [-1.5 / s, -0.5 / s, 2.0 * 0.5 / s, 1.5 / s + 0.5];
        for (g, w) in xs[..4].iter().zip(want) {
            assert!((g - w).abs() < 1e-5, "{g} {w}");
        }
        assert_eq!(&xs[4..], &[0.0, 0.0, 0.0, 0.5]);
    }

    #[test]
    fn int8_scan_matches_integer_arithmetic_at_the_extremes() {
        let mut seed = 17u64;
        for dim in [384, 390, 31, 64] {
            let mut q: Vec<i8> = (0..dim).map(|i| ((i * 37) % 255) as i8).collect();
            q.iter_mut().for_each(|v| *v = (*v).max(-127));
            q[0] = 127;
            q[1] = -127;
            q[2] = 0;
            let mut rows: Vec<i8> = noise(&mut seed, dim * 9)
                .iter()
                .map(|v| (v * 127.0).round() as i8)
                .collect();
            // A row of extremes against the query's extremes: the largest pair sums.
            for (i, r) in rows[..dim].iter_mut().enumerate() {
                *r = if q[i] < 0 { -127 } else { 127 };
            }
            let mut got = Vec::new();
            scan_i8(&q, &rows, dim, &mut |r, s| got.push((r, s)));
            let want: Vec<(usize, i32)> = rows
                .chunks_exact(dim)
                .enumerate()
                .map(|(r, row)| {
                    (
                        r,
                        q.iter()
                            .zip(row)
                            .map(|(a, b)| i32::from(*a) * i32::from(*b))
                            .sum(),
                    )
                })
                .collect();
            assert_eq!(got, want, "dim {dim}");
            assert_eq!(dot_i8(&q, &rows[..dim]), want[0].1);
        }
    }
}
