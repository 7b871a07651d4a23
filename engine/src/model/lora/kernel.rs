//! The CPU's LoRA delta: `y[i, cols] += scale (x[i] A^T) B^T` for each row
//! `i` whose sequence has an adapter, rows grouped by slot.
//!
//! [`Prepared`] is an adapter in the kernel's layout, made once when a slot
//! is filled: `A` as given (`[r, in]`, rows contiguous for the `x . A_k`
//! dots) and `B^T` pre-multiplied by the scale (`[r, out]`, so the second
//! product is `r` axpys over contiguous output rows). [`RowGroups`] lists,
//! per slot, the step's rows (prefill chunks are contiguous segments as in
//! SGMV, decode rows scattered as in BGMV: both are the same gathered list
//! here), built once per step.
//!
//! Invariants: reads `x` rows and adds into `out` rows of the listed rows
//! only; a target the adapter does not adapt in this layer adds nothing.
//!
//! Cost: per row and target `r x (in + out)` multiply-adds; the row groups
//! are O(tokens) once per step. Each call cuts the adapted rows into tasks
//! of up to 4 rows of one slot and runs them in one fork-join region.

use super::{LoraCols, LoraStep};
use crate::model::ops::dot;
use crate::model::par;
use model_loader::lora::{LoraAdapter, LoraTarget};

/// One adapted matrix in the kernel's layout.
#[derive(Debug, Clone)]
struct PreparedPair {
    rank: usize,
    /// `[r, in]`.
    a: Vec<f32>,
    /// `scale B^T`, `[r, out]`.
    bt: Vec<f32>,
    out: usize,
}

/// An adapter in the kernel's layout.
#[derive(Debug, Clone)]
pub struct Prepared {
    layers: Vec<[Option<PreparedPair>; 7]>,
}

impl Prepared {
    /// Converts `a` (O(adapter elements)).
    pub fn new(a: &LoraAdapter) -> Self {
        let r = a.rank;
        let layers = a
            .layers
            .iter()
            .map(|l| {
                std::array::from_fn(|t| {
                    l.pairs[t].as_ref().map(|p| {
                        let out = p.b.len() / r;
                        let mut bt = vec![0.0f32; r * out];
                        for o in 0..out {
                            for k in 0..r {
                                bt[k * out + o] = a.scale * p.b[o * r + k];
                            }
                        }
                        PreparedPair {
                            rank: r,
                            a: p.a.clone(),
                            bt,
                            out,
                        }
                    })
                })
            })
            .collect();
        Self { layers }
    }
}

/// Per slot, the step's rows using it.
#[derive(Debug, Clone, Default)]
pub struct RowGroups {
    pub groups: Vec<(usize, Vec<usize>)>,
}

impl RowGroups {
    /// From the step's slots and each sequence's query length.
    pub fn new(step: &LoraStep, query_lens: impl Iterator<Item = usize>) -> Self {
        let mut per: Vec<Vec<usize>> = vec![Vec::new(); step.slots.len()];
        let mut row = 0;
        for (i, q) in query_lens.enumerate() {
            if let Some(Some(s)) = step.seq_slot.get(i) {
                per[*s as usize].extend(row..row + q);
            }
            row += q;
        }
        Self {
            groups: per
                .into_iter()
                .enumerate()
                .filter(|(_, r)| !r.is_empty())
                .collect(),
        }
    }

    /// True when no row has an adapter.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }
}

/// Raw rows of `out` shared by tasks that write disjoint rows.
struct OutRows {
    ptr: *mut f32,
    width: usize,
}
// SAFETY: tasks write disjoint rows (each row index appears in one group
// and one task's range), so no two threads touch the same element.
unsafe impl Sync for OutRows {}

/// Rows per task: the step's adapted rows are cut into tasks of at most
/// this many rows of one slot, all run in one fork-join region.
const ROWS_PER_TASK: usize = 4;

/// Adds the deltas of `cols` for layer `layer` into `out` (`[n, out_width]`)
/// from `x` (`[n, in]`).
pub fn apply(
    x: &[f32],
    out: &mut [f32],
    n: usize,
    groups: &RowGroups,
    prepared: &[Option<std::sync::Arc<Prepared>>],
    layer: usize,
    cols: &[LoraCols],
) {
    if n == 0 || groups.is_empty() {
        return;
    }
    let inp = x.len() / n;
    let width = out.len() / n;
    let rows = OutRows {
        ptr: out.as_mut_ptr(),
        width,
    };
    // Per group: the adapted matrices of this layer and their columns.
    let per_group: Vec<Vec<(&PreparedPair, usize)>> = groups
        .groups
        .iter()
        .map(|(slot, _)| {
            let Some(Some(p)) = prepared.get(*slot) else {
                return Vec::new();
            };
            let Some(layer_pairs) = p.layers.get(layer) else {
                return Vec::new();
            };
            cols.iter()
                .filter_map(|c| {
                    layer_pairs[c.target.index()]
                        .as_ref()
                        .map(|q| (q, c.offset))
                })
                .collect()
        })
        .collect();
    let tasks: Vec<(usize, usize)> = groups
        .groups
        .iter()
        .enumerate()
        .filter(|(g, _)| !per_group[*g].is_empty())
        .flat_map(|(g, (_, list))| {
            (0..list.len().div_ceil(ROWS_PER_TASK)).map(move |t| (g, t * ROWS_PER_TASK))
        })
        .collect();
    let rows = &rows;
    let run = |t: usize| {
        let (g, start) = tasks[t];
        let list = &groups.groups[g].1;
        let mut tmp = [0.0f32; 64];
        for &i in &list[start..(start + ROWS_PER_TASK).min(list.len())] {
            let xi = &x[i * inp..(i + 1) * inp];
            // SAFETY: row `i < n` of `out` (width `rows.width`), written by
            // this task only (see `OutRows`).
            let yi =
                unsafe { std::slice::from_raw_parts_mut(rows.ptr.add(i * rows.width), rows.width) };
            for (pp, off) in &per_group[g] {
                add_row(pp, xi, &mut yi[*off..*off + pp.out], &mut tmp);
            }
        }
    };
    par::for_each(tasks.len(), run);
}

