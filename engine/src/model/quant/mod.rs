//! Linear layers on block-quantized weights (GGUF `Q4_0` ... `Q6_K`), kept
//! in the file's type in memory.
//!
//! How a product `out[m, n] = x[m, k] W[n, k]^T` runs (llama.cpp's scheme
//! with a batched tile):
//! 1. [`act`]: each activation row is quantized per 32 values to 8 bits
//!    (`Q8_0`-style: `d = amax / 127`) plus, by default, a second 8-bit
//!    level for the rounding residual (16-bit precision: one level alone
//!    flips greedy picks of the golden prompts at margins up to 0.14 nats),
//!    with the scaled sum of every 16 (for the weights' offsets). Once per
//!    product.
//! 2. Up to [`GEMV_MAX_M`] rows (decode), every type but `Q2_K`, `Q3_K`
//!    and `Q8_K` multiplies
//!    straight on the file's blocks ([`gemv`]; several rows share each
//!    block's decode, [`gemv::dot_rows_many`]: up to [`MANY_MAX_M`] rows on
//!    AVX-512 VNNI, up to 8 rows (K-quants 6) on AVX2); otherwise:
//!    [`tile`]: a tile of [`NR`] weight rows is decoded once into unsigned
//!    8-bit levels (vectorized per type in `tile_decode`; `Q2_K`/`Q3_K`
//!    through `model_loader::quant::decode_row`) plus per-32 scale vectors
//!    and per-16 offsets, then reused by every activation row of a panel
//!    (at most [`panel_bytes`] of activations, 5/8 of L2), so large
//!    batches stay compute-bound.
//! 3. [`kernels`]: [`MR`] activation rows x [`NR`] weight rows per register
//!    block (AVX-512 VNNI `vpdpbusd` on zmm, AVX2 `vpmaddubsw` on 2 rows,
//!    or portable scalar, chosen once at run time), integer sums per
//!    16-half scaled and accumulated in f32, offsets folded in at the end;
//!    or, for whole groups of 16 (AVX-512 VNNI) or 8 (AVX2) activation
//!    rows, [`lanes`]: the rows across the vector lanes, the tile widened
//!    to i16, one multiply-add of pairs per lane and the scales applied
//!    once per 32-block for the whole group ([`lane_width`]).
//!
//! Threads: the output columns are split into stripes of whole `NR`
//! tiles, [`par::TASKS_PER_THREAD`] per thread of [`par`], claimed
//! dynamically (each writes only its own columns and decodes only its own
//! tiles; each reads the whole activation panel, which with 2 threads costs
//! less than splitting rows, where every thread would decode every tile).
//!
//! Invariants: `k` is a whole number of the type's blocks; the levels fed to
//! the unsigned kernels lie in 0..=63 (offset types) so `vpmaddubsw` never
//! saturates; `Q8_0`/`Q8_K` levels are stored +128 and the kernels take the
//! 128 back out in integer arithmetic (exact).
//!
//! Cost: O(m n k) integer multiply-adds; memory traffic one pass over the
//! quantized weights per product (plus the activations once per tile);
//! scratch O(NR k) per thread and O(m k) for the quantized activations;
//! tiles are decoded once per panel (one panel up to ~176 rows at k = 1536).

/// `$acc += $a . $b` in each i32 lane by one VNNI dot-product instruction
/// (`$insn`: `"vpdpwssd"`, `"{vex} vpdpwssd"`, `"{vex} vpdpbusd"`) on
/// `$reg` (`ymm_reg` or `zmm_reg`) registers, written as `asm!`: LLVM's
/// generic tuning rewrote most uses of the intrinsics into the two-
/// instruction forms (`vpmaddwd` + `vpaddd`: 472 of 544 in the AVX-512
/// lane kernel), which on Intel's server cores run at half the rate
/// (measured 2.9 G pairs/s against 5.8 G `vpdpwssd`/s with 12 or more
/// independent chains, one core); and a function using it needs no
/// `avxvnni` target feature, so one generic body serves both forms.
///
/// Expands to an `asm!`, used inside `unsafe`: sound where the CPU has the
/// instruction (it touches registers only).
#[cfg(target_arch = "x86_64")]
macro_rules! vnni_asm {
    ($insn:literal, $reg:ident, $acc:expr, $a:expr, $b:expr) => {
        std::arch::asm!(
            concat!($insn, " {acc}, {a}, {b}"),
            acc = inout($reg) $acc,
            a = in($reg) $a,
            b = in($reg) $b,
            options(pure, nomem, nostack, preserves_flags),
        )
    };
}

