//! Gemma 3's row kernels on the emulator against f64 references: per-head q/k RMSNorm in
//! place on a fused q|k|v buffer (`rms_norm_heads`), GELU-tanh-and-mul, the post-norms
//! (`add_rms_norm`: residual += rms_norm(branch) * weight) and the embedding scale
//! (`scale_rows`), in f32 / f16 / bf16, on the vectorised and the scalar paths.
mod common;

use common::{assert_bits_eq, assert_close, round, to_f64, TestRng, BF16, F16, THREADS};
use gpu_kernels::device::emu::launch;
use gpu_kernels::elementwise::{gelu_tanh_and_mul, scale_rows};
use gpu_kernels::norm::{add_rms_norm, rms_norm_heads};
use gpu_kernels::{launch as geom, Storage};

const EPS: f32 = 1e-6;

fn rms_ref(x: &[f64], w: &[f64]) -> Vec<f64> {
    let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64 + EPS as f64).sqrt();
    x.iter().zip(w).map(|(a, b)| a * inv * b).collect()
}

/// One fused `[tokens, row_stride]` q|k|v buffer: the q and k heads normalised in place,
/// the v heads and the row padding left bit for bit.
fn heads_case<T: Storage>(
    r: &mut TestRng,
    head_dim: usize,
    nq: usize,
    nk: usize,
    pad: usize,
    threads: u32,
) {
    let tokens = r.range(1, 4);
    let row_stride = (nq + 2 * nk) * head_dim + pad;
    let x: Vec<T> = r.vec(tokens * row_stride, -3.0, 3.0);
    let qw: Vec<T> = r.vec(head_dim, 0.5, 1.5);
    let kw: Vec<T> = r.vec(head_dim, -1.5, 1.5);
    let (qwf, kwf) = (to_f64(&qw), to_f64(&kw));
    let mut want = to_f64(&x);
    for t in 0..tokens {
        for h in 0..nq + nk {
            let at = t * row_stride + h * head_dim;
            let w = if h < nq { &qwf } else { &kwf };
            let y = rms_ref(&want[at..at + head_dim], w);
            want[at..at + head_dim].copy_from_slice(&y);
        }
    }
    let mut xi = x.clone();
    let (xp, qp, kp) = (xi.as_mut_ptr(), qw.as_ptr(), kw.as_ptr());
    let cfg = geom::per_head(tokens as u32, (nq + nk) as u32, threads);
    // SAFETY: `x` is `[tokens, row_stride]` with the q and k heads at the row's start,
    // weights `[head_dim]`; the kernel reads and writes `x` in place.
    unsafe {
        launch(cfg, || {
            rms_norm_heads::<T>(
                xp,
                qp,
                kp,
                EPS,
                head_dim as u32,
                nq as u32,
                nk as u32,
                row_stride as u32,
            )
        })
    };
    let what = format!(
        "rms_norm_heads tokens={tokens} head_dim={head_dim} heads={nq}+{nk} stride={row_stride} threads={threads}"
    );
    assert_close(&what, r.seed, &xi, &want);
    // The v heads and the padding are untouched, bit for bit.
    for t in 0..tokens {
        let from = t * row_stride + (nq + nk) * head_dim;
        let to = (t + 1) * row_stride;
        assert_bits_eq(
            &format!("{what} v part"),
            r.seed,
            &xi[from..to],
            &x[from..to],
        );
    }
}

fn heads_all<T: Storage>(name: &str) {
    let mut r = TestRng::new(name);
    // Gemma-3-270M (head 256, 4 q heads, 1 kv head) with one and eight warps; GQA 8:2 at
    // head 128; head 20 with a padded stride (rows not 16-byte aligned for 16-bit types:
    // the scalar path); head 64 with an odd padding (only the first row aligned).
    heads_case::<T>(&mut r, 256, 4, 1, 0, 32);
    heads_case::<T>(&mut r, 256, 4, 1, 0, 256);
    heads_case::<T>(&mut r, 128, 8, 2, 0, THREADS);
    heads_case::<T>(&mut r, 20, 3, 1, 4, THREADS);
    heads_case::<T>(&mut r, 64, 2, 2, 3, THREADS);
}

#[test]
fn rms_norm_heads_all_dtypes() {
    heads_all::<f32>("rms_norm_heads_f32");
    heads_all::<F16>("rms_norm_heads_f16");
    heads_all::<BF16>("rms_norm_heads_bf16");
}

/// `0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))) * u` in f64.
fn gelu_tanh_ref(g: f64, u: f64) -> f64 {
    let k = (2.0 / std::f64::consts::PI).sqrt();
    0.5 * g * (1.0 + (k * (g + 0.044715 * g * g * g)).tanh()) * u
}

fn gelu_case<T: Storage>(name: &str) {
    let mut r = TestRng::new(name);
    for d in [2048usize, 100, 37] {
        let tokens = r.range(1, 4);
        let mut x: Vec<T> = r.vec(tokens * 2 * d, -6.0, 6.0);
        // Large |g|: tanh saturates (no inf / inf, no NaN), and the exact zero.
        for (j, g) in [-100.0f32, -30.0, -9.5, 0.0, 9.5, 30.0, 100.0]
            .into_iter()
            .enumerate()
        {
            x[j] = T::from_f32(g);
        }
        let want: Vec<f64> = (0..tokens)
            .flat_map(|t| {
                let x = &x;
                (0..d).map(move |j| {
                    let g = x[t * 2 * d + j].to_f32() as f64;
                    gelu_tanh_ref(g, x[t * 2 * d + d + j].to_f32() as f64)
                })
            })
            .collect();
        let mut out = common::poisoned::<T>(tokens * d);
        let (o, xp) = (out.as_mut_ptr(), x.as_ptr());
        // SAFETY: buffers sized `[tokens, 2d]` and `[tokens, d]`.
        unsafe {
            launch(geom::per_row(tokens as u32, THREADS), || {
                gelu_tanh_and_mul::<T>(o, xp, d as u32)
            })
        };
        assert_close(
            &format!("gelu_tanh_and_mul tokens={tokens} d={d}"),
            r.seed,
            &out,
            &want,
        );
    }
}

