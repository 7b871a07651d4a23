//! GGUF v3 reader (memory-mapped) and a small writer for tests and the tiny
//! model.
//!
//! Layout: magic `GGUF`, version (u32, only 3), tensor count (u64), metadata
//! count (u64), the metadata key/value pairs, the tensor infos (name, dims
//! innermost-first, type, offset relative to the data section), padding to
//! `general.alignment` (default 32), then the tensor data.
//!
//! Invariants after [`GgufFile::open`]/[`GgufFile::parse`]: every tensor's
//! bytes lie inside the file, its type is known to have a block layout or is
//! reported as unsupported when read, and no length read from the file was
//! trusted before checking it against the bytes left (so a malformed count
//! cannot trigger a huge allocation). Parsing is O(header size); tensor data
//! is only touched when a tensor is read.

mod types;
pub mod writer;

pub use types::{value_type, GgmlType, MetaValue};

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;

use memmap2::Mmap;

use crate::error::{LoaderError, Result};

/// `GGUF` as a little-endian u32.
pub const GGUF_MAGIC: u32 = 0x4655_4747;
/// Alignment of the data section when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// Where one tensor lives and what it holds.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions innermost-first, as GGUF stores them (`dims[0]` = row length).
    pub dims: Vec<usize>,
    pub ty: GgmlType,
    /// Absolute byte offset in the file.
    pub offset: usize,
    /// Byte length (0 for unsupported types, which are refused when read).
    pub size: usize,
}

impl TensorInfo {
    /// Number of elements.
    pub fn n_elements(&self) -> usize {
        self.dims.iter().product()
    }

    /// Shape outermost-first (row-major, the HF convention).
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().copied().collect()
    }
}

/// The storage behind a parsed file.
enum Bytes {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Self::Mapped(m) => m,
            Self::Owned(v) => v,
        }
    }
}

