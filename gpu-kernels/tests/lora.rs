//! Multi-LoRA kernels (`lora.rs`: BGMV shrink/expand for decode, SGMV for prefill
//! segments) on the emulator against an f64 reference, in f32 / f16 / bf16: mixed and
//! repeated slots with rows and segments without an adapter (-1), ranks 1, 8 and 16 in
//! a max-rank-16 stack (and odd max ranks), `in`/`out` sizes that are not multiples of
//! the block's vector stride (576, 1536) or of the vector width (37, 45: the scalar
//! paths), the delta written into a column slice of a wider output, and segments of 1,
//! 7 and 33 rows. BGMV and SGMV agree on the same input. The adapters' padding (ranks
//! past a slot's own) and `t` are NaN-filled: a kernel that read either would fail.
mod common;

use common::{to_f64, TestRng, BF16, F16, THREADS};
use gpu_kernels::device::emu::launch;
use gpu_kernels::entries::emulate;
use gpu_kernels::lora::{bgmv_expand, bgmv_shrink, sgmv_expand, sgmv_shrink};
use gpu_kernels::{launch as geom, KernelArg, Storage};

/// Stacked adapters as the kernels read them.
struct Adapters<T> {
    in_dim: usize,
    out_dim: usize,
    max_rank: usize,
    /// `[slots, max_rank, in_dim]`, NaN past each slot's rank.
    a: Vec<T>,
    /// `[slots, out_dim, max_rank]`, NaN past each slot's rank.
    b: Vec<T>,
    ranks: Vec<u32>,
    scales: Vec<f32>,
}

impl<T: Storage> Adapters<T> {
    fn new(r: &mut TestRng, in_dim: usize, out_dim: usize, max_rank: usize, ranks: &[u32]) -> Self {
        let slots = ranks.len();
        let nan = T::from_f32(f32::NAN);
        let mut a = vec![nan; slots * max_rank * in_dim];
        let mut b = vec![nan; slots * out_dim * max_rank];
        for (s, &rank) in ranks.iter().enumerate() {
            let rank = rank as usize;
            for q in 0..rank {
                let at = (s * max_rank + q) * in_dim;
                a[at..at + in_dim].copy_from_slice(&r.vec::<T>(in_dim, -0.5, 0.5));
            }
            for o in 0..out_dim {
                let at = (s * out_dim + o) * max_rank;
                b[at..at + rank].copy_from_slice(&r.vec::<T>(rank, -0.5, 0.5));
            }
        }
        let scales = (0..slots)
            .map(|_| r.rng_f32(0.25, 2.0))
            .collect::<Vec<f32>>();
        Self {
            in_dim,
            out_dim,
            max_rank,
            a,
            b,
            ranks: ranks.to_vec(),
            scales,
        }
    }
}

trait RngF32 {
    fn rng_f32(&mut self, lo: f32, hi: f32) -> f32;
}
impl RngF32 for TestRng {
    fn rng_f32(&mut self, lo: f32, hi: f32) -> f32 {
        use rand::Rng;
        self.rng.gen_range(lo..hi)
    }
}

/// Where the delta of row `i` lands: `y[i * stride + offset ..][..out_dim]`.
#[derive(Clone, Copy)]
struct Out {
    stride: usize,
    offset: usize,
}

/// f64 reference: `(want, mag)` over the whole `y` buffer, `mag` the magnitude the
/// f32 accumulation error scales with (`|y| + |scale| sum_r sum_k |x A| |B|`); entries
/// the kernels must not touch have `mag < 0`.
fn reference<T: Storage>(
    ad: &Adapters<T>,
    x: &[T],
    idx: &[i32],
    y0: &[T],
    out: Out,
) -> (Vec<f64>, Vec<f64>) {
    let (xf, af, bf) = (to_f64(x), to_f64(&ad.a), to_f64(&ad.b));
    let (n, mr) = (ad.in_dim, ad.max_rank);
    let mut want = to_f64(y0);
    let mut mag = vec![-1.0; y0.len()];
    for (i, &s) in idx.iter().enumerate() {
        if s < 0 {
            continue;
        }
        let s = s as usize;
        let rank = ad.ranks[s] as usize;
        let scale = ad.scales[s] as f64;
        let xr = &xf[i * n..(i + 1) * n];
        let (t, t_abs): (Vec<f64>, Vec<f64>) = (0..rank)
            .map(|q| {
                let ar = &af[(s * mr + q) * n..][..n];
                let dot = xr.iter().zip(ar).map(|(a, b)| a * b).sum::<f64>();
                let abs = xr.iter().zip(ar).map(|(a, b)| (a * b).abs()).sum::<f64>();
                (dot, abs)
            })
            .unzip();
        for o in 0..ad.out_dim {
            let br = &bf[(s * ad.out_dim + o) * mr..][..rank];
            let d: f64 = (0..rank).map(|q| t[q] * br[q]).sum();
            let m: f64 = (0..rank).map(|q| t_abs[q] * br[q].abs()).sum();
            let at = i * out.stride + out.offset + o;
            mag[at] = want[at].abs() + scale.abs() * m;
            want[at] += scale * d;
        }
    }
    (want, mag)
}

