//! Model weights, laid out as Hugging Face does.
//!
//! The structs are generic over the type of the large matrices (the seven
//! projections of each layer, the embedding and the LM head): [`Tensor`]
//! (f32, the default, what [`crate::load_model`] returns) or [`Weight`] (f32
//! or kept in the file's block-quantized type, [`crate::load_model_with`]).
//! Norms and biases are always f32. A (possibly quantized) matrix converts
//! to f32 whole ([`Weight::into_f32`]) or a row range at a time into a
//! caller buffer ([`Weight::to_f32_rows`], bounded memory, same values).
//!
//! Linear weights are row-major `[out_features, in_features]` (so `y = x W^T`).
//! GGUF's Q/K row permutation has already been undone: the rows follow the
//! HF order, so the rotary embedding is the rotate-half form everywhere.

use std::ops::Range;

use crate::error::{LoaderError, Result};
use crate::quant::{self, QuantType};

/// `(rows, cols)` of a row-major shape: the last dimension is a row, the
/// others multiply (`None` on overflow).
fn rows_cols(shape: &[usize]) -> Option<(usize, usize)> {
    let (&cols, outer) = shape.split_last()?;
    let rows = outer.iter().try_fold(1usize, |a, &d| a.checked_mul(d))?;
    Some((rows, cols))
}

/// Checks a row range and its output buffer against a `[rows, cols]` matrix;
/// returns the element range of those rows.
fn check_rows(range: &Range<usize>, shape: &[usize], out_len: usize) -> Result<Range<usize>> {
    let (rows, cols) = rows_cols(shape).unwrap_or((0, 0));
    let err = || LoaderError::RowRange {
        start: range.start,
        end: range.end,
        rows,
        cols,
        out_len,
    };
    if range.start > range.end || range.end > rows {
        return Err(err());
    }
    let (start, end) = (range.start * cols, range.end * cols);
    if end - start != out_len {
        return Err(err());
    }
    Ok(start..end)
}

fn inconsistent(what: &str, shape: &[usize]) -> LoaderError {
    LoaderError::Malformed(format!("{what} of shape {shape:?} does not hold its rows"))
}

