//! Integer dot products of a decoded weight [`Tile`] with up to [`MR`]
//! quantized activation rows (a register block of `MR x NR` results), per
//! instruction set.
//!
//! Every kernel computes, for each tile row `t` and activation row `r`,
//! `sum_c dx[r, c] * (a8[t, c] . i32(u[t, c] * q[r, c])) + bb[t] . sums[r]`,
//! where the i32 lanes hold sums of 4 adjacent byte products (4 lanes per
//! 16-half), so each lane takes its half's scale from `a8`. With a residual
//! level the lane holds `256 dot(u, q) + dot(u, lo)`, exact in i32.
//!
//! - AVX-512 (F, BW, VNNI; [`Isa::Avx512Vnni`] where the CPU has them):
//!   `vpdpbusd` on zmm, 64 levels (two blocks) per step, 4 x 4 zmm
//!   accumulators; per step and pair: 2 `vpdpbusd` + 1 shift (residual), 1
//!   convert, 1 multiply (weight x activation scale), 1 FMA. The signed
//!   types subtract `128 * sum(x)` per row and step (one more op per pair).
//!   A last half step (`k = 32 mod 64`) uses masked loads.
//! - [`Isa::Avx2`]: `vpmaddubsw` + `vpmaddwd`, 2 x 4 ymm accumulators (16
//!   registers); unsigned levels <= 63 never saturate the i16 pairs; signed
//!   levels flip back (`u ^ 0x80`) and use `vpsignb`.
//! - [`Isa::Scalar`]: portable i32 loops, the reference the others are
//!   tested against.
//! - [`Isa::Neon`] (aarch64): the portable arithmetic with the integer sums
//!   in NEON (`smull` + `sadalp`), the same bits as the portable kernel;
//!   `sdot` waits for a stable intrinsic, and there is no direct (few-row)
//!   or lane kernel on aarch64 yet: every product runs tiles.
//!
//! Invariants: `tile.k == act.k`; the tile's padding (`k..kp`) is zero.
//! Cost: O(MR NR k) per block; no allocation.

use super::act::QuantizedActs;
use super::tile::Tile;
use super::NR;

#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "x86_64")]
pub(super) mod x86;

/// The kernel family in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    Scalar,
    Avx2,
    Avx512Vnni,
    /// aarch64 NEON (every aarch64 CPU): the row-major block with the
    /// integer sums in NEON (`kernels::neon`), the portable float operations.
    Neon,
}

impl Isa {
    /// The best kernels this CPU runs (checked at run time).
    pub fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512vnni")
                && std::arch::is_x86_feature_detected!("avx512vl")
                && std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Isa::Avx512Vnni;
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Isa::Avx2;
            }
        }
        #[cfg(target_arch = "aarch64")]
        if std::arch::is_aarch64_feature_detected!("neon") {
            return Isa::Neon;
        }
        Isa::Scalar
    }

    /// The kernels in use: [`Isa::detect`], or a lesser family named by
    /// the environment variable [`ISA_ENV`] (`scalar`, `avx2`,
    /// `avx512vnni`), computed once per process. Naming a family the CPU
    /// lacks, or an unknown name, keeps the detected one (with a warning).
    pub fn best() -> Isa {
        static BEST: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| {
            let detected = Isa::detect();
            let Some(name) = std::env::var_os(ISA_ENV) else {
                return detected;
            };
            let name = name.to_string_lossy();
            match Isa::parse(&name) {
                Some(isa) if Isa::available().contains(&isa) => isa,
                _ => {
                    tracing::warn!(
                        "{ISA_ENV}={name} is not one of this CPU's kernel families {:?}; using {detected:?}",
                        Isa::available()
                    );
                    detected
                }
            }
        })
    }

    /// The family named `s` (`scalar`, `avx2`, `avx512vnni`; any case).
    pub fn parse(s: &str) -> Option<Isa> {
        match s.to_ascii_lowercase().as_str() {
            "scalar" => Some(Isa::Scalar),
            "avx2" => Some(Isa::Avx2),
            "avx512vnni" | "avx512" => Some(Isa::Avx512Vnni),
            "neon" => Some(Isa::Neon),
            _ => None,
        }
    }

    /// Every kernel family this CPU can run (for tests and benchmarks).
    pub fn available() -> Vec<Isa> {
        let mut v = vec![Isa::Scalar];
        match Isa::detect() {
            Isa::Avx512Vnni => v.extend([Isa::Avx2, Isa::Avx512Vnni]),
            Isa::Avx2 => v.push(Isa::Avx2),
            Isa::Neon => v.push(Isa::Neon),
            Isa::Scalar => {}
        }
        v
    }
}

/// Environment variable that forces a lesser kernel family than the CPU's
/// best ([`Isa::best`]): to measure the AVX2 path on an AVX-512 machine.
pub const ISA_ENV: &str = "PAGED_ENGINE_ISA";

/// Activation rows per register block.
pub const MR: usize = 4;

