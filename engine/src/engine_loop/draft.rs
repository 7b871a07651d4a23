//! The draft model proposer (vLLM's `"draft_model"`): a smaller model with
//! the target's vocabulary runs greedily ahead of each speculating
//! sequence, on its own executor and its own paged KV cache (the same
//! block size and layout as the target's; its own pool and block ids).
//!
//! Per step, for the sequences asked about: each one's draft cache is cut
//! back to the longest prefix it shares with the sequence's accepted tokens
//! (the target rejected the rest), the tokens past it are computed as one
//! span whose last row gives the first proposal, then each further
//! proposal is one decode row; all sequences share each forward pass
//! (`max` passes per step at most). Proposals are the draft's argmax (its
//! `q` is one-hot: see `crate::spec` for why acceptance is then exact).
//!
//! Invariants: a sequence's draft cache holds exactly `State::tokens`;
//! a sequence the engine no longer has is freed at the next `retain`; a
//! sequence whose draft cache cannot grow (draft pool full) gets no
//! proposal this step and its draft cache is dropped (it is rebuilt later).
//!
//! Cost: per step `max` draft forward passes over the speculating
//! sequences, plus the catch-up tokens (the previous step's accepted and
//! corrected ones; a whole prompt the first time).

use crate::error::EngineError;
use crate::executor::{Executor, Sampling, StepOutput};
use crate::kv::{KvCacheManager, LengthHint, PagedKvCacheManager, PagedKvConfig, SeqId};
use crate::sampler::Sampler;
use crate::spec::{ProposeInput, Proposer};
use engine_core::{BlockOps, ForwardBatch, SeqSpan};
use std::collections::HashMap;

const HINT: LengthHint = LengthHint {
    max_total_tokens: usize::MAX,
    oracle_total_tokens: None,
};

/// A draft model and its KV cache (see the module docs).
pub struct DraftProposer {
    exec: Box<dyn Executor>,
    kv: PagedKvCacheManager,
    /// The tokens each sequence's draft cache holds.
    seqs: HashMap<SeqId, Vec<u32>>,
}

/// One sequence's work in a draft pass.
struct Row {
    seq: SeqId,
    tokens: Vec<u32>,
}

impl DraftProposer {
    /// A proposer over `exec` (the draft model's executor, its whole
    /// accelerator pool for the draft cache). Refuses a draft whose
    /// vocabulary differs from the target's.
    pub fn new(exec: Box<dyn Executor>, target_vocab: usize) -> Result<Self, EngineError> {
        if exec.vocab_size() != target_vocab {
            return Err(EngineError::InvalidConfig(format!(
                "speculative config: the draft model's vocabulary ({} tokens) differs from the \
                 target model's ({target_vocab}); a draft must share the target's tokenizer",
                exec.vocab_size()
            )));
        }
        let (blocks, _) = exec.num_blocks();
        let mut cfg = PagedKvConfig::new(exec.block_size(), blocks, 0);
        cfg.enable_prefix_caching = false;
        cfg.watermark = 0.0;
        let kv = PagedKvCacheManager::new(cfg)?;
        Ok(Self {
            exec,
            kv,
            seqs: HashMap::new(),
        })
    }

    /// Cuts `seq`'s draft cache to the prefix it shares with `tokens`
    /// (leaving at least the last token to compute) and returns the tokens
    /// to compute.
    fn catch_up(&mut self, seq: SeqId, tokens: &[u32]) -> Result<Vec<u32>, EngineError> {
        let cached = match self.seqs.get(&seq) {
            Some(c) => c,
            None => {
                self.kv.allocate(seq, &[], HINT)?;
                self.seqs.insert(seq, Vec::new());
                &self.seqs[&seq]
            }
        };
        let common = cached
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count()
            .min(tokens.len().saturating_sub(1));
        if common < cached.len() {
            self.kv.truncate(seq, common)?;
            if let Some(c) = self.seqs.get_mut(&seq) {
                c.truncate(common);
            }
        }
        Ok(tokens[common..].to_vec())
    }

