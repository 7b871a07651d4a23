//! The seam between a model definition and the executors.
//!
//! A model file (`arch/`) writes its layer graph once, over two traits an
//! executor implements:
//! - [`WeightSink`]: takes the model's tensors, as the model file names and
//!   fuses them, into the executor's own formats ([`Format`]: the CPU keeps
//!   quantized blocks or f32, the GPU uploads bf16/f16/f32 buffers);
//! - [`Backend`]: runs one step's operations on activation slots ([`Act`]):
//!   embedding, RMSNorm, linear layers, per-head q/k norms, attention (rotary,
//!   the paged cache write and paged attention, with a per-layer sliding
//!   window), gated activations, norm-and-add, and the LM head.
//!
//! Invariants: an operation reads and writes whole slots of the step's
//! `tokens` rows; a slot's width is fixed for the step by [`ActWidths`]; no
//! operation's output slot is one of its inputs unless the operation says it
//! works in place ([`Backend::head_norms`], [`Backend::add_rms_norm`], and
//! [`Backend::linear`] with `accumulate`). The backend owns the step's batch
//! and KV cache: a model file never sees token ids, block tables or pools.
//!
//! Cost: whatever the backend's kernels cost; the seam itself is one
//! dynamic-free call per operation (generic, monomorphised per backend).

use super::lora::LoraTarget;
use super::ops::RopeTables;
use model_loader::Weight;

/// The weight formats of one executor.
pub trait Format {
    /// A linear layer `[out, in]` with an optional bias `[out]`.
    type Matrix;
    /// A vector of weights (a norm's scale).
    type Vector;
    /// A rotary table as the backend applies it.
    type Rope;
}

/// Takes a model's tensors into a backend's formats. The model file has
/// checked every shape before the sink sees it.
pub trait WeightSink {
    type Format: Format;
    type Error;

    /// One linear layer: `parts` stacked along the output rows (q/k/v, or
    /// gate/up, fused), each `[rows_i, in_features]`, plus an optional bias
    /// over all output rows.
    fn matrix(
        &mut self,
        name: &str,
        parts: Vec<Weight>,
        in_features: usize,
        bias: Option<Vec<f32>>,
    ) -> Result<<Self::Format as Format>::Matrix, Self::Error>;

    /// A norm's weights.
    fn vector(
        &mut self,
        name: &str,
        values: Vec<f32>,
    ) -> Result<<Self::Format as Format>::Vector, Self::Error>;

    /// A rotary table (cosines and sines per position).
    fn rope(&mut self, table: RopeTables) -> Result<<Self::Format as Format>::Rope, Self::Error>;
}

/// An activation slot of one step: `[tokens, width]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    /// The residual stream, `hidden` wide.
    Residual,
    /// A normed copy of the residual stream, `hidden` wide.
    Normed,
    /// The fused q/k/v projection, `q + 2 kv` wide.
    Qkv,
    /// The attention output, `q` wide.
    Attn,
    /// The fused gate/up projection, `2 * intermediate` wide.
    GateUp,
    /// The gated activation, `intermediate` wide.
    Gated,
    /// A branch output before its norm and residual add (Gemma's post-norms),
    /// `hidden` wide.
    Branch,
}

impl Act {
    /// Every slot, in index order.
    pub const ALL: [Act; 7] = [
        Act::Residual,
        Act::Normed,
        Act::Qkv,
        Act::Attn,
        Act::GateUp,
        Act::Gated,
        Act::Branch,
    ];

    /// The slot's index in [`ActWidths`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// The width of each activation slot (0: the model does not use it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ActWidths(pub [usize; 7]);

impl ActWidths {
    /// The width of `slot`.
    pub fn of(&self, slot: Act) -> usize {
        self.0[slot.index()]
    }
}

/// The gate of a gated MLP: `out = f(gate) * up`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// `x / (1 + e^-x)` (Llama, Qwen2).
    Silu,
    /// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))` (Gemma).
    GeluTanh,
}

/// One layer's attention settings.
#[derive(Debug, Clone, Copy)]
pub struct LayerAttn<'r, R> {
    /// The layer's index (its KV cache).
    pub layer: usize,
    /// The rotary table of the layer (Gemma's local layers have their own).
    pub rope: &'r R,
    /// Multiplies `q . k`.
    pub scale: f32,
    /// Sliding window: a query at position `p` sees keys `p + 1 - w ..= p`;
    /// `None`: all of `0..=p`.
    pub window: Option<usize>,
}