pub mod act;
pub mod gemv;
mod gemv_k;
pub mod kernels;
pub mod lanes;
pub mod tile;
mod tile_decode;
mod tile_wide;

#[cfg(test)]
mod tests;

use model_loader::{QuantTensor, QuantType};

use crate::model::linear::SendPtr;
use crate::model::par;
use act::ActRow;
pub use act::{ActPrecision, QuantizedActs};
pub use kernels::{Isa, MR};
use tile::Tile;

/// The little-endian `f16` at byte `i` of a block, as `f32` (exact).
fn f16_at(b: &[u8], i: usize) -> f32 {
    half::f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Weight rows decoded and multiplied together.
pub const NR: usize = 4;

/// Up to this many activation rows, the supported types multiply straight
/// on the file's blocks ([`gemv`]) instead of decoding tiles.
pub const GEMV_MAX_M: usize = 4;

/// Up to this many activation rows, where [`gemv::ManyRows`] has kernels
/// (AVX-512 VNNI; AVX2 up to 8 rows, K-quants 6), the rows share each weight block's
/// decode straight on the file's blocks (in chunks of up to 8, AVX2 6)
/// instead of decoding tiles; at 16 the lane kernel takes over (without
/// `--batch-invariant`).
pub const MANY_MAX_M: usize = 15;

/// Bytes of quantized activations one panel may hold: 5/8 of the core's
/// L2 (read once from sysfs; 512 KiB where unknown), leaving room for the
/// tile and the output. Measured single-threaded on Q4_K 1536 x 1536 with
/// a 1 MiB L2 (640 KiB panels): 256 rows (0.8 MiB) ran near the 128-row
/// speed, 1024 rows without panels at about half of it.
fn panel_bytes() -> usize {
    static BYTES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *BYTES.get_or_init(|| l2_bytes().unwrap_or(512 << 10) / 8 * 5)
}

/// The L2 size of CPU 0 (Linux sysfs, e.g. "512K"), if readable.
fn l2_bytes() -> Option<usize> {
    let dir = "/sys/devices/system/cpu/cpu0/cache/index2";
    if std::fs::read_to_string(format!("{dir}/level")).ok()?.trim() != "2" {
        return None;
    }
    let s = std::fs::read_to_string(format!("{dir}/size")).ok()?;
    let s = s.trim();
    let (num, mult) = match s.strip_suffix('K') {
        Some(n) => (n, 1 << 10),
        None => match s.strip_suffix('M') {
            Some(n) => (n, 1 << 20),
            None => (s, 1),
        },
    };
    let bytes = num.parse::<usize>().ok()? * mult;
    (bytes >= 64 << 10).then_some(bytes)
}

/// Activation rows per panel for `m` rows: panels of equal size (a
/// multiple of `align`) holding at most [`panel_bytes`] each, where one
/// block of `align` rows allows.
fn panel_rows(m: usize, k: usize, two_levels: bool, align: usize) -> usize {
    let per_row = k * if two_levels { 2 } else { 1 } + k / 8 + k / 4;
    let most = (panel_bytes() / per_row.max(1) / align).max(1) * align;
    let panels = m.div_ceil(most).max(1);
    m.div_ceil(panels).div_ceil(align) * align
}

/// Below this many multiply-adds a single thread is cheaper than a fork.
const PARALLEL_MIN_WORK: usize = 1 << 16;

/// A `[rows, cols]` weight matrix in a block-quantized type.
#[derive(Debug, Clone)]
pub struct QMatrix {
    pub ty: QuantType,
    pub rows: usize,
    pub cols: usize,
    /// `rows * row_bytes`, each row whole blocks.
    pub bytes: Vec<u8>,
}

impl QMatrix {
    /// From a loaded tensor (its constructor checked the byte count).
    pub fn from_tensor(t: QuantTensor) -> Self {
        Self {
            ty: t.ty,
            rows: t.rows(),
            cols: t.cols(),
            bytes: t.bytes,
        }
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.cols / self.ty.block_len() * self.ty.block_bytes()
    }

    /// Row `r` dequantized into `out` (`cols` values).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let rb = self.row_bytes();
        model_loader::quant::dequantize_row(self.ty, &self.bytes[r * rb..(r + 1) * rb], out);
    }

    /// The whole matrix in f32, row-major.
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        model_loader::quant::dequantize_row(self.ty, &self.bytes, &mut out);
        out
    }

    /// Stacks matrices of the same type and width (rows of `self` first).
    pub fn concat(parts: &[QMatrix]) -> Option<QMatrix> {
        let first = parts.first()?;
        if parts
            .iter()
            .any(|p| p.ty != first.ty || p.cols != first.cols)
        {
            return None;
        }
        Some(QMatrix {
            ty: first.ty,
            rows: parts.iter().map(|p| p.rows).sum(),
            cols: first.cols,
            bytes: parts.iter().flat_map(|p| p.bytes.iter().copied()).collect(),
        })
    }
}