/// True when the CPU runs the 512-bit forms of the activations'
/// quantization and of the one-pass decode (AVX-512 F, BW and DQ, AVX2,
/// F16C), checked once per process; always false off x86-64.
pub fn has_avx512_bw() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *OK.get_or_init(|| {
            std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512dq")
                && std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("f16c")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// True when the CPU runs the 512-bit kernels: [`has_avx512_bw`]'s
/// features plus VNNI and FMA (std caches each feature test).
#[cfg(target_arch = "x86_64")]
pub(super) fn has_zmm() -> bool {
    has_avx512_bw()
        && std::arch::is_x86_feature_detected!("avx512vnni")
        && std::arch::is_x86_feature_detected!("fma")
}

/// Environment variable that, set to `0`, keeps the AVX2 lane kernel off
/// AVX-VNNI ([`has_avx_vnni`]): to measure the AVX2 path as a CPU without
/// it (Zen 3, Intel before Alder Lake) runs it. The results are the same
/// bits either way.
pub const AVX_VNNI_ENV: &str = "PAGED_ENGINE_AVX_VNNI";

/// True when the 256-bit lane kernel may use AVX-VNNI's VEX-encoded
/// `vpdpwssd` (the CPU has it and [`AVX_VNNI_ENV`] is not `0`); computed
/// once per process.
#[cfg(target_arch = "x86_64")]
pub(super) fn has_avx_vnni() -> bool {
    #[cfg(test)]
    if NO_AVX_VNNI.get() {
        return false;
    }
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(|| {
        std::arch::is_x86_feature_detected!("avxvnni")
            && std::env::var_os(AVX_VNNI_ENV).is_none_or(|v| v != "0")
    })
}

#[cfg(test)]
thread_local! {
    /// Set by [`without_avx_vnni`]: [`has_avx_vnni`] says false on this
    /// thread.
    static NO_AVX_VNNI: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with [`has_avx_vnni`] false on this thread (for the tests: the
/// AVX2 kernels' plain form on a CPU that has AVX-VNNI).
#[cfg(test)]
pub(super) fn without_avx_vnni<R>(f: impl FnOnce() -> R) -> R {
    NO_AVX_VNNI.set(true);
    let r = f();
    NO_AVX_VNNI.set(false);
    r
}

/// `res[r][t] = dot(tile row t, activation row r0 + r)` for `r < mr`,
/// `t < NR` (entries past `mr` are left as they were).
///
/// Panics if the tile and activations disagree on `k`, `mr` is not in
/// `1..=MR` or the rows run past `act.m`. An `isa` the CPU lacks falls back
/// to a kernel it has.
pub fn dot_block(
    isa: Isa,
    tile: &Tile,
    act: &QuantizedActs,
    r0: usize,
    mr: usize,
    res: &mut [[f32; NR]; MR],
) {
    assert!(
        tile.k == act.k && (1..=MR).contains(&mr) && r0 + mr <= act.m,
        "dot_block: shapes"
    );
    #[cfg(target_arch = "x86_64")]
    {
        let best = Isa::best();
        if isa == Isa::Avx512Vnni && best == Isa::Avx512Vnni && has_zmm() {
            // SAFETY: the CPU has AVX-512 F/BW/VNNI, AVX2 and FMA (checked
            // by `has_zmm`); the rows r0..r0 + mr exist (asserted) and the
            // tile's padded arrays match `k` (`Tile::new`).
            unsafe { x86::block_zmm_dispatch(tile, act, r0, mr, res) };
            return;
        }
        if isa != Isa::Scalar && best != Isa::Scalar {
            // SAFETY: the CPU has AVX2 and FMA (checked by `Isa::best`);
            // the rows exist (asserted above).
            unsafe { x86::block_avx2_dispatch(tile, act, r0, mr, res) };
            return;
        }
    }
    #[cfg(target_arch = "aarch64")]
    if isa == Isa::Neon && Isa::best() == Isa::Neon {
        for (r, out) in res.iter_mut().enumerate().take(mr) {
            // SAFETY: the CPU has NEON (`Isa::best`); the row exists
            // (asserted above) and its levels hold `k` values, as the
            // tile's rows (`tile.k == act.k`).
            unsafe { neon::dot_row(tile, act.row(r0 + r), out) };
        }
        return;
    }
    let _ = isa;
    for (r, out) in res.iter_mut().enumerate().take(mr) {
        dot_scalar(tile, act.row(r0 + r), out);
    }
}

/// `dot(u[16], lo or hi levels[16])` in i32, the signed types' 128 taken
/// out.
fn dot16(u: &[u8], x: &[i8], signed: bool) -> i32 {
    let off = if signed { 128 } else { 0 };
    u.iter()
        .zip(x)
        .map(|(&w, &x)| (i32::from(w) - off) * i32::from(x))
        .sum()
}

/// The portable kernel (one activation row).
fn dot_scalar(tile: &Tile, row: super::act::ActRow<'_>, res: &mut [f32; NR]) {
    for (t, out) in res.iter_mut().enumerate() {
        let (u, a8, bb) = tile.row(t);
        let mut acc = 0f32;
        for (c, (uc, &d)) in u.chunks_exact(32).zip(row.d).enumerate() {
            for h in 0..2 {
                let (w, at) = (&uc[h * 16..h * 16 + 16], c * 32 + h * 16);
                let mut s = dot16(w, &row.q[at..at + 16], tile.signed);
                if let Some(lo) = row.lo {
                    s = 256 * s + dot16(w, &lo[at..at + 16], tile.signed);
                }
                acc += s as f32 * (a8[c * 8 + h * 4] * d);
            }
        }
        if tile.has_offset {
            acc += bb.iter().zip(row.sums).map(|(b, s)| b * s).sum::<f32>();
        }
        *out = acc;
    }
}