/// A dense, row-major f32 tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl Tensor {
    /// Builds a tensor; `data.len()` must equal the product of `shape`.
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Self {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        Self { shape, data }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// True when the tensor holds no element.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}

/// A matrix kept in its file's block-quantized type: row-major
/// `[rows, cols]` (`shape`, outermost first), each row `cols / block_len`
/// whole blocks.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantTensor {
    pub ty: QuantType,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

impl QuantTensor {
    /// Checks that `bytes` holds `shape` as whole-block rows of `ty`.
    pub fn new(ty: QuantType, shape: Vec<usize>, bytes: Vec<u8>, name: &str) -> Result<Self> {
        let cols = shape.last().copied().unwrap_or(0);
        let rows: usize = shape.iter().rev().skip(1).product();
        let row_bytes = ty
            .bytes_for(cols)
            .map_err(|e| LoaderError::Malformed(format!("tensor {name}: {e}")))?;
        if shape.len() != 2 || bytes.len() != rows * row_bytes {
            return Err(LoaderError::Malformed(format!(
                "tensor {name}: {} bytes of {} for shape {shape:?}",
                bytes.len(),
                ty.name()
            )));
        }
        Ok(Self { ty, shape, bytes })
    }

    /// Rows (output features).
    pub fn rows(&self) -> usize {
        self.shape[0]
    }

    /// Columns (input features).
    pub fn cols(&self) -> usize {
        self.shape[1]
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.cols() / self.ty.block_len() * self.ty.block_bytes()
    }

    /// Dequantizes rows `rows` (in HF order) into `out`, which must hold
    /// exactly `rows.len() * cols` values; anything else is a
    /// [`LoaderError::RowRange`]. O(rows.len() * cols), no allocation, and
    /// only those rows' bytes are read: a large matrix (an embedding) can be
    /// converted in bounded chunks instead of through a full f32 copy.
    /// Equal, row for row, to [`Self::to_f32`].
    pub fn to_f32_rows(&self, rows: Range<usize>, out: &mut [f32]) -> Result<()> {
        let elems = check_rows(&rows, &self.shape, out.len())?;
        let bl = self.ty.block_len();
        if !elems.start.is_multiple_of(bl) || !elems.end.is_multiple_of(bl) {
            return Err(inconsistent(self.ty.name(), &self.shape));
        }
        let bb = self.ty.block_bytes();
        let bytes = self
            .bytes
            .get(elems.start / bl * bb..elems.end / bl * bb)
            .ok_or_else(|| inconsistent(self.ty.name(), &self.shape))?;
        quant::dequantize_row(self.ty, bytes, out);
        Ok(())
    }

    /// Dequantized copy, O(elements).
    pub fn to_f32(&self) -> Tensor {
        let mut data = vec![0f32; self.rows() * self.cols()];
        quant::dequantize_row(self.ty, &self.bytes, &mut data);
        Tensor::new(self.shape.clone(), data)
    }
}

/// A large matrix as loaded: f32, or in the file's quantized type.
#[derive(Debug, Clone, PartialEq)]
pub enum Weight {
    F32(Tensor),
    Quantized(QuantTensor),
}

impl Weight {
    /// Shape, outermost first.
    pub fn shape(&self) -> &[usize] {
        match self {
            Self::F32(t) => &t.shape,
            Self::Quantized(q) => &q.shape,
        }
    }

    /// Rows: every dimension but the last (the output features of a matrix).
    pub fn rows(&self) -> usize {
        rows_cols(self.shape()).map_or(0, |(r, _)| r)
    }

    /// Columns: the last dimension (the input features of a matrix).
    pub fn cols(&self) -> usize {
        rows_cols(self.shape()).map_or(0, |(_, c)| c)
    }

    /// Converts rows `rows` to f32 into `out` (exactly `rows.len() * cols`
    /// values, else a [`LoaderError::RowRange`]): dequantized as
    /// [`QuantTensor::to_f32_rows`], or copied. Equal, row for row, to
    /// [`Self::into_f32`], in bounded memory.
    pub fn to_f32_rows(&self, rows: Range<usize>, out: &mut [f32]) -> Result<()> {
        match self {
            Self::F32(t) => {
                let elems = check_rows(&rows, &t.shape, out.len())?;
                let src = t
                    .data
                    .get(elems)
                    .ok_or_else(|| inconsistent("F32", &t.shape))?;
                out.copy_from_slice(src);
                Ok(())
            }
            Self::Quantized(q) => q.to_f32_rows(rows, out),
        }
    }

    /// The f32 tensor (dequantized when quantized), O(elements).
    pub fn into_f32(self) -> Tensor {
        match self {
            Self::F32(t) => t,
            Self::Quantized(q) => q.to_f32(),
        }
    }

    /// Bytes held in memory.
    pub fn nbytes(&self) -> usize {
        match self {
            Self::F32(t) => t.data.len() * 4,
            Self::Quantized(q) => q.bytes.len(),
        }
    }

    /// Rows `rows` of a matrix, in its own type (a tensor-parallel shard
    /// of a column-parallel layer, or a vocabulary range): quantized rows
    /// are whole runs of blocks, so any row range stays quantized. O(bytes
    /// of the range).
    pub fn slice_rows(&self, rows: Range<usize>) -> Result<Weight> {
        let (n, cols) = rows_cols(self.shape()).unwrap_or((0, 0));
        if self.shape().len() != 2 || rows.start > rows.end || rows.end > n {
            return Err(LoaderError::Malformed(format!(
                "rows {rows:?} of a matrix of shape {:?}",
                self.shape()
            )));
        }
        let shape = vec![rows.len(), cols];
        Ok(match self {
            Self::F32(t) => Self::F32(Tensor::new(
                shape,
                t.data[rows.start * cols..rows.end * cols].to_vec(),
            )),
            Self::Quantized(q) => {
                let rb = q.row_bytes();
                Self::Quantized(QuantTensor {
                    ty: q.ty,
                    shape,
                    bytes: q.bytes[rows.start * rb..rows.end * rb].to_vec(),
                })
            }
        })
    }

    /// Columns `cols` of every row (a shard of a row-parallel layer's input
    /// features). A quantized matrix is cut only on its blocks' boundaries
    /// (32 or 256 values), never through a block: a range that is not on
    /// them is an error, as is a range outside the matrix. O(bytes of the
    /// range).
    pub fn slice_cols(&self, cols: Range<usize>) -> Result<Weight> {
        let (n, width) = rows_cols(self.shape()).unwrap_or((0, 0));
        if self.shape().len() != 2 || cols.start > cols.end || cols.end > width {
            return Err(LoaderError::Malformed(format!(
                "columns {cols:?} of a matrix of shape {:?}",
                self.shape()
            )));
        }
        let shape = vec![n, cols.len()];
        Ok(match self {
            Self::F32(t) => Self::F32(Tensor::new(
                shape,
                t.data
                    .chunks_exact(width.max(1))
                    .flat_map(|row| &row[cols.clone()])
                    .copied()
                    .collect(),
            )),
            Self::Quantized(q) => {
                let (bl, bb) = (q.ty.block_len(), q.ty.block_bytes());
                if !cols.start.is_multiple_of(bl) || !cols.end.is_multiple_of(bl) {
                    return Err(LoaderError::Malformed(format!(
                        "columns {cols:?} cut through the {bl}-value blocks of {}",
                        q.ty.name()
                    )));
                }
                let (b0, b1) = (cols.start / bl * bb, cols.end / bl * bb);
                let bytes = q
                    .bytes
                    .chunks_exact(q.row_bytes().max(1))
                    .flat_map(|row| &row[b0..b1])
                    .copied()
                    .collect();
                Self::Quantized(QuantTensor {
                    ty: q.ty,
                    shape,
                    bytes,
                })
            }
        })
    }
}

impl From<Tensor> for Weight {
    fn from(t: Tensor) -> Self {
        Self::F32(t)
    }
}

/// Weights of one decoder layer.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerWeights<W = Tensor> {
    /// `[hidden]`, RMSNorm before attention.
    pub attn_norm: Tensor,
    /// `[num_heads * head_dim, hidden]`.
    pub wq: W,
    /// `[num_kv_heads * head_dim, hidden]`.
    pub wk: W,
    /// `[num_kv_heads * head_dim, hidden]`.
    pub wv: W,
    /// `[hidden, num_heads * head_dim]`.
    pub wo: W,
    /// Optional q/k/v biases (Qwen2).
    pub bq: Option<Tensor>,
    pub bk: Option<Tensor>,
    pub bv: Option<Tensor>,
    /// `[hidden]`, RMSNorm before the MLP.
    pub ffn_norm: Tensor,
    /// `[intermediate, hidden]`.
    pub w_gate: W,
    /// `[intermediate, hidden]`.
    pub w_up: W,
    /// `[hidden, intermediate]`.
    pub w_down: W,
    /// Gemma 3's extra norms; `None` for the Llama family.
    pub gemma: Option<GemmaNorms>,
}

