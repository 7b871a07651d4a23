//! Which LoRA targets each adaptable linear layer's output holds, and at
//! which columns (the fused layers' parts in their stacking order).

use super::Dims;
use crate::model::lora::{LoraCols, LoraTarget};

/// Fused q/k/v: q, then k, then v.
pub fn qkv(d: &Dims) -> [LoraCols; 3] {
    crate::model::lora::kernel::qkv_cols(d.q_dim(), d.kv_dim())
}

/// Fused gate/up: gate, then up.
pub fn gate_up(d: &Dims) -> [LoraCols; 2] {
    [
        LoraCols {
            target: LoraTarget::Gate,
            offset: 0,
        },
        LoraCols {
            target: LoraTarget::Up,
            offset: d.inter,
        },
    ]
}

/// A layer with one target (o, down).
pub fn one(target: LoraTarget) -> [LoraCols; 1] {
    [LoraCols { target, offset: 0 }]
}