/// The operations one step of a decoder runs, on the executor's device.
pub trait Backend {
    type Format: Format;
    type Error;

    /// Sizes the step's activation slots (`tokens` rows each).
    fn begin(&mut self, widths: &ActWidths) -> Result<(), Self::Error>;

    /// `out[t] = table[id_t] * scale` for the step's token ids.
    fn embed(
        &mut self,
        out: Act,
        table: &<Self::Format as Format>::Matrix,
        scale: Option<f32>,
    ) -> Result<(), Self::Error>;

    /// `out = rms_norm(x) * w`, row by row.
    fn rms_norm(
        &mut self,
        out: Act,
        x: Act,
        w: &<Self::Format as Format>::Vector,
        eps: f32,
    ) -> Result<(), Self::Error>;

    /// `out = x W^T + b`, or `out += x W^T` with `accumulate` (a layer with
    /// a bias is never accumulated).
    fn linear(
        &mut self,
        out: Act,
        x: Act,
        w: &<Self::Format as Format>::Matrix,
        accumulate: bool,
    ) -> Result<(), Self::Error>;

    /// A row-parallel layer (o_proj, down_proj) with its LoRA delta
    /// (`adapter`: the layer and the target it adapts): as [`Self::linear`]
    /// then [`Self::lora`]. Under tensor parallelism each rank holds a
    /// slice of `w`'s input features (and of its adapters' A), so the
    /// ranks' partial products, deltas included, are summed (an
    /// all-reduce; with `accumulate`, `out` is added once, not once per
    /// rank). The default, for a backend without tensor parallelism, is
    /// `linear` then `lora`.
    fn linear_row_parallel(
        &mut self,
        out: Act,
        x: Act,
        w: &<Self::Format as Format>::Matrix,
        accumulate: bool,
        adapter: (usize, LoraTarget),
    ) -> Result<(), Self::Error> {
        self.linear(out, x, w, accumulate)?;
        let (layer, target) = adapter;
        self.lora(
            out,
            x,
            layer,
            &[super::lora::LoraCols { target, offset: 0 }],
        )
    }

    /// LoRA: right after the linear layer of layer `layer` that wrote
    /// `out` from `x`, adds each row's adapter delta `scale (x A^T) B^T`
    /// into the columns `cols` name (fused layers: one entry per target).
    /// The default adds nothing: a backend that is never given adapters
    /// (the engine refuses adapter steps on such an executor).
    fn lora(
        &mut self,
        out: Act,
        x: Act,
        layer: usize,
        cols: &[super::lora::LoraCols],
    ) -> Result<(), Self::Error> {
        let _ = (out, x, layer, cols);
        Ok(())
    }

    /// In place on the q/k/v slot: each query head's and each key head's
    /// `head_dim` values RMS-normed with `q` and `k` (Gemma 3).
    fn head_norms(
        &mut self,
        qkv: Act,
        q: &<Self::Format as Format>::Vector,
        k: &<Self::Format as Format>::Vector,
        eps: f32,
    ) -> Result<(), Self::Error>;

    /// One layer's attention: rotary on q and k of the `qkv` slot, this
    /// step's K/V written into the layer's paged cache at the batch's slots,
    /// then causal attention through the block tables (windowed as `attn`
    /// says) into `out`.
    fn attention(
        &mut self,
        out: Act,
        qkv: Act,
        attn: &LayerAttn<'_, <Self::Format as Format>::Rope>,
    ) -> Result<(), Self::Error>;

    /// `out = gate(gate_up[.., :d]) * gate_up[.., d:]` with `d` the width of `out`.
    fn gated(&mut self, out: Act, gate_up: Act, gate: Gate) -> Result<(), Self::Error>;

    /// In place on `x`: `x += rms_norm(branch) * w`.
    fn add_rms_norm(
        &mut self,
        x: Act,
        branch: Act,
        w: &<Self::Format as Format>::Vector,
        eps: f32,
    ) -> Result<(), Self::Error>;

    /// The step's result: for the batch's logits rows, `rms_norm(x[row]) *
    /// final_norm` times the head `[vocab, hidden]`, as f32 logits the
    /// executor then reads, reduces or samples.
    fn logits(
        &mut self,
        x: Act,
        final_norm: &<Self::Format as Format>::Vector,
        head: &<Self::Format as Format>::Matrix,
        eps: f32,
    ) -> Result<(), Self::Error>;
}