/// Gemma 3's per-layer norms beyond the Llama layout. Their weights are used
/// as stored (`x * w`): llama.cpp's converter already folded Gemma's `1 + w`.
#[derive(Debug, Clone, PartialEq)]
pub struct GemmaNorms {
    /// `[head_dim]`, RMSNorm of each query head before rotary.
    pub q_norm: Tensor,
    /// `[head_dim]`, RMSNorm of each key head before rotary.
    pub k_norm: Tensor,
    /// `[hidden]`, RMSNorm of the attention output before the residual add.
    pub post_attn_norm: Tensor,
    /// `[hidden]`, RMSNorm of the MLP output before the residual add.
    pub post_ffn_norm: Tensor,
}

/// All weights of a Llama-family model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelWeights<W = Tensor> {
    /// `[vocab, hidden]`.
    pub token_embedding: W,
    pub layers: Vec<LayerWeights<W>>,
    /// `[hidden]`.
    pub final_norm: Tensor,
    /// `[vocab, hidden]`; `None` when tied to `token_embedding`.
    pub lm_head: Option<W>,
}

impl<W> ModelWeights<W> {
    /// The output projection, tied or not.
    pub fn output_weight(&self) -> &W {
        self.lm_head.as_ref().unwrap_or(&self.token_embedding)
    }

