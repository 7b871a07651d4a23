//! Few-row products straight on the file's blocks (decode at small batch):
//! no tile is decoded, each weight block is read once from memory, its
//! nibbles or bytes expanded in registers and multiplied with the quantized
//! activations, the scales applied per block. This is llama.cpp's
//! `vec_dot_q4_1_q8_1` scheme, four weight rows at a time so the four
//! accumulation chains overlap and each activation block is loaded once.
//!
//! Types: `Q4_0`, `Q4_1`, `Q5_0`, `Q5_1`, `Q8_0` here (AVX2 below, and on
//! CPUs with AVX-512 F/BW/VNNI the 512-bit kernels of [`zmm`], two blocks
//! per vector with prefetching), `Q4_K`, `Q5_K` and `Q6_K` in [`ymm_k`]
//! and [`zmm_k`] (their arithmetic in [`super::gemv_k`]); every other type and the
//! scalar ISA go through the tile path ([`super::tile`]).
//!
//! Per 32-block `c` of a row with scale `dw` (and min `mw` for `Q4_1`):
//! `dw * dx[c] * sum(u * q) + off * (sums[2c] + sums[2c + 1])` where `u`
//! are the stored levels (0..=15 for the 4-bit types, 0..=31 with the
//! fifth bit from `qh`) and `off` is `mw` (`Q4_1`, `Q5_1`), `-8 dw`
//! (`Q4_0`), `-16 dw` (`Q5_0`) or 0 (`Q8_0`, signed levels).
//!
//! Invariants: `k` is a whole number of 32-blocks (the matrix's type
//! guarantees it); the activations have the same `k`.
//! Cost: one pass over the rows' bytes; O(k) work per row and activation
//! row, no allocation.

use model_loader::QuantType;

use super::act::{ActRow, QuantizedActs};
#[cfg(target_arch = "x86_64")]
mod packed;
#[cfg(target_arch = "x86_64")]
mod ymm_k;
#[cfg(target_arch = "x86_64")]
mod ymm_k_rows;
#[cfg(target_arch = "x86_64")]
mod ymm_rows;
#[cfg(target_arch = "x86_64")]
mod zmm;
#[cfg(target_arch = "x86_64")]
mod zmm_k;
#[cfg(target_arch = "x86_64")]
mod zmm_k_rows;
#[cfg(target_arch = "x86_64")]
mod zmm_rows;
use super::kernels::Isa;
use super::{QMatrix, MANY_MAX_M, NR};

/// True when [`dot_rows`] has a kernel for `ty` on `isa`.
pub fn supported(isa: Isa, ty: QuantType) -> bool {
    matches!(isa, Isa::Avx2 | Isa::Avx512Vnni)
        && matches!(Isa::best(), Isa::Avx2 | Isa::Avx512Vnni)
        && matches!(
            ty,
            QuantType::Q4_0
                | QuantType::Q4_1
                | QuantType::Q5_0
                | QuantType::Q5_1
                | QuantType::Q8_0
                | QuantType::Q4K
                | QuantType::Q5K
                | QuantType::Q6K
        )
}

/// `res[t] = dot(w row j + t, activation row r)` for `t < nr` (`nr <= NR`);
/// the other entries are unspecified. Returns false (and computes nothing)
/// when [`supported`] is false. (A product calls [`RowKernel::dot`] with a
/// kernel chosen once; this chooses it per call.)
pub fn dot_rows(
    isa: Isa,
    w: &QMatrix,
    j: usize,
    nr: usize,
    act: &QuantizedActs,
    r: usize,
    res: &mut [f32; NR],
) -> bool {
    assert!(r < act.m, "dot_rows: shapes");
    match RowKernel::new(isa, w.ty, !act.lo.is_empty()) {
        Some(kernel) => {
            kernel.dot(w, j, nr, &act.row(r), res);
            true
        }
        None => false,
    }
}