/// `y += (x A^T) (scale B^T)` for one row.
fn add_row(p: &PreparedPair, x: &[f32], y: &mut [f32], tmp: &mut [f32; 64]) {
    let inp = x.len();
    // Ranks above 64 take the slow path through a heap vector.
    let mut heap;
    let t: &mut [f32] = if p.rank <= tmp.len() {
        &mut tmp[..p.rank]
    } else {
        heap = vec![0.0f32; p.rank];
        &mut heap[..]
    };
    for (k, tk) in t.iter_mut().enumerate() {
        *tk = dot(x, &p.a[k * inp..(k + 1) * inp]);
    }
    for (k, &tk) in t.iter().enumerate() {
        let b = &p.bt[k * p.out..(k + 1) * p.out];
        y.iter_mut().zip(b).for_each(|(o, &w)| *o += tk * w);
    }
}

/// The targets and column offsets of the fused q/k/v output.
pub fn qkv_cols(q: usize, kv: usize) -> [LoraCols; 3] {
    [
        LoraCols {
            target: LoraTarget::Q,
            offset: 0,
        },
        LoraCols {
            target: LoraTarget::K,
            offset: q,
        },
        LoraCols {
            target: LoraTarget::V,
            offset: q + kv,
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::lora::{LoraId, LoraStep, SlotEntry};
    use model_loader::lora::{LoraFormat, LoraLayer, LoraPair};
    use model_loader::lora_gen::delta;
    use std::sync::Arc;

    fn adapter(seed: u32, rank: usize, out: usize, inp: usize) -> LoraAdapter {
        let mut s = seed;
        let mut r = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
                })
                .collect()
        };
        let mut layer = LoraLayer::default();
        layer.pairs[LoraTarget::K.index()] = Some(LoraPair {
            a: r(rank * inp),
            b: r(out * rank),
        });
        LoraAdapter {
            format: LoraFormat::Peft,
            rank,
            alpha: 2.0 * rank as f32,
            scale: 2.0,
            base_model: None,
            layers: vec![layer],
        }
    }

    /// Rows of two adapters and the base, scattered and in segments, against
    /// `x (scale B A)^T` computed densely; only K's columns change.
    #[test]
    fn grouped_rows_match_the_dense_delta() {
        let (inp, q, kv) = (24, 16, 8);
        let width = q + 2 * kv;
        let adapters = [adapter(1, 4, kv, inp), adapter(2, 3, kv, inp)];
        let step = LoraStep {
            slots: adapters
                .iter()
                .enumerate()
                .map(|(i, a)| {
                    Some(SlotEntry {
                        id: LoraId(i as u32 + 1),
                        adapter: Arc::new(a.clone()),
                    })
                })
                .collect(),
            // Sequences: 3 prompt rows on slot 1, 1 base row, 12 rows on
            // slot 0 (split over the pool), 2 rows on slot 1.
            seq_slot: vec![Some(1), None, Some(0), Some(1)],
        };
        let lens = [3usize, 1, 12, 2];
        let n: usize = lens.iter().sum();
        let x: Vec<f32> = (0..n * inp).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut y = vec![1.0f32; n * width];
        let prepared: Vec<_> = step
            .slots
            .iter()
            .map(|s| s.as_ref().map(|e| Arc::new(Prepared::new(&e.adapter))))
            .collect();
        let groups = RowGroups::new(&step, lens.iter().copied());
        apply(&x, &mut y, n, &groups, &prepared, 0, &qkv_cols(q, kv));
        let mut row = 0;
        for (seq, &len) in lens.iter().enumerate() {
            for i in row..row + len {
                let d = step.seq_slot[seq].map(|s| {
                    let a = &adapters[s as usize];
                    let p = a.layers[0].pairs[LoraTarget::K.index()].as_ref().unwrap();
                    delta(p, a.rank, kv, inp, a.scale)
                });
                for c in 0..width {
                    let want = 1.0
                        + match (&d, c) {
                            (Some(d), c) if (q..q + kv).contains(&c) => {
                                let o = c - q;
                                (0..inp)
                                    .map(|j| d[o * inp + j] * x[i * inp + j])
                                    .sum::<f32>()
                            }
                            _ => 0.0,
                        };
                    let got = y[i * width + c];
                    assert!(
                        (got - want).abs() < 1e-4,
                        "row {i} col {c}: {got} vs {want}"
                    );
                }
            }
            row += len;
        }
    }
}
