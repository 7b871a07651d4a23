//! Entry-point signatures: what a host-side executor needs to launch a kernel by name,
//! and what the golden PTX test compares with the `.entry` directives of the PTX.

/// How a parameter is passed (its PTX `.param` type).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamKind {
    /// A device pointer (`.u64`).
    Ptr,
    /// A 32-bit unsigned integer (`.u32`).
    U32,
    /// A 32-bit float (`.f32`).
    F32,
}

impl ParamKind {
    /// The PTX `.param` type rustc emits for this kind.
    pub const fn ptx_type(self) -> &'static str {
        match self {
            ParamKind::Ptr => ".u64",
            ParamKind::U32 => ".u32",
            ParamKind::F32 => ".f32",
        }
    }
}

/// One kernel parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParamSig {
    /// Name in the Rust source.
    pub name: &'static str,
    /// How it is passed.
    pub kind: ParamKind,
}

/// One PTX entry point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelSig {
    /// The `.entry` symbol.
    pub name: &'static str,
    /// Parameters in order.
    pub params: &'static [ParamSig],
}

/// Maps a Rust parameter type to its [`ParamKind`].
pub trait KernelParam {
    /// The kind.
    const KIND: ParamKind;
}

impl<T> KernelParam for *const T {
    const KIND: ParamKind = ParamKind::Ptr;
}
impl<T> KernelParam for *mut T {
    const KIND: ParamKind = ParamKind::Ptr;
}
impl KernelParam for u32 {
    const KIND: ParamKind = ParamKind::U32;
}
impl KernelParam for f32 {
    const KIND: ParamKind = ParamKind::F32;
}

#[cfg(not(target_arch = "nvptx64"))]
pub use host::*;

/// Host-side launching helpers (never compiled for nvptx: they would pull
/// `memcmp` and formatting into the PTX).
#[cfg(not(target_arch = "nvptx64"))]
mod host {
    use super::{KernelSig, ParamKind};

    /// One kernel argument as a host passes it: a device address or a scalar.
    #[derive(Clone, Copy, Debug, PartialEq)]
    pub enum KernelArg {
        /// A device address (on the emulator: a host address).
        Ptr(u64),
        /// A `u32` scalar.
        U32(u32),
        /// An `f32` scalar.
        F32(f32),
    }

    impl KernelArg {
        /// How the argument is passed.
        pub const fn kind(&self) -> ParamKind {
            match self {
                KernelArg::Ptr(_) => ParamKind::Ptr,
                KernelArg::U32(_) => ParamKind::U32,
                KernelArg::F32(_) => ParamKind::F32,
            }
        }
    }

    /// The signature of entry point `name`, if there is one.
    pub fn find_kernel(name: &str) -> Option<KernelSig> {
        crate::KERNELS.iter().find(|k| k.name == name).copied()
    }

    /// Checks that `args` has the number and kinds of `sig`'s parameters; the message
    /// names the entry point and the first mismatch. O(parameters).
    pub fn check_args(sig: &KernelSig, args: &[KernelArg]) -> Result<(), ArgMismatch> {
        if sig.params.len() != args.len() {
            return Err(ArgMismatch {
                kernel: sig.name,
                index: args.len().min(sig.params.len()),
                detail: "wrong number of arguments",
            });
        }
        match sig
            .params
            .iter()
            .zip(args)
            .position(|(p, a)| p.kind != a.kind())
        {
            Some(index) => Err(ArgMismatch {
                kernel: sig.name,
                index,
                detail: "wrong argument kind",
            }),
            None => Ok(()),
        }
    }

    /// An argument list that does not fit an entry point.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct ArgMismatch {
        /// The entry point.
        pub kernel: &'static str,
        /// Index of the first argument that does not fit.
        pub index: usize,
        /// What is wrong.
        pub detail: &'static str,
    }

    impl core::fmt::Display for ArgMismatch {
        fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
            let p = crate::sig::find_kernel(self.kernel)
                .and_then(|s| s.params.get(self.index).copied())
                .map_or("(none)", |p| p.name);
            write!(
                f,
                "{}: {} at argument {} ({p})",
                self.kernel, self.detail, self.index
            )
        }
    }

    /// Decodes a [`KernelArg`] into a host entry point's parameter (emulator only).
    pub trait FromKernelArg: Sized {
        /// The parameter, or `None` when the argument's kind differs.
        fn from_arg(a: KernelArg) -> Option<Self>;
    }

    impl<T> FromKernelArg for *const T {
        fn from_arg(a: KernelArg) -> Option<Self> {
            match a {
                KernelArg::Ptr(p) => Some(p as usize as *const T),
                _ => None,
            }
        }
    }
    impl<T> FromKernelArg for *mut T {
        fn from_arg(a: KernelArg) -> Option<Self> {
            match a {
                KernelArg::Ptr(p) => Some(p as usize as *mut T),
                _ => None,
            }
        }
    }
    impl FromKernelArg for u32 {
        fn from_arg(a: KernelArg) -> Option<Self> {
            match a {
                KernelArg::U32(v) => Some(v),
                _ => None,
            }
        }
    }
    impl FromKernelArg for f32 {
        fn from_arg(a: KernelArg) -> Option<Self> {
            match a {
                KernelArg::F32(v) => Some(v),
                _ => None,
            }
        }
    }
}
