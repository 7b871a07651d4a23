//! Which slice of the model each tensor-parallel rank holds.
//!
//! Heads are split by KV group: a rank holds whole KV heads with their
//! query heads. With more ranks than KV heads, a KV head is replicated on
//! several ranks and its query heads are divided among them (Gemma-3-270M's
//! one KV head). The FFN's intermediate columns are split in whole quant
//! blocks (256 values where the width allows, else 32), so a row-parallel
//! `down_proj` is never cut through a block. Vocabulary rows (embedding and
//! LM head) are split anywhere.
//!
//! Unlike vLLM, sizes that do not divide are split unevenly, as evenly as
//! the groups and blocks allow (the first ranks take one more): SmolLM2's 3
//! KV groups over 2 ranks are 2 and 1; Qwen2.5-Coder-0.5B's FFN width 4864
//! (19 blocks of 256) is 10 and 9 blocks. Only a split that would leave a
//! rank with nothing is refused, naming the numbers.
//!
//! Cost: O(world) at startup.

use crate::model::{Dims, ModelError};
use model_loader::ModelConfig;
use std::ops::Range;

/// One rank's slice, in the model's global indices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankShard {
    /// Query heads.
    pub q_heads: Range<usize>,
    /// KV heads (one, shared with other ranks, when replicated).
    pub kv_heads: Range<usize>,
    /// Intermediate (FFN) columns: rows of gate and up, columns of down.
    pub inter: Range<usize>,
    /// Vocabulary rows of the embedding and the LM head.
    pub vocab: Range<usize>,
}

/// Every rank's slice of one model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TpPlan {
    pub ranks: Vec<RankShard>,
    pub head_dim: usize,
}

/// One rank's query heads and KV heads.
type HeadSplit = (Range<usize>, Range<usize>);

/// `n` split into `parts` ranges, the first `n % parts` one longer.
fn even(n: usize, parts: usize) -> Vec<Range<usize>> {
    let (q, r) = (n / parts, n % parts);
    let mut start = 0;
    (0..parts)
        .map(|i| {
            let len = q + usize::from(i < r);
            let range = start..start + len;
            start += len;
            range
        })
        .collect()
}

fn refuse(msg: String) -> ModelError {
    ModelError::InvalidConfig(msg)
}

impl TpPlan {
    /// The split of `dims` over `world` ranks (see the module docs).
    pub fn new(dims: &Dims, world: usize) -> Result<Self, ModelError> {
        if world == 0 {
            return Err(refuse("tensor parallel size 0".into()));
        }
        let heads = Self::heads(dims, world)?;
        let block = [256, 32, 1]
            .into_iter()
            .find(|b| dims.inter.is_multiple_of(*b))
            .unwrap_or(1);
        let units = dims.inter / block;
        if units < world {
            return Err(refuse(format!(
                "tensor parallel size {world} leaves a rank without FFN columns: \
                 intermediate size {} is {units} blocks of {block}",
                dims.inter
            )));
        }
        if dims.vocab < world {
            return Err(refuse(format!(
                "tensor parallel size {world} exceeds the vocabulary ({})",
                dims.vocab
            )));
        }
        let inter = even(units, world);
        let vocab = even(dims.vocab, world);
        let ranks = heads
            .into_iter()
            .zip(inter)
            .zip(vocab)
            .map(|(((q_heads, kv_heads), inter), vocab)| RankShard {
                q_heads,
                kv_heads,
                inter: inter.start * block..inter.end * block,
                vocab,
            })
            .collect();
        Ok(Self {
            ranks,
            head_dim: dims.head_dim,
        })
    }

    /// Each rank's (query heads, KV heads).
    fn heads(d: &Dims, world: usize) -> Result<Vec<HeadSplit>, ModelError> {
        let per_group = d.heads / d.kv_heads;
        if world <= d.kv_heads {
            return Ok(even(d.kv_heads, world)
                .into_iter()
                .map(|g| (g.start * per_group..g.end * per_group, g))
                .collect());
        }
        // More ranks than KV heads: ranks per group as even as possible,
        // each group's query heads divided among its ranks.
        let mut out = Vec::with_capacity(world);
        for (g, ranks) in even(world, d.kv_heads).into_iter().enumerate() {
            if ranks.len() > per_group {
                return Err(refuse(format!(
                    "tensor parallel size {world} leaves a rank without a query head: \
                     {} query heads in {} KV groups ({} ranks on a group of {per_group})",
                    d.heads,
                    d.kv_heads,
                    ranks.len()
                )));
            }
            for q in even(per_group, ranks.len()) {
                let base = g * per_group;
                out.push((base + q.start..base + q.end, g..g + 1));
            }
        }
        Ok(out)
    }

    /// Number of ranks.
    pub fn world(&self) -> usize {
        self.ranks.len()
    }

    /// Rank `rank`'s model configuration: its heads and FFN width; the
    /// vocabulary stays global (token ids and logits are global; only the
    /// embedding's and head's rows are sliced).
    pub fn local_config(&self, config: &ModelConfig, rank: usize) -> ModelConfig {
        let s = &self.ranks[rank];
        let mut c = config.clone();
        c.num_attention_heads = s.q_heads.len();
        c.num_key_value_heads = s.kv_heads.len();
        c.intermediate_size = s.inter.len();
        c
    }