/// What every one-row kernel takes: `NR` weight rows (whole rows of the
/// type's blocks, in one allocation), one activation row's levels, its
/// residual levels (empty without), its block scales and 16-sums, and the
/// `NR` results.
#[cfg(target_arch = "x86_64")]
type RowFn = unsafe fn(&[&[u8]; NR], &[i8], &[i8], &[f32], &[f32], &mut [f32; NR]);

/// The one-row kernel for one product (weight type, ISA, what this CPU
/// has, activations with or without residual levels), chosen once rather
/// than per call of 4 weight rows (`perf`, SmolLM2 Q4_K_M batch 1 on
/// AVX-512: the per-call code outside the kernels 3.9% of the step
/// before, 2.3% after; in tok/s within noise).
///
/// Invariant: `f` runs only on a CPU with the features it was compiled
/// for (checked by [`RowKernel::new`]) and only on rows of `ty` with
/// activations that have residual levels exactly when `lo` ([`RowKernel::dot`]
/// asserts both).
#[derive(Clone, Copy)]
pub struct RowKernel {
    ty: QuantType,
    lo: bool,
    #[cfg(target_arch = "x86_64")]
    f: RowFn,
}

impl RowKernel {
    /// The kernel for `ty` on `isa` with activations that have residual
    /// levels when `lo`; `None` where [`supported`] is false.
    pub fn new(isa: Isa, ty: QuantType, lo: bool) -> Option<Self> {
        if !supported(isa, ty) {
            return None;
        }
        #[cfg(target_arch = "x86_64")]
        {
            let vnni = isa == Isa::Avx512Vnni && Isa::best() == Isa::Avx512Vnni;
            let zmm = vnni && zmm::available();
            // The 256-bit kernels run in their AVX-VNNI form where the CPU
            // has it (the same bits).
            let avx_vnni = !zmm && super::kernels::has_avx_vnni();
            // The 256-bit kernels take a leading `VNNI` const (`$v`: whether
            // to run their AVX-VNNI form).
            macro_rules! pick {
                ($a:ident::$q4:ident, $b:ident::$q8:ident, $c:ident::$q4k:ident, $d:ident::$q6k:ident $(; $v:literal)?) => {
                    match (ty, lo) {
                        (QuantType::Q4_0, false) => $a::$q4::<$($v,)? false, false, false> as RowFn,
                        (QuantType::Q4_0, true) => $a::$q4::<$($v,)? false, false, true>,
                        (QuantType::Q4_1, false) => $a::$q4::<$($v,)? true, false, false>,
                        (QuantType::Q4_1, true) => $a::$q4::<$($v,)? true, false, true>,
                        (QuantType::Q5_0, false) => $a::$q4::<$($v,)? false, true, false>,
                        (QuantType::Q5_0, true) => $a::$q4::<$($v,)? false, true, true>,
                        (QuantType::Q5_1, false) => $a::$q4::<$($v,)? true, true, false>,
                        (QuantType::Q5_1, true) => $a::$q4::<$($v,)? true, true, true>,
                        (QuantType::Q8_0, false) => $b::$q8::<$($v,)? false>,
                        (QuantType::Q8_0, true) => $b::$q8::<$($v,)? true>,
                        (QuantType::Q4K, false) => $c::$q4k::<$($v,)? false, false>,
                        (QuantType::Q4K, true) => $c::$q4k::<$($v,)? false, true>,
                        (QuantType::Q5K, false) => $c::$q4k::<$($v,)? true, false>,
                        (QuantType::Q5K, true) => $c::$q4k::<$($v,)? true, true>,
                        (QuantType::Q6K, false) => $d::$q6k::<$($v,)? false>,
                        (QuantType::Q6K, true) => $d::$q6k::<$($v,)? true>,
                        _ => return None,
                    }
                };
            }
            let f = if zmm {
                pick!(zmm::q4, zmm::q8, zmm_k::q4k, zmm_k::q6k)
            } else if avx_vnni {
                pick!(x86::q4, x86::q8, ymm_k::q4k, ymm_k::q6k; true)
            } else {
                pick!(x86::q4, x86::q8, ymm_k::q4k, ymm_k::q6k; false)
            };
            Some(Self { ty, lo, f })
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = lo;
            None
        }
    }