#[test]
fn gelu_tanh_and_mul_all_dtypes() {
    gelu_case::<f32>("gelu_f32");
    gelu_case::<F16>("gelu_f16");
    gelu_case::<BF16>("gelu_bf16");
}

fn add_norm_case<T: Storage>(name: &str) {
    let mut r = TestRng::new(name);
    // Gemma-3-270M's 640, SmolLM2's 576, 4096; 50 is not a whole number of 16-byte
    // vectors (the scalar path).
    for hidden in [640usize, 576, 50, 4096] {
        let rows = r.range(1, 4);
        let x: Vec<T> = r.vec(rows * hidden, -4.0, 4.0);
        let input: Vec<T> = r.vec(rows * hidden, -2.0, 2.0);
        let w: Vec<T> = r.vec(hidden, -1.5, 1.5);
        let (xf, inf, wf) = (to_f64(&x), to_f64(&input), to_f64(&w));
        let want: Vec<f64> = inf
            .chunks(hidden)
            .flat_map(|row| rms_ref(row, &wf))
            .zip(&xf)
            .map(|(y, a)| a + y)
            .collect();
        let mut xi = x.clone();
        let (xp, ip, wp) = (xi.as_mut_ptr(), input.as_ptr(), w.as_ptr());
        // SAFETY: `x`, `input`: `[rows, hidden]`, distinct; `weight`: `[hidden]`.
        unsafe {
            launch(geom::per_row(rows as u32, THREADS), || {
                add_rms_norm::<T>(xp, ip, wp, EPS, hidden as u32)
            })
        };
        assert_close(
            &format!("add_rms_norm rows={rows} hidden={hidden}"),
            r.seed,
            &xi,
            &want,
        );
    }
}

#[test]
fn add_rms_norm_all_dtypes() {
    add_norm_case::<f32>("add_rms_norm_f32");
    add_norm_case::<F16>("add_rms_norm_f16");
    add_norm_case::<BF16>("add_rms_norm_bf16");
}

fn scale_case<T: Storage>(name: &str) {
    let mut r = TestRng::new(name);
    // 50 at 16-bit types: rows after the first are not 16-byte aligned (scalar path).
    for width in [640usize, 50, 4096, 3] {
        let rows = r.range(1, 5);
        let s = (width as f32).sqrt();
        let x: Vec<T> = r.vec(rows * width, -1.0, 1.0);
        let want: Vec<f64> = to_f64(&x)
            .iter()
            .map(|v| round::<T>(v * s as f64))
            .collect();
        let mut xi = x.clone();
        let xp = xi.as_mut_ptr();
        // SAFETY: `x` is `[rows, width]`.
        unsafe {
            launch(geom::per_row(rows as u32, THREADS), || {
                scale_rows::<T>(xp, s, width as u32)
            })
        };
        assert_close(
            &format!("scale_rows rows={rows} width={width} s={s}"),
            r.seed,
            &xi,
            &want,
        );
    }
}

#[test]
fn scale_rows_all_dtypes() {
    scale_case::<f32>("scale_rows_f32");
    scale_case::<F16>("scale_rows_f16");
    scale_case::<BF16>("scale_rows_bf16");
}

/// The engine's emulated device launches by name with host-style arguments: the entry
/// `rms_norm_heads_bf16` takes them in the documented order and gives the same bits as
/// the direct call.
#[test]
fn rms_norm_heads_by_name_matches_the_direct_call() {
    use gpu_kernels::entries::emulate;
    use gpu_kernels::KernelArg;
    let mut r = TestRng::new("rms_norm_heads_by_name");
    let (tokens, hd, nq, nk) = (3usize, 256usize, 4usize, 1usize);
    let stride = (nq + 2 * nk) * hd;
    let x: Vec<BF16> = r.vec(tokens * stride, -3.0, 3.0);
    let (qw, kw): (Vec<BF16>, Vec<BF16>) = (r.vec(hd, 0.5, 1.5), r.vec(hd, 0.5, 1.5));
    let cfg = geom::per_head(tokens as u32, (nq + nk) as u32, 32);
    let mut direct = x.clone();
    let (dp, qp, kp) = (direct.as_mut_ptr(), qw.as_ptr(), kw.as_ptr());
    // SAFETY: buffers as in `heads_case`.
    unsafe {
        launch(cfg, || {
            rms_norm_heads::<BF16>(
                dp,
                qp,
                kp,
                EPS,
                hd as u32,
                nq as u32,
                nk as u32,
                stride as u32,
            )
        })
    };
    let mut named = x.clone();
    let addr = |p: usize| KernelArg::Ptr(p as u64);
    let args = [
        addr(named.as_mut_ptr() as usize),
        addr(qp as usize),
        addr(kp as usize),
        KernelArg::F32(EPS),
        KernelArg::U32(hd as u32),
        KernelArg::U32(nq as u32),
        KernelArg::U32(nk as u32),
        KernelArg::U32(stride as u32),
    ];
    // SAFETY: as above, the same buffers passed by address.
    unsafe { emulate("rms_norm_heads_bf16", cfg, &args) }.expect("launch by name");
    assert_bits_eq("rms_norm_heads by name", r.seed, &named, &direct);
    assert!(named != x, "nothing was normalised");
}