/// Unit roundoff of `T` (the one rounding of the stored result).
fn unit<T: Storage>() -> f64 {
    match T::NAME {
        "f32" => f64::powi(2.0, -24),
        "f16" => f64::powi(2.0, -11),
        _ => f64::powi(2.0, -8),
    }
}

/// Every touched element within `unit(T) |want| + 2e-5 mag + 1e-6` (the final rounding
/// to `T` plus f32 accumulation, which the 2e-5 bounds with room for 1536-term sums);
/// every untouched element equal to `y0` bit for bit.
fn check<T: Storage>(what: &str, seed: u64, got: &[T], y0: &[T], want: &[f64], mag: &[f64]) {
    check_rounded(what, seed, got, y0, want, mag, 1.0);
}

/// [`check`] with `roundings` roundings to `T` allowed (2 when `want` is itself a
/// kernel's rounded output).
fn check_rounded<T: Storage>(
    what: &str,
    seed: u64,
    got: &[T],
    y0: &[T],
    want: &[f64],
    mag: &[f64],
    roundings: f64,
) {
    let u = unit::<T>();
    for (e, g) in got.iter().enumerate() {
        let g32 = g.to_f32();
        if mag[e] < 0.0 {
            assert_eq!(
                g32.to_bits(),
                y0[e].to_f32().to_bits(),
                "{what} [{}]: element {e} outside the delta was written (seed {seed})",
                T::NAME
            );
            continue;
        }
        let (g, w) = (g32 as f64, want[e]);
        let tol = roundings * u * w.abs() + 2e-5 * mag[e] + 1e-6;
        assert!(
            (g - w).abs() <= tol,
            "{what} [{}]: element {e}: got {g}, want {w} (tol {tol}; seed {seed})",
            T::NAME
        );
    }
}

/// Runs BGMV (shrink then expand) on `y` in place.
fn run_bgmv<T: Storage>(
    ad: &Adapters<T>,
    x: &[T],
    idx: &[i32],
    y: &mut [T],
    out: Out,
    threads: u32,
) {
    let rows = idx.len();
    let mut t = vec![f32::NAN; rows * ad.max_rank];
    let (tp, xp, ap, bp) = (t.as_mut_ptr(), x.as_ptr(), ad.a.as_ptr(), ad.b.as_ptr());
    let (ip, rp, sp, yp) = (
        idx.as_ptr(),
        ad.ranks.as_ptr(),
        ad.scales.as_ptr(),
        y.as_mut_ptr(),
    );
    let (n, o, mr) = (ad.in_dim as u32, ad.out_dim as u32, ad.max_rank as u32);
    // SAFETY: buffers sized as `bgmv_shrink` / `bgmv_expand` require: `x` [rows, in], the
    // stacks [slots, max_rank, in] / [slots, out, max_rank], `idx` [rows] of valid slots
    // or -1, `t` [rows, max_rank], `y` rows of `out.stride` with the slice inside.
    unsafe {
        launch(geom::lora_bgmv_shrink(rows as u32, mr, threads), || {
            bgmv_shrink::<T>(tp, xp, ap, ip, rp, n, mr)
        });
        let tc = tp as *const f32;
        launch(geom::lora_bgmv_expand(rows as u32, o, threads), || {
            bgmv_expand::<T>(
                yp,
                tc,
                bp,
                ip,
                rp,
                sp,
                o,
                mr,
                out.stride as u32,
                out.offset as u32,
            )
        });
    }
}