    /// One draft pass: each row's tokens appended to its cache and
    /// computed; returns each row's argmax at its last token (`None`: the
    /// draft pool had no room for that row, whose state was dropped).
    fn pass(&mut self, rows: &[Row]) -> Result<Vec<Option<u32>>, EngineError> {
        let mut batch = ForwardBatch::default();
        let mut ops = BlockOps::default();
        let mut placed = Vec::with_capacity(rows.len());
        for r in rows {
            let Ok(out) = self.kv.append_slots(r.seq, &r.tokens) else {
                self.drop_seq(r.seq);
                placed.push(false);
                continue;
            };
            let start = self.seqs.get(&r.seq).map_or(0, Vec::len);
            let end = start + r.tokens.len();
            batch.token_ids.extend_from_slice(&r.tokens);
            batch.positions.extend(start..end);
            batch.slot_mapping.extend(out.slots);
            ops.copies.extend(out.copies);
            batch.seqs.push(SeqSpan {
                query_len: r.tokens.len(),
                context_len: end,
                block_table: self.kv.block_table(r.seq)?.to_vec(),
            });
            batch.logits_rows.push(batch.token_ids.len() - 1);
            if let Some(c) = self.seqs.get_mut(&r.seq) {
                c.extend_from_slice(&r.tokens);
            }
            placed.push(true);
        }
        if batch.token_ids.is_empty() {
            return Ok(vec![None; rows.len()]);
        }
        let sampling = if self.exec.capabilities().greedy {
            Sampling::Greedy
        } else {
            Sampling::Host
        };
        let ids: Vec<u32> = match self.exec.execute(&ops, &batch, &sampling)? {
            StepOutput::Logits(l) => Sampler.greedy_rows(&l).iter().map(|s| s.token).collect(),
            StepOutput::Drawn(d) => d.rows.iter().map(|r| r.token).collect(),
        };
        let mut ids = ids.into_iter();
        Ok(placed
            .into_iter()
            .map(|ok| if ok { ids.next() } else { None })
            .collect())
    }

    fn drop_seq(&mut self, seq: SeqId) {
        if self.seqs.remove(&seq).is_some() {
            self.kv.free(seq);
        }
    }

    /// [`Proposer::propose`], with the draft's failures as errors.
    fn try_propose(&mut self, inputs: &[ProposeInput<'_>]) -> Result<Vec<Vec<u32>>, EngineError> {
        let mut out: Vec<Vec<u32>> = vec![Vec::new(); inputs.len()];
        let mut rows = Vec::with_capacity(inputs.len());
        let mut who = Vec::with_capacity(inputs.len());
        for (i, input) in inputs.iter().enumerate() {
            if input.max == 0 || input.tokens.is_empty() {
                continue;
            }
            let tokens = self.catch_up(input.seq, input.tokens)?;
            rows.push(Row {
                seq: input.seq,
                tokens,
            });
            who.push(i);
        }
        let mut round = 0;
        while !rows.is_empty() {
            let next = self.pass(&rows)?;
            round += 1;
            let (mut keep_rows, mut keep_who) = (Vec::new(), Vec::new());
            for ((row, i), id) in rows.into_iter().zip(who).zip(next) {
                let Some(id) = id else { continue };
                out[i].push(id);
                if round < inputs[i].max {
                    keep_rows.push(Row {
                        seq: row.seq,
                        tokens: vec![id],
                    });
                    keep_who.push(i);
                }
            }
            rows = keep_rows;
            who = keep_who;
        }
        Ok(out)
    }
}

impl Proposer for DraftProposer {
    fn propose(&mut self, inputs: &[ProposeInput<'_>]) -> Vec<Vec<u32>> {
        match self.try_propose(inputs) {
            Ok(p) => p,
            Err(e) => {
                // The target decodes without proposals; the draft starts
                // over (its caches are dropped).
                tracing::warn!(error = %crate::error::Report(&e), "draft model failed; no proposals this step");
                let seqs: Vec<SeqId> = self.seqs.keys().copied().collect();
                for s in seqs {
                    self.drop_seq(s);
                }
                vec![Vec::new(); inputs.len()]
            }
        }
    }

    fn retain(&mut self, alive: &dyn Fn(SeqId) -> bool) {
        let dead: Vec<SeqId> = self.seqs.keys().copied().filter(|&s| !alive(s)).collect();
        for s in dead {
            self.drop_seq(s);
        }
    }
}