    /// `res[t] = dot(w row j + t, row)` for `t < nr` (`nr <= NR`); the
    /// other entries are unspecified.
    ///
    /// Panics unless `w` is of the kernel's type, `row` has residual
    /// levels exactly when the kernel takes them, and the shapes agree.
    pub fn dot(&self, w: &QMatrix, j: usize, nr: usize, row: &ActRow<'_>, res: &mut [f32; NR]) {
        assert!(
            w.ty == self.ty
                && row.lo.is_some() == self.lo
                && (1..=NR).contains(&nr)
                && j + nr <= w.rows
                && row.q.len() == w.cols,
            "dot_rows: shapes"
        );
        let rb = w.row_bytes();
        // Rows past `nr` repeat the last valid one (results discarded).
        let rows: [&[u8]; NR] = std::array::from_fn(|t| {
            let row = j + t.min(nr - 1);
            &w.bytes[row * rb..(row + 1) * rb]
        });
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `new` chose `f` for the CPU's features (`supported`:
        // AVX2 + FMA + F16C, which every AVX2 CPU has; VNNI only for
        // `Avx512Vnni` where `Isa::best` says so, AVX-VNNI only where
        // `has_avx_vnni` found it, the 512-bit kernels only where
        // `zmm::available` found AVX-512 F/BW/VL/VNNI) and for `w.ty`
        // and `lo` (asserted above). The row slices lie in `w.bytes` (one
        // allocation) and each holds `k / block_len` whole blocks of
        // `w.ty`; `row` holds `k = w.cols` levels (and residuals when
        // `lo`), `k / 32` scales and `k / 16` sums (`QuantizedActs::row`).
        unsafe {
            (self.f)(&rows, row.q, row.lo.unwrap_or(&[]), row.d, row.sums, res)
        };
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (rows, res);
    }
}

/// Activation rows prepared for [`dot_rows_many`]: packed once per product
/// where the ISA has kernels that decode each weight block once for several
/// activation rows (AVX-512 VNNI: [`zmm_rows`], [`zmm_k_rows`]; AVX2:
/// [`ymm_rows`], [`ymm_k_rows`]).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub struct ManyRows {
    /// The rows in chunks of at most the kernels' `MAX_ROWS`, as even as
    /// they come (9 rows on AVX-512: 5 and 4), each with its first row.
    #[cfg(target_arch = "x86_64")]
    chunks: Vec<(usize, Packed)>,
    lo: bool,
    /// The AVX2 kernels in their AVX-VNNI form (`kernels::has_avx_vnni`).
    #[cfg(target_arch = "x86_64")]
    avx_vnni: bool,
}

/// One chunk of rows packed for one kernel family.
#[cfg(target_arch = "x86_64")]
enum Packed {
    Zmm(zmm_rows::PackedActs),
    Ymm(ymm_rows::YmmActs),
}

#[cfg(target_arch = "x86_64")]
impl Packed {
    fn rows(&self) -> usize {
        match self {
            Self::Zmm(a) => a.rows(),
            Self::Ymm(a) => a.rows(),
        }
    }

    fn k(&self) -> usize {
        match self {
            Self::Zmm(a) => a.k(),
            Self::Ymm(a) => a.k(),
        }
    }
}

