//! Safetensors reading (memory-mapped; single `model.safetensors` or shards
//! listed by `model.safetensors.index.json`) and a minimal writer.
//!
//! File layout: u64 little-endian header length `n`, `n` bytes of JSON
//! (`name -> {dtype, shape, data_offsets: [begin, end]}`, plus an optional
//! `__metadata__`), then the data; offsets are relative to the data start.
//!
//! Invariants: a tensor's byte range is checked against the file and against
//! `shape x dtype size` before any read; only F32, F16 and BF16 convert to
//! f32 (others are refused by name). Locating and checking a tensor
//! ([`SafetensorsSet::tensor`]) is O(1) and touches none of its bytes;
//! converting it is O(elements) and touches only its own bytes.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use serde_json::Value;

use crate::error::{LoaderError, Result};
use crate::weights::Tensor;

/// One tensor's entry in a header.
#[derive(Debug, Clone)]
struct Entry {
    dtype: String,
    shape: Vec<usize>,
    /// Absolute byte range in the file.
    begin: usize,
    end: usize,
}

/// One memory-mapped safetensors file.
struct StFile {
    path: PathBuf,
    map: Mmap,
    entries: HashMap<String, Entry>,
}

fn st_err(path: &Path, message: impl Into<String>) -> LoaderError {
    LoaderError::Safetensors {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

impl StFile {
    fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| LoaderError::io(path, e))?;
        // SAFETY: read-only mapping of a model file that is not modified
        // while loaded; we never write through it.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| LoaderError::io(path, e))?;
        let entries = parse_header(path, &map)?;
        Ok(Self {
            path: path.to_path_buf(),
            map,
            entries,
        })
    }
}

fn parse_header(path: &Path, data: &[u8]) -> Result<HashMap<String, Entry>> {
    let truncated = |what: &str, offset: usize, needed: usize| LoaderError::Truncated {
        what: format!("{}: {what}", path.display()),
        offset: offset as u64,
        needed: needed as u64,
        len: data.len() as u64,
    };
    let len_bytes: [u8; 8] = data
        .get(..8)
        .and_then(|s| s.try_into().ok())
        .ok_or_else(|| truncated("header length", 0, 8))?;
    let n = u64::from_le_bytes(len_bytes);
    let header_end = usize::try_from(n)
        .ok()
        .and_then(|n| n.checked_add(8))
        .filter(|&e| e <= data.len())
        .ok_or_else(|| truncated("JSON header", 8, n as usize))?;
    let header: HashMap<String, Value> =
        serde_json::from_slice(&data[8..header_end]).map_err(|e| LoaderError::BadJson {
            path: path.to_path_buf(),
            source: e,
        })?;
    let mut entries = HashMap::new();
    for (name, v) in header {
        if name == "__metadata__" {
            continue;
        }
        let bad = |m: &str| st_err(path, format!("tensor {name}: {m}"));
        let dtype = v
            .get("dtype")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("no dtype"))?;
        let shape = v
            .get("shape")
            .and_then(Value::as_array)
            .and_then(|a| {
                a.iter()
                    .map(|d| d.as_u64().map(|d| d as usize))
                    .collect::<Option<Vec<_>>>()
            })
            .ok_or_else(|| bad("bad shape"))?;
        let offs = v
            .get("data_offsets")
            .and_then(Value::as_array)
            .and_then(|a| {
                a.iter()
                    .map(|d| d.as_u64().map(|d| d as usize))
                    .collect::<Option<Vec<_>>>()
            })
            .filter(|o| o.len() == 2 && o[0] <= o[1])
            .ok_or_else(|| bad("bad data_offsets"))?;
        let (begin, end) = match (
            header_end.checked_add(offs[0]),
            header_end.checked_add(offs[1]),
        ) {
            (Some(b), Some(e)) if e <= data.len() => (b, e),
            _ => {
                return Err(truncated(
                    &format!("tensor {name}"),
                    header_end.saturating_add(offs[0]),
                    offs[1] - offs[0],
                ))
            }
        };
        entries.insert(
            name,
            Entry {
                dtype: dtype.to_string(),
                shape,
                begin,
                end,
            },
        );
    }
    Ok(entries)
}

/// All safetensors files of a model directory.
pub struct SafetensorsSet {
    files: Vec<StFile>,
    /// Tensor name -> index in `files`.
    index: HashMap<String, usize>,
}

impl SafetensorsSet {
    /// Opens `dir/model.safetensors.index.json`'s shards, or
    /// `dir/model.safetensors`.
    pub fn open(dir: &Path) -> Result<Self> {
        let index_path = dir.join("model.safetensors.index.json");
        let names: Vec<String> = if index_path.is_file() {
            let v = crate::hf::read_json(&index_path)?;
            let map = v
                .get("weight_map")
                .and_then(Value::as_object)
                .ok_or_else(|| st_err(&index_path, "no weight_map"))?;
            let mut files: Vec<String> = map
                .values()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect();
            files.sort();
            files.dedup();
            files
        } else {
            vec!["model.safetensors".to_string()]
        };
        let mut files = Vec::with_capacity(names.len());
        let mut index = HashMap::new();
        for (i, name) in names.iter().enumerate() {
            if name.contains('/') || name.contains("..") {
                return Err(st_err(
                    &index_path,
                    format!("shard name {name:?} leaves the directory"),
                ));
            }
            let f = StFile::open(&dir.join(name))?;
            for t in f.entries.keys() {
                index.insert(t.clone(), i);
            }
            files.push(f);
        }
        Ok(Self { files, index })
    }

