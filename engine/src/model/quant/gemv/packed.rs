//! The buffer the many-row kernels read their activation rows from:
//! packed once per product, zeroed first (an absent block's bytes are
//! zero), its data starting at an `ALIGN`-byte boundary so the kernels'
//! loads are aligned. The layout inside is each kernel family's own
//! ([`super::zmm_rows::PackedActs`], [`super::ymm_rows::YmmActs`]).

/// `m` activation rows of `k` values, packed in units of `unit` bytes.
pub struct PackedRows<const ALIGN: usize> {
    m: usize,
    k: usize,
    unit: usize,
    buf: Vec<u8>,
    /// Where the aligned data starts in `buf`.
    start: usize,
    len: usize,
}

impl<const ALIGN: usize> PackedRows<ALIGN> {
    /// `bytes` zeroed bytes for `m` rows of `k` values in units of `unit`.
    pub(super) fn zeroed(m: usize, k: usize, unit: usize, bytes: usize) -> Self {
        let buf = vec![0u8; bytes + ALIGN - 1];
        let start = buf.as_ptr().align_offset(ALIGN).min(ALIGN - 1);
        Self {
            m,
            k,
            unit,
            buf,
            start,
            len: bytes,
        }
    }

    /// The aligned data, to fill.
    pub(super) fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.start..self.start + self.len]
    }

    /// The activation rows packed (the kernels' `M`).
    pub fn rows(&self) -> usize {
        self.m
    }

    /// The values per row.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Bytes per unit (the layout's repeating piece).
    pub(super) fn unit(&self) -> usize {
        self.unit
    }

    /// The first unit's first byte (`ALIGN`-byte aligned).
    pub(super) fn base(&self) -> *const u8 {
        self.buf[self.start..].as_ptr()
    }
}
