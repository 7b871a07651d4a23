//! Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
//! 3", SC'11; the Random123 library's `philox4x32_10`): a counter-based
//! generator, so the random words of any draw are a pure function of where
//! they are used. The sampler on the CPU (`engine::sampler`) and the sampling
//! kernel ([`crate::sampling`]) both call [`token_uniform`], so on the same
//! logits they see the same numbers.
//!
//! Invariants: `philox4x32_10` reproduces Random123's known-answer vectors;
//! the uniform of token `i` in draw `step` of sequence `seq` under `seed` is
//! word `i % 4` of `philox(counter = [i / 4, step, seq, 0], key = seed)`;
//! integer arithmetic only (bit-identical on the host and on the device),
//! no allocation, `no_std`.
//!
//! Cost: 10 rounds of two 32x32->64 multiplies per 4 words.

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

#[inline(always)]
fn mulhilo(a: u32, b: u32) -> (u32, u32) {
    let p = u64::from(a) * u64::from(b);
    ((p >> 32) as u32, p as u32)
}

/// One Philox4x32 bijection with 10 rounds: `counter` encrypted under `key`.
#[inline(always)]
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let [mut c0, mut c1, mut c2, mut c3] = counter;
    let [mut k0, mut k1] = key;
    let mut round = 0;
    while round < 10 {
        if round > 0 {
            k0 = k0.wrapping_add(W0);
            k1 = k1.wrapping_add(W1);
        }
        let (hi0, lo0) = mulhilo(M0, c0);
        let (hi1, lo1) = mulhilo(M1, c2);
        (c0, c1, c2, c3) = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0);
        round += 1;
    }
    [c0, c1, c2, c3]
}

/// The 32 random bits of token `token` in draw `step` of sequence `seq`
/// under `seed` (see the module invariants).
#[inline(always)]
pub fn token_bits(seed: u64, seq: u32, step: u32, token: u32) -> u32 {
    let w = philox4x32_10(
        [token >> 2, step, seq, 0],
        [seed as u32, (seed >> 32) as u32],
    );
    w[(token & 3) as usize]
}

/// A uniform number strictly inside (0, 1) from 32 random bits: the top 23
/// bits plus one half, scaled by 2^-23 (exact in `f32`, so never 0 or 1).
#[inline(always)]
pub fn unit_open(bits: u32) -> f32 {
    ((bits >> 9) as f32 + 0.5) * (1.0 / 8_388_608.0)
}

/// [`unit_open`] of [`token_bits`].
#[inline(always)]
pub fn token_uniform(seed: u64, seq: u32, step: u32, token: u32) -> f32 {
    unit_open(token_bits(seed, seq, step, token))
}

#[cfg(all(test, not(target_arch = "nvptx64")))]
mod tests {
    use super::*;

    /// Random123's `kat_vectors` lines for `philox4x32 10`: counter, key, output.
    #[test]
    fn known_answers_of_random123() {
        let cases: [([u32; 4], [u32; 2], [u32; 4]); 3] = [
            (
                [0; 4],
                [0; 2],
                [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8],
            ),
            (
                [u32::MAX; 4],
                [u32::MAX; 2],
                [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd],
            ),
            (
                [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
                [0xa409_3822, 0x299f_31d0],
                [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1],
            ),
        ];
        for (c, k, want) in cases {
            assert_eq!(philox4x32_10(c, k), want, "counter {c:x?} key {k:x?}");
        }
    }

    #[test]
    fn uniforms_are_open_and_keyed_by_every_coordinate() {
        assert!(unit_open(0) > 0.0 && unit_open(u32::MAX) < 1.0);
        let base = token_bits(42, 1, 7, 5);
        assert_ne!(base, token_bits(43, 1, 7, 5));
        assert_ne!(base, token_bits(42 | (1 << 40), 1, 7, 5));
        assert_ne!(base, token_bits(42, 2, 7, 5));
        assert_ne!(base, token_bits(42, 1, 8, 5));
        assert_ne!(base, token_bits(42, 1, 7, 6));
        assert_ne!(base, token_bits(42, 1, 7, 9));
        // Mean of many uniforms near one half.
        let n = 40_000u32;
        let mean: f64 = (0..n)
            .map(|i| f64::from(token_uniform(9, 0, i / 100, i % 100)))
            .sum::<f64>()
            / f64::from(n);
        assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
    }
}