    /// The most KV heads any rank holds (pools are sized for it, so every
    /// rank fits the same number of blocks in the same budget).
    pub fn max_kv_heads(&self) -> usize {
        self.ranks
            .iter()
            .map(|r| r.kv_heads.len())
            .max()
            .unwrap_or(0)
    }

    /// One line for the startup log.
    pub fn describe(&self, rank: usize, library: &str) -> String {
        let s = &self.ranks[rank];
        format!(
            "tensor parallel size {}, rank {rank}: query heads {:?}, KV heads {:?}, \
             FFN columns {:?}, vocabulary rows {:?}; collectives on {library}",
            self.world(),
            s.q_heads,
            s.kv_heads,
            s.inter,
            s.vocab
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(heads: usize, kv_heads: usize, inter: usize) -> Dims {
        Dims {
            hidden: 64,
            heads,
            kv_heads,
            head_dim: 64,
            inter,
            vocab: 1000,
            layers: 1,
            eps: 1e-6,
        }
    }

    /// Every query head, FFN column and vocabulary row is held exactly
    /// once, in rank order; each rank's query heads belong to its KV heads.
    fn check_cover(d: &Dims, p: &TpPlan) {
        let mut next = (0, 0, 0);
        for r in &p.ranks {
            assert_eq!(r.q_heads.start, next.0);
            assert_eq!(r.inter.start, next.1);
            assert_eq!(r.vocab.start, next.2);
            assert!(!r.q_heads.is_empty() && !r.inter.is_empty());
            let per_group = d.heads / d.kv_heads;
            assert_eq!(r.q_heads.start / per_group, r.kv_heads.start);
            assert_eq!((r.q_heads.end - 1) / per_group, r.kv_heads.end - 1);
            next = (r.q_heads.end, r.inter.end, r.vocab.end);
        }
        assert_eq!(next, (d.heads, d.inter, d.vocab));
    }

    #[test]
    fn uneven_splits_follow_groups_and_blocks() {
        // SmolLM2-135M: 9 heads in 3 KV groups, FFN 1536 (6 blocks of 256).
        let d = dims(9, 3, 1536);
        let p = TpPlan::new(&d, 2).expect("tp 2");
        check_cover(&d, &p);
        assert_eq!(p.ranks[0].kv_heads, 0..2);
        assert_eq!(p.ranks[1].q_heads, 6..9);
        let p3 = TpPlan::new(&d, 3).expect("tp 3");
        check_cover(&d, &p3);
        assert_eq!(p3.ranks[2].kv_heads, 2..3);
        // Qwen2.5-Coder-0.5B: FFN 4864 = 19 blocks of 256: 10 and 9.
        let d = dims(14, 2, 4864);
        let p = TpPlan::new(&d, 2).expect("tp 2");
        check_cover(&d, &p);
        assert_eq!(p.ranks[0].inter, 0..2560);
        assert_eq!(p.ranks[1].inter, 2560..4864);
        // 3 ranks on 2 KV groups: group 0 on two ranks (4 + 3 heads).
        let p = TpPlan::new(&d, 3).expect("tp 3");
        check_cover(&d, &p);
        assert_eq!(p.ranks[0].kv_heads, 0..1);
        assert_eq!(p.ranks[1].kv_heads, 0..1);
        assert_eq!(p.ranks[0].q_heads, 0..4);
        assert_eq!(p.ranks[1].q_heads, 4..7);
        assert_eq!(p.ranks[2].q_heads, 7..14);
        assert_eq!(p.max_kv_heads(), 1);
    }

    #[test]
    fn one_kv_head_is_replicated() {
        // Gemma-3-270M: 4 heads, 1 KV head, FFN 2048.
        let d = dims(4, 1, 2048);
        for world in 1..=4 {
            let p = TpPlan::new(&d, world).expect("split");
            check_cover(&d, &p);
            assert!(p.ranks.iter().all(|r| r.kv_heads == (0..1)));
        }
    }

    #[test]
    fn a_rank_left_with_nothing_is_refused_with_the_numbers() {
        let e = TpPlan::new(&dims(4, 1, 2048), 5).expect_err("5 ranks, 4 heads");
        assert!(
            e.to_string().contains("4 query heads in 1 KV groups"),
            "{e}"
        );
        let e = TpPlan::new(&dims(8, 8, 512), 3).expect_err("2 blocks");
        assert!(e.to_string().contains("2 blocks of 256"), "{e}");
        assert!(TpPlan::new(&dims(8, 8, 512), 0).is_err());
    }

    #[test]
    fn local_config_holds_the_rank_slice() {
        let c = crate::model::test_util::tiny_config(false, None);
        let d = Dims::of(&c).expect("dims");
        let p = TpPlan::new(&d, 2).expect("tp 2");
        let l = p.local_config(&c, 1);
        assert_eq!(l.num_attention_heads, p.ranks[1].q_heads.len());
        assert_eq!(l.num_key_value_heads, p.ranks[1].kv_heads.len());
        assert_eq!(l.intermediate_size, p.ranks[1].inter.len());
        assert_eq!(l.vocab_size, c.vocab_size);
    }
}