impl ManyRows {
    /// `Some` when `act`'s rows (2 to [`MANY_MAX_M`] on AVX-512 VNNI, to
    /// [`ymm_rows::most_rows`] on AVX2) can go through [`dot_rows_many`]
    /// for `ty` under `isa`.
    pub fn new(isa: Isa, ty: QuantType, act: &QuantizedActs) -> Option<Self> {
        #[cfg(target_arch = "x86_64")]
        {
            if !supported(isa, ty) || !(2..=MANY_MAX_M).contains(&act.m) {
                return None;
            }
            let zmm = isa == Isa::Avx512Vnni && Isa::best() == Isa::Avx512Vnni && zmm::available();
            if !zmm && act.m > ymm_rows::most_rows(ty) {
                return None;
            }
            let most = if zmm {
                zmm_rows::MAX_ROWS
            } else {
                ymm_rows::MAX_ROWS
            };
            let n = act.m.div_ceil(most);
            let chunks = (0..n)
                .map(|c| {
                    let (r0, r1) = (c * act.m / n, (c + 1) * act.m / n);
                    let packed = if zmm {
                        Packed::Zmm(zmm_rows::PackedActs::new(act, r0..r1, ty)?)
                    } else {
                        Packed::Ymm(ymm_rows::YmmActs::new(act, r0..r1, ty)?)
                    };
                    Some((r0, packed))
                })
                .collect::<Option<Vec<_>>>()?;
            Some(Self {
                chunks,
                lo: !act.lo.is_empty(),
                avx_vnni: !zmm && super::kernels::has_avx_vnni(),
            })
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (isa, ty, act);
            None
        }
    }
}