/// The group width when products with `m` activation rows run the lane
/// kernel ([`lanes`]) on their whole groups of rows: 16 on AVX-512 VNNI,
/// 8 on AVX2, when `m` fills at least one group; `None` with `invariant`
/// (the lane kernel rounds differently from the direct and row-major
/// kernels, so with it a row's result would depend on whether it sits in
/// a whole group).
pub fn lane_width(isa: Isa, m: usize, invariant: bool) -> Option<usize> {
    lanes::width(isa).filter(|&w| m >= w && !invariant)
}

/// Quantizes `x[m, k]` for products under `isa`: [`QuantizedActs`], with
/// the lane layout where [`lane_width`] says.
pub fn quantize_acts(
    x: &[f32],
    m: usize,
    k: usize,
    p: ActPrecision,
    isa: Isa,
    invariant: bool,
) -> QuantizedActs {
    let a = QuantizedActs::quantize(x, m, k, p, isa == Isa::Avx512Vnni);
    match lane_width(isa, m, invariant) {
        Some(w) => a.with_lanes(w),
        None => a,
    }
}

/// `out[r * ldo + c] (+)= sum_i act[r, i] * w[c, i]` for `r < act.m`,
/// `c < w.rows`, using `isa`'s kernels (the lane layout is built here when
/// [`lane_width`] says and `act` lacks it; [`quantize_acts`] builds it once).
///
/// Panics if `act.k != w.cols`, `ldo < w.rows` or `out` is too short
/// (callers size them from the model's shapes).
pub fn matmul(
    act: &QuantizedActs,
    w: &QMatrix,
    out: &mut [f32],
    ldo: usize,
    accumulate: bool,
    isa: Isa,
) {
    matmul_with(act, w, out, ldo, accumulate, isa, false);
}