    /// Opens one safetensors file (a PEFT adapter's `adapter_model.safetensors`).
    pub fn open_file(path: &Path) -> Result<Self> {
        let f = StFile::open(path)?;
        let index = f.entries.keys().map(|t| (t.clone(), 0)).collect();
        Ok(Self {
            files: vec![f],
            index,
        })
    }

    /// Every tensor name, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.index.keys().map(String::as_str).collect();
        v.sort_unstable();
        v
    }

    /// The shape of tensor `name`, if present.
    pub fn shape(&self, name: &str) -> Option<&[usize]> {
        let f = &self.files[*self.index.get(name)?];
        f.entries.get(name).map(|e| e.shape.as_slice())
    }

    /// Whether a tensor is present.
    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// Locates tensor `name` and checks it without reading its data: present,
    /// of shape `expected`, of a dtype read here (F32, F16, BF16), and with
    /// exactly `shape x dtype size` bytes. O(1).
    pub fn tensor(&self, name: &str, expected: &[usize]) -> Result<StTensor<'_>> {
        let f = self
            .index
            .get(name)
            .map(|&i| &self.files[i])
            .ok_or_else(|| LoaderError::MissingTensor(name.to_string()))?;
        let e = f
            .entries
            .get(name)
            .ok_or_else(|| LoaderError::MissingTensor(name.to_string()))?;
        if e.shape != expected {
            return Err(LoaderError::ShapeMismatch {
                tensor: name.to_string(),
                expected: expected.to_vec(),
                found: e.shape.clone(),
            });
        }
        let dtype = match e.dtype.as_str() {
            "F32" => Dtype::F32,
            "F16" => Dtype::F16,
            "BF16" => Dtype::Bf16,
            other => {
                return Err(LoaderError::UnsupportedDtype {
                    dtype: other.to_string(),
                    tensor: name.to_string(),
                })
            }
        };
        let bytes = &f.map[e.begin..e.end];
        let n = e.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        let width = if dtype == Dtype::F32 { 4 } else { 2 };
        if n.and_then(|n| n.checked_mul(width)) != Some(bytes.len()) {
            return Err(st_err(
                &f.path,
                format!(
                    "tensor {name}: {} bytes for shape {:?} of {}",
                    bytes.len(),
                    e.shape,
                    e.dtype
                ),
            ));
        }
        Ok(StTensor {
            dtype,
            shape: &e.shape,
            bytes,
        })
    }

    /// Reads tensor `name` as f32, checking it as [`Self::tensor`] does.
    pub fn read_f32(&self, name: &str, expected: &[usize]) -> Result<Tensor> {
        Ok(self.tensor(name, expected)?.to_f32())
    }
}

/// The element types read from safetensors files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    F32,
    F16,
    Bf16,
}

/// A checked tensor of a [`SafetensorsSet`]: its bytes are a view of the
/// memory-mapped file, only touched when converted.
#[derive(Debug, Clone, Copy)]
pub struct StTensor<'a> {
    pub dtype: Dtype,
    pub shape: &'a [usize],
    /// `shape x dtype size` bytes (checked).
    pub bytes: &'a [u8],
}

impl StTensor<'_> {
    /// Converted to f32, O(elements).
    pub fn to_f32(&self) -> Tensor {
        let width = if self.dtype == Dtype::F32 { 4 } else { 2 };
        let mut data = vec![0f32; self.bytes.len() / width];
        match self.dtype {
            Dtype::F32 => crate::dequant::dequant_f32(self.bytes, &mut data),
            Dtype::F16 => crate::dequant::dequant_f16(self.bytes, &mut data),
            Dtype::Bf16 => crate::dequant::dequant_bf16(self.bytes, &mut data),
        }
        Tensor::new(self.shape.to_vec(), data)
    }
}

/// Writes f32 tensors to a safetensors file (names sorted, as HF does).
pub fn write_f32(path: &Path, tensors: &[(String, &Tensor)]) -> Result<()> {
    let mut sorted: Vec<&(String, &Tensor)> = tensors.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let mut header = serde_json::Map::new();
    let mut offset = 0usize;
    for (name, t) in &sorted {
        let size = t.data.len() * 4;
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": "F32", "shape": t.shape, "data_offsets": [offset, offset + size]}),
        );
        offset += size;
    }
    let mut json = serde_json::to_string(&header).map_err(|e| LoaderError::BadJson {
        path: path.to_path_buf(),
        source: e,
    })?;
    while (json.len() + 8) % 8 != 0 {
        json.push(' ');
    }
    let mut out = Vec::with_capacity(8 + json.len() + offset);
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(json.as_bytes());
    for (_, t) in &sorted {
        out.extend(t.data.iter().flat_map(|v| v.to_le_bytes()));
    }
    std::fs::write(path, out).map_err(|e| LoaderError::io(path, e))
}
