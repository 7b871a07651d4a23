//! Model weights on the device: converted once from a [`HostModel`]'s f32
//! matrices to the executor's [`DType`] and uploaded, one allocation per
//! tensor. Layouts are unchanged (`[out, in]` row-major; q/k/v and gate/up
//! fused), so the fused q/k/v projection is one GEMM.

use super::device::{DType, DevBuf, DevPtr, Device};
use super::GpuError;
use crate::executor::HostWeights;

/// One decoder layer on the device.
pub struct LayerWeights {
    pub attn_norm: DevBuf,
    /// `[q + 2 kv, hidden]`.
    pub qkv: DevBuf,
    /// Qwen2's q/k/v biases, `[q + 2 kv]`, broadcast into the projection's
    /// output before the GEMM accumulates onto it.
    pub qkv_bias: Option<DevBuf>,
    pub o: DevBuf,
    pub ffn_norm: DevBuf,
    /// `[2 * intermediate, hidden]`, gate rows then up rows.
    pub gate_up: DevBuf,
    pub down: DevBuf,
}

/// Every weight of the model on the device, plus the rotary table.
pub struct DeviceWeights {
    pub embedding: DevBuf,
    /// `None` when tied to the embedding.
    pub lm_head: Option<DevBuf>,
    pub final_norm: DevBuf,
    pub layers: Vec<LayerWeights>,
    /// `f32[max_positions, head_dim]`: cosines then sines per position.
    pub cos_sin: DevBuf,
    /// Bytes uploaded.
    pub bytes: usize,
}

impl DeviceWeights {
    /// The LM head's address (the embedding when tied).
    pub fn lm_head_ptr(&self) -> DevPtr {
        self.lm_head.as_ref().unwrap_or(&self.embedding).ptr
    }

    /// Converts and uploads the weights. Refuses matrices of the wrong size
    /// (a quantized model must go through `LlamaModel::to_f32` first) with
    /// [`GpuError::Unsupported`]. O(parameters).
    pub fn upload(dev: &mut dyn Device, w: &HostWeights<'_>, t: DType) -> Result<Self, GpuError> {
        check_sizes(w)?;
        let mut bytes = 0;
        let mut put = |dev: &mut dyn Device, v: &[f32], t: DType| -> Result<DevBuf, GpuError> {
            let data = t.encode(v);
            let buf = dev.alloc(data.len())?;
            dev.upload(buf.ptr, &data)?;
            bytes += data.len();
            Ok(buf)
        };
        let mut layers = Vec::with_capacity(w.layers.len());
        for l in &w.layers {
            layers.push(LayerWeights {
                attn_norm: put(dev, l.attn_norm, t)?,
                qkv: put(dev, l.qkv, t)?,
                qkv_bias: l.qkv_bias.map(|b| put(dev, b, t)).transpose()?,
                o: put(dev, l.o, t)?,
                ffn_norm: put(dev, l.ffn_norm, t)?,
                gate_up: put(dev, l.gate_up, t)?,
                down: put(dev, l.down, t)?,
            });
        }
        let embedding = put(dev, w.embedding, t)?;
        let tied = std::ptr::eq(w.lm_head.as_ptr(), w.embedding.as_ptr());
        let lm_head = if tied {
            None
        } else {
            Some(put(dev, w.lm_head, t)?)
        };
        let final_norm = put(dev, w.final_norm, t)?;
        let cos_sin = put(dev, &w.cos_sin, DType::F32)?;
        Ok(Self {
            embedding,
            lm_head,
            final_norm,
            layers,
            cos_sin,
            bytes,
        })
    }
}

/// Every matrix of `w` holds the f32 count its shape needs.
fn check_sizes(w: &HostWeights<'_>) -> Result<(), GpuError> {
    let c = w.config;
    let (h, hd, ff, v) = (c.hidden_size, c.head_dim, c.intermediate_size, c.vocab_size);
    let (q, kv) = (c.num_attention_heads * hd, c.num_key_value_heads * hd);
    let check = |name: String, got: usize, want: usize| {
        if got == want {
            Ok(())
        } else {
            Err(GpuError::Unsupported(format!(
                "weight {name}: {got} f32 values, expected {want} (quantized matrices must be dequantized before the upload)"
            )))
        }
    };
    check("embedding".into(), w.embedding.len(), v * h)?;
    check("lm_head".into(), w.lm_head.len(), v * h)?;
    for (i, l) in w.layers.iter().enumerate() {
        check(format!("layers.{i}.qkv"), l.qkv.len(), (q + 2 * kv) * h)?;
        check(format!("layers.{i}.o"), l.o.len(), h * q)?;
        check(format!("layers.{i}.gate_up"), l.gate_up.len(), 2 * ff * h)?;
        check(format!("layers.{i}.down"), l.down.len(), h * ff)?;
    }
    Ok(())
}