/// `res[r][t] = dot(w row j + t, activation row r)` for `t < nr` and every
/// activation row `r`: each weight block decoded once for all the rows,
/// each row's result the same bits as [`dot_rows`] gives it. `many` was
/// built for this product's activations and `w.ty`.
pub fn dot_rows_many(
    w: &QMatrix,
    j: usize,
    nr: usize,
    many: &ManyRows,
    res: &mut [[f32; NR]; MANY_MAX_M],
) {
    assert!(
        (1..=NR).contains(&nr) && j + nr <= w.rows,
        "dot_rows_many: shapes"
    );
    #[cfg(target_arch = "x86_64")]
    {
        let rb = w.row_bytes();
        let pf = zmm::PF_GROUPS * NR * rb;
        let rows: [&[u8]; NR] = std::array::from_fn(|t| {
            let row = j + t.min(nr - 1);
            &w.bytes[row * rb..(row + 1) * rb]
        });
        let rows = &rows[..nr];
        let mut out = [[0f32; zmm_rows::MAX_ROWS]; NR];
        for (r0, a) in &many.chunks {
            assert_eq!(a.k(), w.cols, "dot_rows_many: shapes");
            // SAFETY: `ManyRows::new` found the CPU features the kernels
            // need (AVX-512 VNNI for `Zmm`; `supported`'s AVX2, FMA, F16C
            // for `Ymm`, and AVX-VNNI where `avx_vnni`) and a supported
            // type; each of `rows` is one whole
            // row of `w.ty` blocks inside `w.bytes`; `a` packs `k = w.cols`
            // values of each of its activation rows for `w.ty` (with
            // residuals when `lo`). (Chunks hold 2 to `MAX_ROWS` rows:
            // `ManyRows::new` takes m >= 2 and splits evenly.)
            unsafe {
                match (a, a.rows()) {
                    (Packed::Zmm(a), 2) => zmm_many::<2>(w.ty, many.lo, rows, pf, a, &mut out),
                    (Packed::Zmm(a), 3) => zmm_many::<3>(w.ty, many.lo, rows, pf, a, &mut out),
                    (Packed::Zmm(a), 4) => zmm_many::<4>(w.ty, many.lo, rows, pf, a, &mut out),
                    (Packed::Zmm(a), 5) => zmm_many::<5>(w.ty, many.lo, rows, pf, a, &mut out),
                    (Packed::Zmm(a), 6) => zmm_many::<6>(w.ty, many.lo, rows, pf, a, &mut out),
                    (Packed::Zmm(a), 7) => zmm_many::<7>(w.ty, many.lo, rows, pf, a, &mut out),
                    (Packed::Zmm(a), _) => zmm_many::<8>(w.ty, many.lo, rows, pf, a, &mut out),
                    (Packed::Ymm(a), m) => {
                        // The AVX-VNNI form where `ManyRows::new` found it.
                        macro_rules! ymm {
                            ($m:literal) => {
                                if many.avx_vnni {
                                    ymm_many_vnni::<$m>(w.ty, many.lo, rows, pf, a, &mut out)
                                } else {
                                    ymm_many::<$m>(w.ty, many.lo, rows, pf, a, &mut out)
                                }
                            };
                        }
                        match m {
                            2 => ymm!(2),
                            3 => ymm!(3),
                            4 => ymm!(4),
                            5 => ymm!(5),
                            _ => ymm!(6),
                        }
                    }
                }
            }
            for (t, vals) in out.iter().enumerate().take(nr) {
                for (r, &v) in vals[..a.rows()].iter().enumerate() {
                    res[r0 + r][t] = v;
                }
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (w, many, res);
        unreachable!("ManyRows is built only on x86_64");
    }
}

/// `$f::<G.., LO, M> $args` with `LO` the run-time `$lo`.
#[cfg(target_arch = "x86_64")]
macro_rules! by_lo {
    ($lo:expr, $args:tt, $m:ident; $f:ident $(, $g:literal)*) => {
        if $lo {
            $f::<$($g,)* true, $m> $args
        } else {
            $f::<$($g,)* false, $m> $args
        }
    };
}

/// Generates `$name::<M>`: the weight rows `rows` against the `M`
/// activation rows packed in `a` (`out[t][r]`), through the kernels of the
/// modules `$rows` (32-block types) and `$k_rows` (K-quants).
#[cfg(target_arch = "x86_64")]
macro_rules! many_rows_fn {
    ($name:ident, $packed:ty, $rows:ident, $k_rows:ident, $features:literal $(; $pre:literal)?) => {
        /// The weight rows `rows` against the `M` activation rows of `a`:
        /// `out[t][r]`.
        ///
        /// # Safety
        /// As for the kernels called (the CPU has the enabled features;
        /// whole rows of `ty` blocks; `a` packed for `ty`); `a` packs
        /// exactly `M` rows.
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        unsafe fn $name<const M: usize>(
            ty: QuantType,
            lo: bool,
            rows: &[&[u8]],
            pf: usize,
            a: &$packed,
            out: &mut [[f32; zmm_rows::MAX_ROWS]; NR],
        ) {
            use $k_rows::{q4k_rows, q6k_rows};
            use $rows::{q4_rows, q8_rows};
            assert_eq!(a.rows(), M, "many-row kernels: packed rows");
            let mut res = [[0f32; M]; NR];
            let res = &mut res[..rows.len()];
            // SAFETY: the caller's contract is each kernel's.
            unsafe {
                match ty {
                    QuantType::Q4_0 => by_lo!(lo, (rows, pf, a, res), M; q4_rows $(, $pre)?, false, false),
                    QuantType::Q4_1 => by_lo!(lo, (rows, pf, a, res), M; q4_rows $(, $pre)?, true, false),
                    QuantType::Q5_0 => by_lo!(lo, (rows, pf, a, res), M; q4_rows $(, $pre)?, false, true),
                    QuantType::Q5_1 => by_lo!(lo, (rows, pf, a, res), M; q4_rows $(, $pre)?, true, true),
                    QuantType::Q8_0 => by_lo!(lo, (rows, pf, a, res), M; q8_rows $(, $pre)?),
                    QuantType::Q4K => by_lo!(lo, (rows, pf, a, res), M; q4k_rows $(, $pre)?, false),
                    QuantType::Q5K => by_lo!(lo, (rows, pf, a, res), M; q4k_rows $(, $pre)?, true),
                    QuantType::Q6K => by_lo!(lo, (rows, pf, a, res), M; q6k_rows $(, $pre)?),
                    other => unreachable!("no many-row kernel for {other:?}"),
                }
            }
            for (o, r) in out.iter_mut().zip(res.iter()) {
                o[..M].copy_from_slice(r);
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
many_rows_fn!(
    zmm_many,
    zmm_rows::PackedActs,
    zmm_rows,
    zmm_k_rows,
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"
);
#[cfg(target_arch = "x86_64")]
many_rows_fn!(
    ymm_many,
    ymm_rows::YmmActs,
    ymm_rows,
    ymm_k_rows,
    "avx2,fma,f16c"; false
);
#[cfg(target_arch = "x86_64")]
many_rows_fn!(
    ymm_many_vnni,
    ymm_rows::YmmActs,
    ymm_rows,
    ymm_k_rows,
    "avx2,fma,f16c"; true
);

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::kernels::x86::hsum;
    use super::zmm::PF_GROUPS;
    use super::NR;

    /// Bytes of a `Q4_0`, `Q4_1` (`MIN`), `Q5_0` (`FIVE`) or `Q5_1` block:
    /// d (f16), [m (f16)], [qh (u32)], qs[16].
    pub(super) const fn q4_block_bytes<const MIN: bool, const FIVE: bool>() -> usize {
        18 + if MIN { 2 } else { 0 } + if FIVE { 4 } else { 0 }
    }

    /// The 32 levels of the 4-bit (or, `FIVE`, 5-bit) block of `bs` bytes
    /// at `p`, one per byte in order: 0..=15, or 0..=31 with the fifth bit
    /// from `qh`.
    ///
    /// # Safety
    /// The CPU has AVX2; `p` holds `bs` readable bytes, the block's layout.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn q4_levels<const FIVE: bool>(p: *const u8, bs: usize) -> __m256i {
        // SAFETY: qs is the block's last 16 bytes, qh the 4 before (the
        // contract).
        unsafe {
            // qs in both halves (a load, no shuffle), the upper one shifted
            // to its high nibbles.
            let qs = _mm256_broadcastsi128_si256(_mm_loadu_si128(p.add(bs - 16).cast()));
            let w = _mm256_and_si256(
                _mm256_srlv_epi64(qs, _mm256_setr_epi64x(0, 0, 4, 4)),
                _mm256_set1_epi8(0x0f),
            );
            if !FIVE {
                return w;
            }
            // Byte i of the expanded qh: its bit i (llama.cpp's
            // bytes_from_bits_32).
            let shuf = _mm256_set_epi64x(
                0x0303030303030303,
                0x0202020202020202,
                0x0101010101010101,
                0,
            );
            // Byte i's bit, i mod 8.
            let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
            let qh = p.add(bs - 20).cast::<i32>().read_unaligned();
            let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(qh), shuf);
            let set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
            _mm256_or_si256(w, _mm256_and_si256(set, _mm256_set1_epi8(0x10)))
        }
    }

    /// The operands of the unsigned-by-signed byte products of levels `w`
    /// with activation levels `x` and residuals `xl`: as they are, or
    /// (`SIGNED` levels) `|w|` with `x` and `xl` given `w`'s signs (the
    /// sign trick: `vpmaddubsw` and `vpdpbusd` take an unsigned first
    /// operand).
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(super) fn byte_operands<const SIGNED: bool>(
        w: __m256i,
        x: __m256i,
        xl: __m256i,
    ) -> (__m256i, __m256i, __m256i) {
        if SIGNED {
            (
                _mm256_sign_epi8(w, w),
                _mm256_sign_epi8(x, w),
                _mm256_sign_epi8(xl, w),
            )
        } else {
            (w, x, xl)
        }
    }

    /// The integer product of 32 levels `w` with activation levels `x`
    /// in 8 i32 lanes, each a sum of 4 products; with `LO`, `256 dot(w, x)
    /// + dot(w, xl)` (the residual level's exact combination).
    ///
    /// The AVX2 form: `vpmaddubsw`, then `vpmaddwd` by 1 (or by 256, the
    /// shift); the i16 pair sums stay below 2 * 128 * 127 (unsigned levels
    /// <= 63, signed ones <= 128 by the sign trick), so nothing saturates.
    /// With `VNNI`, AVX-VNNI's `vpdpbusd` (`vnni_asm!`) per `vpmaddubsw` +
    /// `vpmaddwd`, the first product shifted by 8 bits as the second's
    /// accumulator: the same i32 lanes, so the same bits. Every AVX2
    /// integer kernel of this module takes its products from here.
    ///
    /// # Safety
    /// The CPU has AVX2 (and AVX-VNNI with `VNNI`).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot_levels<const SIGNED: bool, const LO: bool, const VNNI: bool>(
        w: __m256i,
        x: __m256i,
        xl: __m256i,
    ) -> __m256i {
        let (u, x, xl) = byte_operands::<SIGNED>(w, x, xl);
        if VNNI {
            let mut acc = _mm256_setzero_si256();
            // SAFETY: the CPU has AVX-VNNI (contract); registers only.
            unsafe { vnni_asm!("{{vex}} vpdpbusd", ymm_reg, acc, u, x) };
            if LO {
                acc = _mm256_slli_epi32::<8>(acc);
                // SAFETY: as above.
                unsafe { vnni_asm!("{{vex}} vpdpbusd", ymm_reg, acc, u, xl) };
            }
            acc
        } else if LO {
            _mm256_add_epi32(
                _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(256)),
                _mm256_madd_epi16(_mm256_maddubs_epi16(u, xl), _mm256_set1_epi16(1)),
            )
        } else {
            _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1))
        }
    }

    /// The 32 activation levels at `at` and, with `LO`, their residual
    /// levels (without `LO`, the levels again: [`dot_levels`] ignores them).
    ///
    /// # Safety
    /// The CPU has AVX2; `qx` (and with `LO` `lo`) hold 32 levels at `at`.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn act_levels<const LO: bool>(
        qx: &[i8],
        lo: &[i8],
        at: usize,
    ) -> (__m256i, __m256i) {
        // SAFETY: the contract.
        unsafe {
            let x = _mm256_loadu_si256(qx.as_ptr().add(at).cast());
            let xl = if LO {
                _mm256_loadu_si256(lo.as_ptr().add(at).cast())
            } else {
                x
            };
            (x, xl)
        }
    }

    /// `Q4_0`, `Q4_1` (`MIN`), `Q5_0` (`FIVE`) or `Q5_1` (both)
    /// rows.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C (and AVX-VNNI with `VNNI`); every
    /// row holds `k / 32` blocks (18, 20, 22 or 24 bytes), `qx` k levels,
    /// `dx` k / 32 scales, `sx` k / 16 sums, `k = qx.len()`; with `LO`,
    /// `lo` k levels.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn q4<const VNNI: bool, const MIN: bool, const FIVE: bool, const LO: bool>(
        rows: &[&[u8]; NR],
        qx: &[i8],
        lo: &[i8],
        dx: &[f32],
        sx: &[f32],
        res: &mut [f32; NR],
    ) {
        let bs = q4_block_bytes::<MIN, FIVE>();
        let nb = qx.len() / 32;
        debug_assert!(rows.iter().all(|r| r.len() >= nb * bs));
        debug_assert!(dx.len() >= nb && sx.len() >= 2 * nb);
        // Prefetch distance: PF_GROUPS groups of NR rows.
        let pf = PF_GROUPS * NR * nb * bs;
        let mut acc = [_mm256_setzero_ps(); NR];
        // Lanes 2t, 2t + 1: row t's sum of d * s and (MIN) m * s.
        let mut offv = _mm256_setzero_ps();
        // Row t's scale sits in lane 2t of the converted vector.
        let lane: [__m256i; NR] = std::array::from_fn(|t| _mm256_set1_epi32(2 * t as i32));
        let rp: [*const u8; NR] = std::array::from_fn(|t| rows[t].as_ptr());
        for c in 0..nb {
            // SAFETY: c < nb: the 32 levels at 32 c lie in `qx` (and
            // with LO in `lo`), dx[c], sx[2c], sx[2c + 1] in their
            // slices, and the block at c * bs (bs bytes) in every row
            // (contract).
            unsafe {
                let (x, xl) = act_levels::<LO>(qx, lo, c * 32);
                let d = *dx.get_unchecked(c);
                let s = *sx.get_unchecked(2 * c) + *sx.get_unchecked(2 * c + 1);
                // The NR rows' first 4 bytes (d, then m or level
                // bytes) as 8 halves -> [d0 m0 d1 m1 ...] in f32 (the
                // odd lanes are read only with MIN).
                let head = |t: usize| rp[t].add(c * bs).cast::<i32>().read_unaligned();
                let dm = _mm256_cvtph_ps(_mm_setr_epi32(head(0), head(1), head(2), head(3)));
                let scaled = _mm256_mul_ps(dm, _mm256_set1_ps(d));
                offv = _mm256_fmadd_ps(dm, _mm256_set1_ps(s), offv);
                for t in 0..NR {
                    let p = rp[t].add(c * bs);
                    // Every block (2-3 prefetches per line): one
                    // every other block had LLVM duplicate the
                    // loop body and keep two rows' sums on the
                    // stack (measured 5-6% slower from L2).
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(pf).cast());
                    let w = q4_levels::<FIVE>(p, bs);
                    let p = dot_levels::<false, LO, VNNI>(w, x, xl);
                    let prod = _mm256_cvtepi32_ps(p);
                    let sc = _mm256_permutevar8x32_ps(scaled, lane[t]);
                    acc[t] = _mm256_fmadd_ps(prod, sc, acc[t]);
                }
            }
        }
        let mut offs = [0f32; 8];
        // SAFETY: 8 f32 into an [f32; 8]; the CPU has AVX2 (contract).
        unsafe { _mm256_storeu_ps(offs.as_mut_ptr(), offv) };
        for t in 0..NR {
            // The offset of a level: m (MIN), else -16 d (Q5_0)
            // or -8 d (Q4_0).
            let off = if MIN {
                offs[2 * t + 1]
            } else if FIVE {
                -16.0 * offs[2 * t]
            } else {
                -8.0 * offs[2 * t]
            };
            // SAFETY: the CPU has AVX2 (contract).
            res[t] = unsafe { hsum(acc[t]) } + off;
        }
    }

    /// `Q8_0` rows (signed levels, no offset).
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C (and AVX-VNNI with `VNNI`); every
    /// row holds `k / 32` 34-byte blocks, `qx` (and with `LO` `lo`) k
    /// levels, `dx` k / 32 scales.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn q8<const VNNI: bool, const LO: bool>(
        rows: &[&[u8]; NR],
        qx: &[i8],
        lo: &[i8],
        dx: &[f32],
        _sx: &[f32],
        res: &mut [f32; NR],
    ) {
        let nb = qx.len() / 32;
        debug_assert!(rows.iter().all(|r| r.len() >= nb * 34) && dx.len() >= nb);
        let mut acc = [_mm256_setzero_ps(); NR];
        let rp: [*const u8; NR] = std::array::from_fn(|t| rows[t].as_ptr());
        let pf = PF_GROUPS * NR * nb * 34;
        for c in 0..nb {
            // SAFETY: as in the 4-bit kernel, with 34-byte blocks
            // (prefetches never fault).
            unsafe {
                let (x, xl) = act_levels::<LO>(qx, lo, c * 32);
                let d = *dx.get_unchecked(c);
                // The NR rows' scales converted together, times the
                // activations' (the same f32 product per row), each
                // row's then taken by a broadcast load (four f16
                // in one u64: NR is 4).
                const _: () = assert!(NR == 4);
                let head = |t: usize| u64::from(rp[t].add(c * 34).cast::<u16>().read_unaligned());
                let h = head(0) | head(1) << 16 | head(2) << 32 | head(3) << 48;
                let mut dw = [0f32; NR];
                _mm_storeu_ps(
                    dw.as_mut_ptr(),
                    _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi64_si128(h as i64)), _mm_set1_ps(d)),
                );
                for t in 0..NR {
                    let p = rp[t].add(c * 34);
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(pf).cast());
                    let w = _mm256_loadu_si256(p.add(2).cast());
                    let p = dot_levels::<true, LO, VNNI>(w, x, xl);
                    let prod = _mm256_cvtepi32_ps(p);
                    acc[t] = _mm256_fmadd_ps(prod, _mm256_broadcast_ss(&dw[t]), acc[t]);
                }
            }
        }
        for t in 0..NR {
            // SAFETY: the CPU has AVX2 (contract).
            res[t] = unsafe { hsum(acc[t]) };
        }
    }
}