    /// Converts every large matrix with `f` (norms and biases unchanged).
    pub fn map<V>(self, mut f: impl FnMut(W) -> V) -> ModelWeights<V> {
        let layers = self
            .layers
            .into_iter()
            .map(|l| LayerWeights {
                attn_norm: l.attn_norm,
                wq: f(l.wq),
                wk: f(l.wk),
                wv: f(l.wv),
                wo: f(l.wo),
                bq: l.bq,
                bk: l.bk,
                bv: l.bv,
                ffn_norm: l.ffn_norm,
                w_gate: f(l.w_gate),
                w_up: f(l.w_up),
                w_down: f(l.w_down),
                gemma: l.gemma,
            })
            .collect();
        ModelWeights {
            token_embedding: f(self.token_embedding),
            layers,
            final_norm: self.final_norm,
            lm_head: self.lm_head.map(f),
        }
    }
}

impl ModelWeights<Weight> {
    /// Bytes held by the large matrices (what keeping file types saves).
    pub fn matrix_bytes(&self) -> usize {
        let mut n = self.token_embedding.nbytes() + self.lm_head.as_ref().map_or(0, Weight::nbytes);
        for l in &self.layers {
            n += [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down]
                .iter()
                .map(|w| w.nbytes())
                .sum::<usize>();
        }
        n
    }
}

#[cfg(test)]
mod slice_tests {
    use super::*;

    fn quantized(ty: QuantType, rows: usize, cols: usize) -> Weight {
        let values: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919) % 1000) as f32 / 250.0 - 2.0)
            .collect();
        let bytes = quant::quantize(ty, &values).expect("quantize");
        Weight::Quantized(QuantTensor::new(ty, vec![rows, cols], bytes, "w").expect("tensor"))
    }

    /// The dequantized slice equals the same sub-matrix of the dequantized
    /// whole: slicing moves blocks, never re-encodes them.
    fn check(w: &Weight, rows: Range<usize>, cols: Range<usize>) {
        let full = w.clone().into_f32();
        let width = w.cols();
        let want: Vec<f32> = rows
            .clone()
            .flat_map(|r| full.data[r * width + cols.start..r * width + cols.end].to_vec())
            .collect();
        let got = w
            .slice_rows(rows.clone())
            .and_then(|s| s.slice_cols(cols.clone()))
            .expect("slice")
            .into_f32();
        assert_eq!(got.shape, vec![rows.len(), cols.len()]);
        assert_eq!(got.data, want, "rows {rows:?} cols {cols:?}");
    }

    #[test]
    fn slices_keep_blocks_and_refuse_to_cut_through_one() {
        let k = quantized(QuantType::Q4K, 5, 512);
        check(&k, 1..4, 256..512);
        check(&k, 0..5, 0..256);
        let q8 = quantized(QuantType::Q8_0, 3, 96);
        check(&q8, 2..3, 32..96);
        let f = Weight::F32(Tensor::new(vec![2, 3], vec![1., 2., 3., 4., 5., 6.]));
        check(&f, 0..2, 1..3);
        // 128 is inside Q4_K's 256-value block.
        let e = k.slice_cols(0..128).expect_err("refused");
        assert!(e.to_string().contains("256-value blocks of Q4_K"), "{e}");
        assert!(k.slice_rows(4..6).is_err());
        assert!(q8.slice_cols(0..128).is_err());
    }
}
