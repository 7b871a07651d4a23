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
