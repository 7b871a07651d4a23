//! CUDA graphs for decode-only steps (vLLM's `cudagraph_capture_sizes`):
//! a decode step of `k` sequences is padded to the smallest bucket `B >= k`
//! of 1, 2, 4, 8, 16, 24, ... (multiples of 8) up to `min(512,
//! max_num_seqs)` and runs as one graph launch.
//!
//! Captured lazily: the first decode step of a bucket runs eagerly on the
//! padded batch (which also sizes every scratch buffer for it), then the same
//! launches are captured, not run, and kept; later steps of that bucket
//! upload their integers into the persistent batch and launch the graph.
//! (vLLM captures every bucket at start; lazy capture costs nothing for
//! buckets a workload never uses and needs no warm-up batch.)
//!
//! Invariants: a graph is replayed only while the scratch fingerprint (every
//! buffer's address and size, the persistent batch's included) equals the
//! one at capture, so every pointer baked into it is live and large enough;
//! weights and KV pools never move while the executor lives. Padding rows
//! write only the pool's padding slots (`KvPools::pad_slot`) and their
//! outputs are never downloaded. The decode plan of a graph is fixed for any
//! context up to the model's positions (split-K partitions past a
//! sequence's context exit at once), so a replay is right for every
//! validated batch of its bucket. Prefill and mixed steps stay eager, and so
//! does a decode step whose logits rows are not `0..k` or that no bucket
//! fits, and every step with LoRA adapters (`lora.rs`: its launches depend
//! on which slots the step uses, so a graph would need a key per slot set;
//! not done).
//!
//! Cost: per graph step, host work is the persistent-batch upload and one
//! graph launch; a capture costs one eager padded step plus the capture.

use super::device::GraphId;
use super::forward::Output;
use crate::executor::{ForwardBatch, SeqSpan};

/// The largest bucket vLLM captures.
pub const MAX_BUCKET: usize = 512;

/// A scratch fingerprint (see `forward::Scratch::fingerprint`).
pub type Fingerprint = [(u64, usize); 18];

/// The captured graphs and the bucket limit.
#[derive(Default)]
pub struct Graphs {
    /// Largest bucket; 0 turns graphs off (`--enforce-eager`).
    limit: usize,
    captured: Vec<Captured>,
}

struct Captured {
    bucket: usize,
    out: Output,
    graph: GraphId,
    fingerprint: Fingerprint,
}

impl Graphs {
    /// Graphs for decode batches of up to `min(512, max_num_seqs)` sequences;
    /// `enforce_eager` turns them off.
    pub fn new(max_num_seqs: usize, enforce_eager: bool) -> Self {
        Self {
            limit: if enforce_eager {
                0
            } else {
                max_num_seqs.min(MAX_BUCKET)
            },
            captured: Vec::new(),
        }
    }

    /// The bucket of a validated `batch`, if it may run as a graph.
    pub fn bucket_of(&self, batch: &ForwardBatch) -> Option<usize> {
        let k = batch.seqs.len();
        let decode = k > 0
            && batch.seqs.iter().all(|s| s.query_len == 1)
            && batch.logits_rows.len() == k
            && batch.logits_rows.iter().enumerate().all(|(i, &r)| i == r);
        if !decode {
            return None;
        }
        bucket(k).filter(|&b| b <= self.limit)
    }

    /// The graph of `(bucket, out)` if it was captured with `fingerprint`.
    pub fn find(&self, bucket: usize, out: Output, fingerprint: &Fingerprint) -> Option<GraphId> {
        self.captured
            .iter()
            .find(|c| c.bucket == bucket && c.out == out && &c.fingerprint == fingerprint)
            .map(|c| c.graph)
    }

    /// Forgets the graph of `(bucket, out)`, returning it for release.
    pub fn take(&mut self, bucket: usize, out: Output) -> Option<GraphId> {
        let i = self
            .captured
            .iter()
            .position(|c| c.bucket == bucket && c.out == out)?;
        Some(self.captured.swap_remove(i).graph)
    }

    /// Keeps a graph just captured.
    pub fn insert(&mut self, bucket: usize, out: Output, graph: GraphId, fingerprint: Fingerprint) {
        self.captured.push(Captured {
            bucket,
            out,
            graph,
            fingerprint,
        });
    }
}

/// The smallest bucket holding `k` sequences: 1, 2, 4, 8, then multiples of
/// 8 up to [`MAX_BUCKET`].
pub fn bucket(k: usize) -> Option<usize> {
    match k {
        0 => None,
        1 | 2 => Some(k),
        3 | 4 => Some(4),
        _ if k <= MAX_BUCKET => Some(k.next_multiple_of(8)),
        _ => None,
    }
}

/// A batch with the counts of a padded decode step of `bucket` rows (what
/// `forward::compute` reads of it); only built when capturing.
pub fn padded_counts(bucket: usize) -> ForwardBatch {
    ForwardBatch {
        token_ids: vec![0; bucket],
        positions: vec![0; bucket],
        slot_mapping: vec![0; bucket],
        seqs: (0..bucket)
            .map(|_| SeqSpan {
                query_len: 1,
                context_len: 1,
                block_table: Vec::new(),
            })
            .collect(),
        logits_rows: (0..bucket).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_vllms_capture_sizes() {
        let got: Vec<_> = [1, 2, 3, 4, 5, 8, 9, 16, 17, 255, 256, 505, 512, 513]
            .map(bucket)
            .to_vec();
        let want = [1, 2, 4, 4, 8, 8, 16, 16, 24, 256, 256, 512, 512];
        assert_eq!(got[..13], want.map(Some));
        assert_eq!(got[13], None);
        assert_eq!(bucket(0), None);
        // Padding never exceeds what the pool's padding blocks hold.
        for k in 1..=MAX_BUCKET {
            let b = bucket(k).map_or(0, |b| b - k);
            assert!(b <= super::super::blocks::MAX_PAD_ROWS, "k={k}");
        }
    }
}