/// [`matmul`]; with `invariant`, every row's result is the same bits
/// whatever `act.m`: the tile kernels do the direct kernels' float
/// operations in the same order per row (integer sums are exact; the
/// offsets follow `tile::OffsetForm` instead of being folded into the
/// accumulators, [`tile::Tile::exact`]) and the lane kernel is not used
/// ([`lane_width`]). Without it only [`Isa::Scalar`] is invariant.
pub fn matmul_with(
    act: &QuantizedActs,
    w: &QMatrix,
    out: &mut [f32],
    ldo: usize,
    accumulate: bool,
    isa: Isa,
    invariant: bool,
) {
    let (m, n, k) = (act.m, w.rows, w.cols);
    assert!(act.k == k && ldo >= n, "matmul: shapes");
    if m == 0 || n == 0 {
        return;
    }
    assert!(out.len() >= (m - 1) * ldo + n, "matmul: output too short");
    let threads = par::threads();
    let stripes = if m * n * k < PARALLEL_MIN_WORK || threads == 1 {
        1
    } else {
        threads * par::TASKS_PER_THREAD
    };
    let per = n.div_ceil(stripes).div_ceil(NR) * NR;
    let dst = SendPtr(out.as_mut_ptr());
    // Several decode rows: each weight block decoded once for all of them.
    let many = (m > 1)
        .then(|| gemv::ManyRows::new(isa, w.ty, act))
        .flatten();
    // Up to GEMV_MAX_M rows: the one-row kernel, chosen once.
    let one_row = (many.is_none() && m <= GEMV_MAX_M)
        .then(|| gemv::RowKernel::new(isa, w.ty, !act.lo.is_empty()))
        .flatten();
    let direct = many.is_some() || one_row.is_some();
    let built;
    let lane_acts = match (
        &act.lanes,
        lane_width(isa, m, invariant).filter(|_| !direct),
    ) {
        (_, None) => None,
        (Some(l), Some(w)) if l.width == w => Some(l),
        (_, Some(w)) => {
            built = lanes::LaneActs::new(act, w);
            built.as_ref()
        }
    };
    // Rows the lane kernel takes (its last group may be padded); the rest
    // run the row-major kernel.
    let lane_rows = lane_acts.map_or(0, |l| l.m);
    let run = |c0: usize| {
        let c1 = (c0 + per).min(n);
        let put = |r: usize, j: usize, vals: &[f32]| {
            // SAFETY: r < m and j + vals.len() <= c1 <= n <= ldo (callers
            // pass at most c1 - j values), so the range r * ldo + j .. +
            // vals.len() ends at or below (m - 1) * ldo + n <= out.len()
            // (asserted above). Columns j..c1 belong to this stripe only,
            // and `out` is exclusively borrowed for the call.
            let o =
                unsafe { std::slice::from_raw_parts_mut(dst.get().add(r * ldo + j), vals.len()) };
            // A whole tile's NR values as one fixed-size move (a length
            // known only at run time became a `memmove` call per row and
            // tile: 5% of a K-quant prefill).
            let whole: Option<(&mut [f32; NR], &[f32; NR])> =
                (&mut *o).try_into().ok().zip(vals.try_into().ok());
            if accumulate {
                for (o, v) in o.iter_mut().zip(vals) {
                    *o += v;
                }
            } else if let Some((o, v)) = whole {
                *o = *v;
            } else {
                o.copy_from_slice(vals);
            }
        };
        if direct {
            let act_rows: [Option<ActRow<'_>>; GEMV_MAX_M] =
                std::array::from_fn(|r| (one_row.is_some() && r < m).then(|| act.row(r)));
            let mut j = c0;
            let mut res = [0f32; NR];
            let mut res_many = [[0f32; NR]; MANY_MAX_M];
            while j < c1 {
                let nr = NR.min(c1 - j);
                if let Some(many) = &many {
                    gemv::dot_rows_many(w, j, nr, many, &mut res_many);
                    for (r, vals) in res_many.iter().enumerate().take(m) {
                        put(r, j, &vals[..nr]);
                    }
                    j += nr;
                    continue;
                }
                if let Some(kernel) = &one_row {
                    for (r, row) in act_rows.iter().flatten().enumerate() {
                        kernel.dot(w, j, nr, row, &mut res);
                        put(r, j, &res[..nr]);
                    }
                }
                j += nr;
            }
            return;
        }
        // One tile of NR weight rows decoded at a time (L1), multiplied by
        // a panel of activation rows (whole lane groups first, then MR at a
        // time); the panel is sized to stay in L2 (long prompts: the tiles
        // are decoded once per panel).
        let mut tile = Tile::new(w.ty, k);
        tile.exact = invariant;
        tile.wide512 = isa == Isa::Avx512Vnni;
        let mut res = [[0f32; NR]; MR];
        let mut res_lanes = [[[0f32; NR]; lanes::MAX_LANES]; 2];
        let width = lane_acts.map_or(MR, |l| l.width);
        let align = if lane_rows > 0 { width } else { MR };
        let panel = panel_rows(m, k, !act.lo.is_empty(), align);
        for p0 in (0..m).step_by(panel) {
            let p1 = (p0 + panel).min(m);
            let lane_end = lane_rows.clamp(p0, p1);
            let mut j = c0;
            while j < c1 {
                let nr = NR.min(c1 - j);
                // Lane rows only: the lane kernel's form alone, in one
                // pass where the type has a wide decoder.
                if lane_end < p1 || !tile.decode_wide(w, j, nr) {
                    tile.decode(w, j, nr);
                    if lane_end > p0 {
                        tile.widen();
                    }
                }
                if let Some(la) = lane_acts.filter(|_| lane_end > p0) {
                    // Panels hold whole groups; the last group may be
                    // padded (its padding rows are not written).
                    let (g_end, mut g) = (lane_end.div_ceil(width), p0 / width);
                    while g < g_end {
                        let n = (g_end - g).min(res_lanes.len());
                        lanes::dot_groups(&tile, la, g, &mut res_lanes[..n]);
                        for (i, group) in res_lanes[..n].iter().enumerate() {
                            let r0 = (g + i) * width;
                            let real = width.min(m - r0);
                            for (l, vals) in group[..real].iter().enumerate() {
                                put(r0 + l, j, &vals[..nr]);
                            }
                        }
                        g += n;
                    }
                }
                for r0 in (lane_end..p1).step_by(MR) {
                    let mr = MR.min(p1 - r0);
                    kernels::dot_block(isa, &tile, act, r0, mr, &mut res);
                    for (r, vals) in res.iter().enumerate().take(mr) {
                        put(r0 + r, j, &vals[..nr]);
                    }
                }
                j += nr;
            }
        }
    };
    par::for_each(n.div_ceil(per), |s| run(s * per));
}
