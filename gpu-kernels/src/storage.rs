//! Storage element types: values are stored as `f32`, `f16` or `bf16` and always
//! computed in `f32`. Conversions round to nearest even on both host and device.

use half::{bf16, f16};

/// A storage element type of the KV cache, activations and weights.
pub trait Storage: Copy + Send + Sync + 'static {
    /// Short name used in entry-point names (`f32`, `f16`, `bf16`).
    const NAME: &'static str;
    /// Widens to `f32` (exact).
    fn to_f32(self) -> f32;
    /// Narrows from `f32`, rounding to nearest even.
    fn from_f32(v: f32) -> Self;
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
}

impl Storage for f16 {
    const NAME: &'static str = "f16";
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