/// A parsed GGUF file.
pub struct GgufFile {
    bytes: Bytes,
    pub version: u32,
    pub metadata: HashMap<String, MetaValue>,
    /// Tensors in file order.
    pub tensors: Vec<TensorInfo>,
    index: HashMap<String, usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Memory-maps and parses the file at `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| LoaderError::io(path, e))?;
        // SAFETY: the file is opened read-only and the mapping is never
        // written through; model files are not modified while being served
        // (a concurrent truncation by another process is outside our control,
        // as for every mmap-based loader).
        let map = unsafe { Mmap::map(&file) }.map_err(|e| LoaderError::io(path, e))?;
        Self::from_bytes(Bytes::Mapped(map))
    }

    /// Parses an in-memory file (used by tests).
    pub fn parse(bytes: Vec<u8>) -> Result<Self> {
        Self::from_bytes(Bytes::Owned(bytes))
    }

    fn from_bytes(bytes: Bytes) -> Result<Self> {
        let (version, metadata, tensors) = parse_header(bytes.as_slice())?;
        let index = tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect::<HashMap<_, _>>();
        if index.len() != tensors.len() {
            return Err(LoaderError::Malformed("duplicate tensor name".into()));
        }
        Ok(Self {
            bytes,
            version,
            metadata,
            tensors,
            index,
        })
    }

    /// The info of tensor `name`, if present.
    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    /// The raw bytes of a tensor (checked against the file at parse time).
    pub fn tensor_bytes(&self, info: &TensorInfo) -> Result<&[u8]> {
        if info.ty.block_layout().is_none() {
            return Err(info.ty.unsupported(&info.name));
        }
        let data = self.bytes.as_slice();
        data.get(info.offset..info.offset + info.size)
            .ok_or_else(|| truncated(&info.name, info.offset, info.size, data.len()))
    }

    /// Reads a tensor and dequantizes it to f32 (row-major, GGUF row order).
    pub fn read_f32(&self, info: &TensorInfo) -> Result<Vec<f32>> {
        let bytes = self.tensor_bytes(info)?;
        crate::dequant::dequantize(info.ty, bytes, info.n_elements(), &info.name)
    }

    /// A metadata value by key.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    /// A required unsigned integer.
    pub fn get_usize(&self, key: &str) -> Result<usize> {
        let v = self
            .get(key)
            .ok_or_else(|| LoaderError::MissingMetadata(key.into()))?;
        v.as_u64()
            .and_then(|v| usize::try_from(v).ok())
            .ok_or_else(|| type_err(key, "unsigned integer"))
    }

    /// A required float.
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        let v = self
            .get(key)
            .ok_or_else(|| LoaderError::MissingMetadata(key.into()))?;
        v.as_f64()
            .map(|v| v as f32)
            .ok_or_else(|| type_err(key, "number"))
    }

    /// A required string.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        let v = self
            .get(key)
            .ok_or_else(|| LoaderError::MissingMetadata(key.into()))?;
        v.as_str().ok_or_else(|| type_err(key, "string"))
    }

    /// An optional value of a given kind: missing is `Ok(None)`, wrong type is an error.
    pub fn get_opt<T>(
        &self,
        key: &str,
        expected: &'static str,
        f: impl FnOnce(&MetaValue) -> Option<T>,
    ) -> Result<Option<T>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => f(v).map(Some).ok_or_else(|| type_err(key, expected)),
        }
    }

    /// A required array of strings.
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>> {
        let arr = self
            .get(key)
            .ok_or_else(|| LoaderError::MissingMetadata(key.into()))?
            .as_array()
            .ok_or_else(|| type_err(key, "array of strings"))?;
        arr.iter()
            .map(|v| v.as_str().ok_or_else(|| type_err(key, "array of strings")))
            .collect()
    }
}

fn type_err(key: &str, expected: &'static str) -> LoaderError {
    LoaderError::MetadataType {
        key: key.into(),
        expected,
    }
}

fn truncated(what: &str, offset: usize, needed: usize, len: usize) -> LoaderError {
    LoaderError::Truncated {
        what: what.to_string(),
        offset: offset as u64,
        needed: needed as u64,
        len: len as u64,
    }
}

/// A bounds-checked little-endian cursor.
struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.data.len())
            .ok_or_else(|| truncated(what, self.pos, n, self.data.len()))?;
        let s = &self.data[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let s = self.take(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(s);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A count that must be coverable by the bytes left at `min_size` each.
    fn count(&mut self, what: &str, min_size: usize) -> Result<usize> {
        let n = self.u64(what)?;
        let left = (self.data.len() - self.pos) as u64;
        if n.saturating_mul(min_size as u64) > left {
            return Err(LoaderError::Truncated {
                what: format!("{what} ({n} entries)"),
                offset: self.pos as u64,
                needed: n.saturating_mul(min_size as u64),
                len: self.data.len() as u64,
            });
        }
        usize::try_from(n).map_err(|_| LoaderError::Malformed(format!("{what} too large")))
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.count(what, 1)?;
        let bytes = self.take(n, what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| LoaderError::Malformed(format!("{what} is not valid UTF-8")))
    }

    fn value(&mut self, ty: u32, key: &str, depth: u32) -> Result<MetaValue> {
        use value_type as t;
        Ok(match ty {
            t::U8 => MetaValue::U8(self.array::<1>(key)?[0]),
            t::I8 => MetaValue::I8(i8::from_le_bytes(self.array(key)?)),
            t::U16 => MetaValue::U16(u16::from_le_bytes(self.array(key)?)),
            t::I16 => MetaValue::I16(i16::from_le_bytes(self.array(key)?)),
            t::U32 => MetaValue::U32(self.u32(key)?),
            t::I32 => MetaValue::I32(i32::from_le_bytes(self.array(key)?)),
            t::F32 => MetaValue::F32(f32::from_le_bytes(self.array(key)?)),
            t::BOOL => match self.array::<1>(key)?[0] {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                b => return Err(LoaderError::Malformed(format!("{key}: bool byte {b}"))),
            },
            t::STRING => MetaValue::String(self.string(key)?),
            t::ARRAY => {
                if depth > 4 {
                    return Err(LoaderError::Malformed(format!(
                        "{key}: arrays nested too deep"
                    )));
                }
                let elem = self.u32(key)?;
                let min = match elem {
                    t::U8 | t::I8 | t::BOOL => 1,
                    t::U16 | t::I16 => 2,
                    t::U32 | t::I32 | t::F32 => 4,
                    _ => 8,
                };
                let n = self.count(key, min)?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.value(elem, key, depth + 1)?);
                }
                MetaValue::Array(items)
            }
            t::U64 => MetaValue::U64(self.u64(key)?),
            t::I64 => MetaValue::I64(i64::from_le_bytes(self.array(key)?)),
            t::F64 => MetaValue::F64(f64::from_le_bytes(self.array(key)?)),
            other => return Err(LoaderError::UnsupportedValueType(other)),
        })
    }
}

type Header = (u32, HashMap<String, MetaValue>, Vec<TensorInfo>);

fn parse_header(data: &[u8]) -> Result<Header> {
    let mut c = Cursor { data, pos: 0 };
    let magic = c.u32("magic")?;
    if magic != GGUF_MAGIC {
        return Err(LoaderError::BadMagic { found: magic });
    }
    let version = c.u32("version")?;
    if version != 3 {
        return Err(LoaderError::UnsupportedVersion(version));
    }
    let n_tensors = c.count("tensor count", 24)?;
    let n_kv = c.count("metadata count", 12)?;
    let mut metadata = HashMap::with_capacity(n_kv);
    for _ in 0..n_kv {
        let key = c.string("metadata key")?;
        let ty = c.u32(&key)?;
        let value = c.value(ty, &key, 0)?;
        metadata.insert(key, value);
    }
    let mut raw = Vec::with_capacity(n_tensors);
    for _ in 0..n_tensors {
        let name = c.string("tensor name")?;
        let n_dims = c.u32(&name)? as usize;
        if n_dims == 0 || n_dims > 4 {
            return Err(LoaderError::Malformed(format!(
                "tensor {name}: {n_dims} dimensions"
            )));
        }
        let mut dims = Vec::with_capacity(n_dims);
        for _ in 0..n_dims {
            let d = c.u64(&name)?;
            dims.push(usize::try_from(d).map_err(|_| {
                LoaderError::Malformed(format!("tensor {name}: dimension {d} too large"))
            })?);
        }
        let ty = GgmlType::from_id(c.u32(&name)?);
        let offset = c.u64(&name)?;
        raw.push((name, dims, ty, offset));
    }
    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => v
            .as_u64()
            .filter(|a| *a > 0 && a.is_power_of_two())
            .ok_or_else(|| {
                LoaderError::Malformed("general.alignment is not a power of two".into())
            })?,
    };
    let data_start = (c.pos as u64).div_ceil(alignment) * alignment;
    let tensors = raw
        .into_iter()
        .map(|(name, dims, ty, offset)| locate(name, dims, ty, offset, data_start, alignment, data))
        .collect::<Result<Vec<_>>>()?;
    Ok((version, metadata, tensors))
}

fn locate(
    name: String,
    dims: Vec<usize>,
    ty: GgmlType,
    offset: u64,
    data_start: u64,
    alignment: u64,
    data: &[u8],
) -> Result<TensorInfo> {
    if !offset.is_multiple_of(alignment) {
        return Err(LoaderError::Malformed(format!(
            "tensor {name}: offset {offset} not aligned to {alignment}"
        )));
    }
    let n = dims
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| LoaderError::Malformed(format!("tensor {name}: element count overflows")))?;
    let size = match ty.block_layout() {
        Some(_) => ty.byte_size(n, dims[0], &name)?,
        None => 0,
    };
    let abs = data_start
        .checked_add(offset)
        .and_then(|a| usize::try_from(a).ok())
        .ok_or_else(|| LoaderError::Malformed(format!("tensor {name}: offset overflows")))?;
    if abs.checked_add(size).is_none_or(|end| end > data.len()) {
        return Err(truncated(&format!("tensor {name}"), abs, size, data.len()));
    }
    Ok(TensorInfo {
        name,
        dims,
        ty,
        offset: abs,
        size,
    })
}
