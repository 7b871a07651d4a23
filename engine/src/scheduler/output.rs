//! What a step reports per request ([`RequestOutput`]), and [`Outputs`],
//! one step's outputs in first-touched order.

use super::{FinishReason, RequestId};
use crate::error::EngineError;
use crate::sampler::PromptLogprob;
use std::collections::HashMap;

/// New tokens of one sequence of a request since the previous output.
#[derive(Debug, Clone, PartialEq)]
pub struct SeqOutput {
    /// Index of the sequence in its group (0 for n = 1).
    pub index: usize,
    pub new_token_ids: Vec<u32>,
    /// Logprob of each new token.
    pub new_logprobs: Vec<f32>,
    /// Top alternatives of each new token, best first (empty unless the
    /// request asked for `logprobs`).
    pub new_top_logprobs: Vec<Vec<(u32, f32)>>,
    /// Set on the sequence's last output.
    pub finish_reason: Option<FinishReason>,
}

/// One request's news from one step.
#[derive(Debug, Clone)]
pub struct RequestOutput {
    pub request_id: RequestId,
    pub seqs: Vec<SeqOutput>,
    /// The request is done; no more outputs follow.
    pub finished: bool,
    /// Why the request was refused or failed (then `finished` is true).
    pub error: Option<EngineError>,
    /// Prompt tokens found in the prefix cache at the last admission.
    pub num_cached_tokens: usize,
    /// `prompt_logprobs` (vLLM's shape): one entry per prompt token, `None`
    /// for the first. Set on exactly one output of a request that asked for
    /// them: its first output with tokens (its final one when the group's
    /// outputs are buffered: best_of > n, beam search). Never set on an
    /// error output.
    pub prompt_logprobs: Option<Vec<Option<PromptLogprob>>>,
}

impl RequestOutput {
    pub(crate) fn new(request_id: RequestId) -> Self {
        Self {
            request_id,
            seqs: Vec::new(),
            finished: false,
            error: None,
            num_cached_tokens: 0,
            prompt_logprobs: None,
        }
    }

    pub(crate) fn failed(request_id: RequestId, error: EngineError) -> Self {
        Self {
            finished: true,
            error: Some(error),
            ..Self::new(request_id)
        }
    }

    /// The entry for sequence `index`, created on first use.
    pub(crate) fn seq_mut(&mut self, index: usize) -> &mut SeqOutput {
        let pos = match self.seqs.iter().position(|s| s.index == index) {
            Some(p) => p,
            None => {
                self.seqs.push(SeqOutput {
                    index,
                    new_token_ids: Vec::new(),
                    new_logprobs: Vec::new(),
                    new_top_logprobs: Vec::new(),
                    finish_reason: None,
                });
                self.seqs.len() - 1
            }
        };
        &mut self.seqs[pos]
    }

    /// All new tokens of sequence 0 (convenience for n = 1).
    pub fn token_ids(&self) -> &[u32] {
        self.seqs
            .iter()
            .find(|s| s.index == 0)
            .map_or(&[], |s| &s.new_token_ids)
    }
}

/// Outputs of one step in first-touched order.
#[derive(Debug, Default)]
pub struct Outputs {
    list: Vec<RequestOutput>,
    index: HashMap<RequestId, usize>,
}

impl Outputs {
    /// The output of request `id`, created on first use.
    pub fn get(&mut self, id: RequestId) -> &mut RequestOutput {
        let i = *self.index.entry(id).or_insert_with(|| {
            self.list.push(RequestOutput::new(id));
            self.list.len() - 1
        });
        &mut self.list[i]
    }

    /// Replaces request `id`'s output with its failure.
    pub fn push_failed(&mut self, id: RequestId, error: EngineError) {
        *self.get(id) = RequestOutput::failed(id, error);
    }

    /// The outputs, in first-touched order.
    pub fn into_list(self) -> Vec<RequestOutput> {
        self.list
    }
}
