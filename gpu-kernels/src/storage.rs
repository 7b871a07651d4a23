//! Storage element types: values are stored as `f32`, `f16` or `bf16` and always
//! computed in `f32`. Conversions round to nearest even on both host and device.

use half::{bf16, f16};

/// A storage element type of the KV cache, activations and weights.
pub trait Storage: Copy + Send + Sync + 'static {
    /// Short name used in entry-point names (`f32`, `f16`, `bf16`).
    const NAME: &'static str;
    /// `bf16` (the tensor-core instructions name their input type).
    const BF16: bool = false;
    /// Widens to `f32` (exact).
    fn to_f32(self) -> f32;
    /// Narrows from `f32`, rounding to nearest even.
    fn from_f32(v: f32) -> Self;
    /// Elements in one 16-byte vector (`16 / size_of::<Self>()`: 4 or 8).
    const VEC: usize = 16 / core::mem::size_of::<Self>();
    /// Widens the [`Self::VEC`] elements of one 16-byte vector (as loaded by
    /// `ld.global.v4.u32`, element 0 in the low bits of word 0) into `out[..VEC]`.
    #[inline(always)]
    fn unpack(w: [u32; 4]) -> [f32; 8] {
        let mut out = [0.0f32; 8];
        let per_word = 4 / core::mem::size_of::<Self>();
        let bits = 32 / per_word;
        let mut i = 0;
        while i < Self::VEC {
            let word = w[i / per_word];
            let lo = (word >> ((i % per_word) * bits)) as u64;
            out[i] = Self::from_bits_lossless(lo);
            i += 1;
        }
        out
    }
    /// The element whose bit pattern is the low bits of `bits`, widened to `f32`.
    fn from_bits_lossless(bits: u64) -> f32;
    /// The bit pattern of the narrowed `v`, in the low bits.
    fn to_bits_u32(v: f32) -> u32;
    /// Narrows `v[..VEC]` into one 16-byte vector (inverse layout of [`Self::unpack`]).
    #[inline(always)]
    fn pack(v: [f32; 8]) -> [u32; 4] {
        let mut w = [0u32; 4];
        let per_word = 4 / core::mem::size_of::<Self>();
        let bits = 32 / per_word;
        let mut i = 0;
        while i < Self::VEC {
            w[i / per_word] |= Self::to_bits_u32(v[i]) << ((i % per_word) * bits);
            i += 1;
        }
        w
    }
}

impl Storage for f32 {
    const NAME: &'static str = "f32";
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
    #[inline(always)]
    fn from_bits_lossless(bits: u64) -> f32 {
        f32::from_bits(bits as u32)
    }
    #[inline(always)]
    fn to_bits_u32(v: f32) -> u32 {
        v.to_bits()
    }
}

impl Storage for f16 {
    const NAME: &'static str = "f16";
    #[inline(always)]
    fn from_bits_lossless(bits: u64) -> f32 {
        <f16 as Storage>::to_f32(f16::from_bits(bits as u16))
    }
    #[inline(always)]
    fn to_bits_u32(v: f32) -> u32 {
        Self::from_f32(v).to_bits() as u32
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        #[cfg(target_arch = "nvptx64")]
        {
            let r: f32;
            // SAFETY: a pure register conversion instruction.
            unsafe {
                core::arch::asm!("cvt.f32.f16 {r}, {h};", r = out(reg32) r, h = in(reg16) self.to_bits())
            };
            r
        }
        #[cfg(not(target_arch = "nvptx64"))]
        {
            f16::to_f32(self)
        }
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        #[cfg(target_arch = "nvptx64")]
        {
            let h: u16;
            // SAFETY: a pure register conversion instruction.
            unsafe {
                core::arch::asm!("cvt.rn.f16.f32 {h}, {v};", h = out(reg16) h, v = in(reg32) v)
            };
            f16::from_bits(h)
        }
        #[cfg(not(target_arch = "nvptx64"))]
        {
            f16::from_f32(v)
        }
    }
}

impl Storage for bf16 {
    const NAME: &'static str = "bf16";
    const BF16: bool = true;
    #[inline(always)]
    fn from_bits_lossless(bits: u64) -> f32 {
        f32::from_bits((bits as u32) << 16)
    }
    #[inline(always)]
    fn to_bits_u32(v: f32) -> u32 {
        Self::from_f32(v).to_bits() as u32
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from_bits((self.to_bits() as u32) << 16)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        #[cfg(target_arch = "nvptx64")]
        {
            let h: u16;
            // SAFETY: a pure register conversion instruction (sm_80+).
            unsafe {
                core::arch::asm!("cvt.rn.bf16.f32 {h}, {v};", h = out(reg16) h, v = in(reg32) v)
            };
            bf16::from_bits(h)
        }
        #[cfg(not(target_arch = "nvptx64"))]
        {
            bf16::from_f32(v)
        }
    }
}