/// Runs SGMV (shrink then expand) on `y` in place.
fn run_sgmv<T: Storage>(
    ad: &Adapters<T>,
    x: &[T],
    seg_starts: &[u32],
    seg_idx: &[i32],
    y: &mut [T],
    out: Out,
    threads: u32,
) {
    let rows = *seg_starts.last().unwrap() as usize;
    let segs = seg_idx.len() as u32;
    let mut t = vec![f32::NAN; rows * ad.max_rank];
    let (tp, xp, ap, bp) = (t.as_mut_ptr(), x.as_ptr(), ad.a.as_ptr(), ad.b.as_ptr());
    let (ssp, sip) = (seg_starts.as_ptr(), seg_idx.as_ptr());
    let (rp, sp, yp) = (ad.ranks.as_ptr(), ad.scales.as_ptr(), y.as_mut_ptr());
    let (n, o, mr) = (ad.in_dim as u32, ad.out_dim as u32, ad.max_rank as u32);
    // SAFETY: as `run_bgmv`, with `seg_starts` [segs + 1] non-decreasing up to `rows`
    // and `seg_idx` [segs] of valid slots or -1.
    unsafe {
        launch(
            geom::lora_sgmv_shrink(rows as u32, segs, mr, threads),
            || sgmv_shrink::<T>(tp, xp, ap, ssp, sip, rp, segs, n, mr),
        );
        let tc = tp as *const f32;
        launch(
            geom::lora_sgmv_expand(rows as u32, segs, o, threads),
            || {
                sgmv_expand::<T>(
                    yp,
                    tc,
                    bp,
                    ssp,
                    sip,
                    rp,
                    sp,
                    segs,
                    o,
                    mr,
                    out.stride as u32,
                    out.offset as u32,
                )
            },
        );
    }
}

/// One shape: BGMV over rows with mixed slots, SGMV over segments of 1, 7 and 33 rows
/// (and one of 5 without an adapter), BGMV on the SGMV rows' slots, all against the
/// reference and SGMV against BGMV.
fn case<T: Storage>(
    r: &mut TestRng,
    in_dim: usize,
    out_dim: usize,
    max_rank: usize,
    ranks: &[u32],
    seg_slots: &[i32; 4],
    threads: u32,
) {
    let ad = Adapters::<T>::new(r, in_dim, out_dim, max_rank, ranks);
    let slots = ranks.len() as i32;
    // The delta goes into a column slice of a wider, fused output.
    let out = Out {
        stride: out_dim + 13,
        offset: 7,
    };
    let shape = format!(
        "in={in_dim} out={out_dim} max_rank={max_rank} ranks={ranks:?} stride={} offset={} threads={threads}",
        out.stride, out.offset
    );

    // BGMV: 9 rows, every slot at least once and repeated, two rows without an adapter.
    let mut idx: Vec<i32> = (0..9)
        .map(|i| if i % 4 == 1 { -1 } else { i % slots })
        .collect();
    let perm = r.shuffled(idx.len());
    idx = perm.iter().map(|&p| idx[p as usize]).collect();
    let rows = idx.len();
    let x: Vec<T> = r.vec(rows * in_dim, -1.0, 1.0);
    let y0: Vec<T> = r.vec(rows * out.stride, -2.0, 2.0);
    let (want, mag) = reference(&ad, &x, &idx, &y0, out);
    let mut y = y0.clone();
    run_bgmv(&ad, &x, &idx, &mut y, out, threads);
    check(
        &format!("bgmv {shape} idx={idx:?}"),
        r.seed,
        &y,
        &y0,
        &want,
        &mag,
    );

    // SGMV: segments of 1, 7, 33 and 5 rows.
    let lens = [1u32, 7, 33, 5];
    let mut seg_starts = vec![0u32];
    for l in lens {
        seg_starts.push(seg_starts.last().unwrap() + l);
    }
    let rows = *seg_starts.last().unwrap() as usize;
    let row_idx: Vec<i32> = (0..4)
        .flat_map(|g| std::iter::repeat_n(seg_slots[g], lens[g] as usize))
        .collect();
    let x: Vec<T> = r.vec(rows * in_dim, -1.0, 1.0);
    let y0: Vec<T> = r.vec(rows * out.stride, -2.0, 2.0);
    let (want, mag) = reference(&ad, &x, &row_idx, &y0, out);
    let mut ys = y0.clone();
    run_sgmv(&ad, &x, &seg_starts, seg_slots, &mut ys, out, threads);
    let what = format!("sgmv {shape} segments={lens:?} slots={seg_slots:?}");
    check(&what, r.seed, &ys, &y0, &want, &mag);
    let mut yb = y0.clone();
    run_bgmv(&ad, &x, &row_idx, &mut yb, out, threads);
    check(
        &format!("bgmv on the sgmv rows {shape}"),
        r.seed,
        &yb,
        &y0,
        &want,
        &mag,
    );
    // The two agree with each other within the same bound, doubled: both accumulate
    // and both round (so they may differ by one unit in the last place of `T`).
    let mag2: Vec<f64> = mag
        .iter()
        .map(|m| if *m < 0.0 { *m } else { 2.0 * m })
        .collect();
    let what = format!("sgmv vs bgmv {shape}");
    check_rounded(&what, r.seed, &ys, &y0, &to_f64(&yb), &mag2, 2.0);
}

fn all_shapes<T: Storage>(name: &str) {
    let mut r = TestRng::new(name);
    // Ranks 1, 8 and 16 in a max-rank-16 stack (vector path for B at every dtype);
    // `in`/`out` whole vectors but not whole multiples of 32 lanes' worth.
    case::<T>(&mut r, 576, 1536, 16, &[1, 8, 16], &[0, 1, 2, -1], THREADS);
    case::<T>(&mut r, 1536, 576, 16, &[16, 1, 8], &[2, 0, 2, -1], THREADS);
    // Odd sizes (x / A rows not whole vectors: the element-wise paths); max rank 12
    // (B rows whole vectors at f32 only) and 5 (never).
    case::<T>(&mut r, 37, 45, 12, &[12, 3, 7], &[1, 0, 2, -1], THREADS);
    case::<T>(&mut r, 40, 33, 5, &[5, 2], &[1, 1, 0, -1], THREADS);
}

#[test]
fn lora_f32() {
    all_shapes::<f32>("lora_f32");
}

#[test]
fn lora_f16() {
    all_shapes::<F16>("lora_f16");
}

#[test]
fn lora_bf16() {
    all_shapes::<BF16>("lora_bf16");
}

/// One warp per block (SGMV tiles of 4 rows: the 33-row segment in 9 tiles) and the
/// launch's own 4 warps (tiles of 16 rows); a rank above 32 (two SGMV rank chunks for shrink, two `k` steps for expand).
#[test]
fn lora_block_sizes_and_large_rank() {
    let mut r = TestRng::new("lora_block_sizes_and_large_rank");
    case::<BF16>(&mut r, 96, 70, 16, &[16, 8], &[0, 1, 0, -1], 32);
    case::<F16>(
        &mut r,
        96,
        70,
        16,
        &[16, 8],
        &[1, 0, 1, -1],
        geom::LORA_THREADS,
    );
    case::<f32>(&mut r, 72, 40, 48, &[48, 33, 1], &[0, 1, 2, -1], THREADS);
}

fn addr<T>(p: *const T) -> KernelArg {
    KernelArg::Ptr(p as usize as u64)
}

/// The entry points by name, with arguments as a CUDA host passes them (how the
/// engine's emulated device launches): BGMV shrink then expand, f32, against the
/// formula.
#[test]
fn lora_entries_by_name() {
    let (rows, n, out, mr) = (3usize, 8usize, 5usize, 2usize);
    let x: Vec<f32> = (0..rows * n).map(|i| (i as f32 * 0.3).sin()).collect();
    let a: Vec<f32> = (0..mr * n).map(|i| (i as f32 * 0.7).cos()).collect();
    let b: Vec<f32> = (0..out * mr).map(|i| 0.1 * i as f32 - 0.2).collect();
    let (idx, ranks, scales) = ([0i32, -1, 0], [2u32], [0.5f32]);
    let mut t = vec![f32::NAN; rows * mr];
    let mut y = vec![1.0f32; rows * out];
    let shrink = [
        addr(t.as_mut_ptr()),
        addr(x.as_ptr()),
        addr(a.as_ptr()),
        addr(idx.as_ptr()),
        addr(ranks.as_ptr()),
        KernelArg::U32(n as u32),
        KernelArg::U32(mr as u32),
    ];
    let expand = [
        addr(y.as_mut_ptr()),
        addr(t.as_ptr()),
        addr(b.as_ptr()),
        addr(idx.as_ptr()),
        addr(ranks.as_ptr()),
        addr(scales.as_ptr()),
        KernelArg::U32(out as u32),
        KernelArg::U32(mr as u32),
        KernelArg::U32(out as u32),
        KernelArg::U32(0),
    ];
    // SAFETY: buffers sized as the kernels require (see the shapes above).
    unsafe {
        let cfg = geom::lora_bgmv_shrink(rows as u32, mr as u32, 32);
        emulate("lora_bgmv_shrink_f32", cfg, &shrink).expect("shrink");
        let cfg = geom::lora_bgmv_expand(rows as u32, out as u32, 32);
        emulate("lora_bgmv_expand_f32", cfg, &expand).expect("expand");
    }
    for i in 0..rows {
        for o in 0..out {
            let mut want = 1.0f32;
            if idx[i] >= 0 {
                let d: f32 = (0..mr)
                    .map(|q| {
                        let tq: f32 = (0..n).map(|k| x[i * n + k] * a[q * n + k]).sum();
                        tq * b[o * mr + q]
                    })
                    .sum();
                want += 0.5 * d;
            }
            let got = y[i * out + o];
            assert!(
                (got - want).abs() < 1e-5,
                "row {i} out {o}: {got} vs {want}"
            );
        }
    }
}
