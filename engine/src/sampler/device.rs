//! Sampling where the logits are: what the device draw of a step needs
//! ([`DeviceDraws`]: each row's [`DeviceRow`], the rows' logits processing,
//! the count slots to fill), the words the kernels read, the launches in
//! order, and their output turned back into [`SampleOut`]s. The GPU executor
//! (`executor::gpu::sample`) launches them; [`emulate_draws`] runs them on
//! the host emulator for tests.
//!
//! Device rows: temperature (0 = argmax), top-k, top-p, min-p, the seeded
//! draw, up to [`MAX_LOGPROBS`] top logprobs, and ([`Processing`]) the three
//! penalties from token counts kept on the device, `logit_bias` and
//! `min_tokens` suppression (`gpu_kernels::penalty`). Rows the host draws
//! ([`DeviceDraws::host_rows`]: only their logits come back, copied on the
//! device before any processing): beam search, the first draws of a forking
//! group, prompt-logprob rows. Grammar masks keep the whole step on the
//! logits path.
//!
//! Invariants: for a supported row, [`emulate_draws`] and
//! [`super::sample_row`] give the same token (same definition, same Philox
//! uniforms, same scalar functions, the same processing in the same order)
//! and logprobs equal up to rounding, as long as the row's count slot holds
//! its sequence's tokens (filled from them, then one increment per draw);
//! on a GPU, rounding aside. The logprobs are the CPU's: those of the row
//! after `logit_bias`, before penalties and suppression.
//!
//! Cost: one upload of `PARAM_WORDS` words per row, `PEN_WORDS` plus the
//! bias and suppressed ids per processed row, and the distinct tokens of
//! each slot filled (once per sequence); `2 + 2 n` floats down per row (n
//! the step's largest `logprobs`). Nothing in proportion to the vocabulary.

use super::ops::SampleOut;
use super::params::{SamplingParams, MAX_LOGPROBS};
use engine_core::Logits;
use gpu_kernels::penalty::{pack_count, FILL_WORDS, NO_SLOT, PEN_WORDS};
use gpu_kernels::sampling::PARAM_WORDS;
use gpu_kernels::{KernelArg, LaunchConfig};
use std::collections::HashMap;

// `pack` writes these layouts word by word.
const _: () = assert!(PEN_WORDS == 9 && FILL_WORDS == 3 && PARAM_WORDS == 10);

/// One row's draw on the device.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceRow {
    /// 0: the argmax.
    pub temperature: f32,
    pub top_p: f32,
    pub min_p: f32,
    /// `None`: no top-k cut.
    pub top_k: Option<usize>,
    pub seed: u64,
    /// The sequence's index in its group (its generator's stream).
    pub seq_index: usize,
    /// Output position of the draw.
    pub step: usize,
    /// Top logprobs wanted (at most [`MAX_LOGPROBS`]).
    pub logprobs: usize,
    /// Its processed copy (an index in [`DeviceDraws::processed`]); set by
    /// [`DeviceDraws::push`].
    pub processed: Option<u32>,
    /// Its count slot; set by [`DeviceDraws::push`].
    pub slot: Option<u32>,
}

impl DeviceRow {
    /// The draw of a sequence with `output_len` tokens generated (its
    /// processing, if any, is [`Processing::of`]).
    pub fn of(p: &SamplingParams, seed: u64, seq_index: usize, output_len: usize) -> Self {
        Self {
            temperature: p.temperature,
            top_p: p.top_p,
            min_p: p.min_p,
            top_k: p.top_k,
            seed,
            seq_index,
            step: output_len,
            logprobs: p.logprobs.unwrap_or(0).min(MAX_LOGPROBS),
            processed: None,
            slot: None,
        }
    }

    /// The kernel's [`PARAM_WORDS`] words for this row.
    pub fn words(&self) -> [u32; PARAM_WORDS] {
        let top_k = self.top_k.map_or(0, |k| k.min(u32::MAX as usize) as u32);
        [
            self.temperature.to_bits(),
            self.top_p.to_bits(),
            self.min_p.to_bits(),
            top_k,
            self.seed as u32,
            (self.seed >> 32) as u32,
            self.seq_index as u32,
            self.step as u32,
            self.processed.unwrap_or(NO_SLOT),
            self.slot.unwrap_or(NO_SLOT),
        ]
    }
}

/// What changes a row's logits before its draw, in the CPU sampler's order:
/// `logit_bias` (in place: the logprobs see it), then the penalties (from
/// the row's count slot) and suppression (in the draw's copy).
#[derive(Debug, Clone, PartialEq)]
pub struct Processing {
    /// The count slot of the row's sequence (`Some` exactly when it has
    /// penalties; set by the caller, who keeps the slots).
    pub slot: Option<u32>,
    pub repetition: f32,
    pub frequency: f32,
    pub presence: f32,
    pub bias: Vec<(u32, f32)>,
    /// Ids set to `-inf` for the draw (stop ids before `min_tokens`).
    pub suppress: Vec<u32>,
}

impl Processing {
    /// The processing of a row of a sequence with `output_len` tokens
    /// generated whose stop ids (EOS unless ignored, `stop_token_ids`) are
    /// `stop_ids`, or `None` when its logits are drawn as they are. The
    /// slot is left `None`.
    pub fn of(p: &SamplingParams, output_len: usize, stop_ids: &[u32]) -> Option<Self> {
        let suppress = output_len < p.min_tokens && !stop_ids.is_empty();
        (p.has_penalties() || suppress || !p.logit_bias.is_empty()).then(|| Self {
            slot: None,
            repetition: p.repetition_penalty,
            frequency: p.frequency_penalty,
            presence: p.presence_penalty,
            bias: p.logit_bias.clone(),
            suppress: if suppress {
                stop_ids.to_vec()
            } else {
                Vec::new()
            },
        })
    }
}

/// The count entries of one slot: `(token, entry)` for each distinct token
/// of a sequence (`gpu_kernels::penalty::pack_count`), ascending by token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fill {
    pub slot: u32,
    pub entries: Vec<(u32, u32)>,
}

impl Fill {
    /// The fill of `slot` for a sequence whose tokens are `tokens`, the
    /// first `prompt_len` of them its prompt.
    pub fn from_tokens(slot: u32, tokens: &[u32], prompt_len: usize) -> Self {
        let mut counts: HashMap<u32, (bool, u32)> = HashMap::new();
        for (i, &t) in tokens.iter().enumerate() {
            let e = counts.entry(t).or_default();
            if i < prompt_len {
                e.0 = true;
            } else {
                e.1 += 1;
            }
        }
        let mut entries: Vec<(u32, u32)> = counts
            .into_iter()
            .map(|(t, (prompt, out))| (t, pack_count(prompt, out)))
            .collect();
        entries.sort_unstable();
        Self { slot, entries }
    }
}

/// One step's device draw: a row per logits row, the processed rows, the
/// slots to fill first, how many slots the count table must hold, and the
/// rows whose logits the host needs too (a mixed step).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceDraws {
    pub rows: Vec<DeviceRow>,
    /// Logits rows returned as they are (ascending; unprocessed rows):
    /// beam search, forks, prompt logprobs. Their device draws are unused.
    pub host_rows: Vec<u32>,
    /// `(row, processing)`: the processed copies, in order.
    pub processed: Vec<(u32, Processing)>,
    pub fills: Vec<Fill>,
    /// Slots of the device's count table (above every slot used).
    pub slots: u32,
}

/// Word offsets of the parts of [`DeviceDraws::pack`]'s buffer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Layout {
    pub processed: usize,
    pub lists: usize,
    pub fills: usize,
    pub pairs: usize,
    /// The host rows as `penalize_rows` rows that copy and change nothing.
    pub gather: usize,
}

/// What a device draw returns: one draw per logits row, and the host
/// rows' logits (`DeviceDraws::host_rows`, in that order) when it has any.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceOut {
    pub rows: Vec<SampleOut>,
    /// `DeviceDraws::host_rows`.
    pub host_rows: Vec<u32>,
    pub logits: Option<Logits>,
}

/// Device addresses of a step's buffers (host addresses on the emulator).
#[derive(Debug, Clone, Copy)]
pub struct Buffers {
    /// `host_rows x vocab` f32 (the host rows' copies).
    pub gather: u64,
    /// `rows x out_stride(n_top)` f32.
    pub out: u64,
    /// `rows x vocab` f32 (biased in place).
    pub logits: u64,
    /// `processed x vocab` f32.
    pub draw: u64,
    /// `slots x vocab` u32, kept across steps.
    pub counts: u64,
    /// The packed words.
    pub words: u64,
}

/// The kernels of a step, in launch order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Fill,
    Penalize,
    Sample,
}

impl Stage {
    pub const ALL: [Stage; 3] = [Stage::Fill, Stage::Penalize, Stage::Sample];

    /// The entry point.
    pub const fn kernel(self) -> &'static str {
        match self {
            Stage::Fill => "fill_counts",
            Stage::Penalize => "penalize_rows",
            Stage::Sample => "sample_rows_f32",
        }
    }
}

/// One kernel launch of a step.
#[derive(Debug, Clone)]
pub struct Launch {
    pub stage: Stage,
    pub cfg: LaunchConfig,
    pub args: Vec<KernelArg>,
}

impl DeviceDraws {
    /// Plain rows: no processing, no slots.
    pub fn plain(rows: Vec<DeviceRow>) -> Self {
        Self {
            rows,
            ..Self::default()
        }
    }

    /// Appends a row with its processing (its slot, when it has one, must
    /// be below [`Self::slots`]).
    pub fn push(&mut self, mut row: DeviceRow, processing: Option<Processing>) {
        if let Some(p) = processing {
            row.processed = Some(self.processed.len() as u32);
            row.slot = p.slot;
            self.processed.push((self.rows.len() as u32, p));
        }
        self.rows.push(row);
    }

    /// Top logprobs the step's output rows carry: the largest any row asks for.
    pub fn top_n(&self) -> usize {
        self.rows.iter().map(|r| r.logprobs).max().unwrap_or(0)
    }

    /// Writes every word the kernels read into `words` (cleared first):
    /// row parameters, processed rows, their lists, fills, fill pairs.
    pub fn pack(&self, words: &mut Vec<u32>) -> Layout {
        words.clear();
        words.extend(self.rows.iter().flat_map(DeviceRow::words));
        let processed = words.len();
        let mut list_at = 0usize;
        for (row, p) in &self.processed {
            let bias_len = 2 * p.bias.len();
            words.extend([
                *row,
                p.slot.unwrap_or(NO_SLOT),
                p.repetition.to_bits(),
                p.frequency.to_bits(),
                p.presence.to_bits(),
                list_at as u32,
                p.bias.len() as u32,
                (list_at + bias_len) as u32,
                p.suppress.len() as u32,
            ]);
            list_at += bias_len + p.suppress.len();
        }
        let lists = words.len();
        for (_, p) in &self.processed {
            words.extend(p.bias.iter().flat_map(|&(t, b)| [t, b.to_bits()]));
            words.extend_from_slice(&p.suppress);
        }
        let fills = words.len();
        let mut pair_at = 0usize;
        for f in &self.fills {
            words.extend([f.slot, pair_at as u32, f.entries.len() as u32]);
            pair_at += f.entries.len();
        }
        let pairs = words.len();
        for f in &self.fills {
            words.extend(f.entries.iter().flat_map(|&(t, e)| [t, e]));
        }
        let gather = words.len();
        for &row in &self.host_rows {
            words.extend([row, NO_SLOT, 1f32.to_bits(), 0, 0, 0, 0, 0, 0]);
        }
        Layout {
            processed,
            lists,
            fills,
            pairs,
            gather,
        }
    }

    /// The step's launches in order: the host rows' copies (before any
    /// bias lands in place), fills, processing, the draw.
    pub fn launches(&self, layout: Layout, b: Buffers, vocab: usize, threads: u32) -> Vec<Launch> {
        let at = |words: usize| KernelArg::Ptr(b.words + 4 * words as u64);
        let v = KernelArg::U32(vocab as u32);
        let mut out = Vec::with_capacity(4);
        if !self.host_rows.is_empty() {
            out.push(Launch {
                stage: Stage::Penalize,
                cfg: gpu_kernels::launch::per_row(self.host_rows.len() as u32, threads),
                args: vec![
                    KernelArg::Ptr(b.gather),
                    KernelArg::Ptr(b.logits),
                    KernelArg::Ptr(b.counts),
                    at(layout.gather),
                    at(layout.gather),
                    v,
                ],
            });
        }
        if !self.fills.is_empty() {
            out.push(Launch {
                stage: Stage::Fill,
                cfg: gpu_kernels::launch::per_row(self.fills.len() as u32, threads),
                args: vec![
                    KernelArg::Ptr(b.counts),
                    at(layout.fills),
                    at(layout.pairs),
                    v,
                ],
            });
        }
        if !self.processed.is_empty() {
            out.push(Launch {
                stage: Stage::Penalize,
                cfg: gpu_kernels::launch::per_row(self.processed.len() as u32, threads),
                args: vec![
                    KernelArg::Ptr(b.draw),
                    KernelArg::Ptr(b.logits),
                    KernelArg::Ptr(b.counts),
                    at(layout.processed),
                    at(layout.lists),
                    v,
                ],
            });
        }
        out.push(Launch {
            stage: Stage::Sample,
            cfg: gpu_kernels::launch::per_row(self.rows.len() as u32, threads),
            args: vec![
                KernelArg::Ptr(b.out),
                KernelArg::Ptr(b.logits),
                KernelArg::Ptr(b.draw),
                KernelArg::Ptr(b.counts),
                at(0),
                v,
                KernelArg::U32(self.top_n() as u32),
            ],
        });
        out
    }

    /// Checks what the kernels rely on: one row per logits row (`rows`),
    /// processed and slot indices in range, distinct slots per step, no fill
    /// or row past [`Self::slots`]. `Err`: why not.
    pub fn check(&self, rows: usize) -> Result<(), String> {
        if self.rows.len() != rows {
            return Err(format!(
                "{} sampling rows for {rows} logits rows",
                self.rows.len()
            ));
        }
        let mut seen = vec![false; self.slots as usize];
        for (i, r) in self.rows.iter().enumerate() {
            if let Some(p) = r.processed {
                let ok = self
                    .processed
                    .get(p as usize)
                    .is_some_and(|(row, q)| *row as usize == i && q.slot == r.slot);
                if !ok {
                    return Err(format!("row {i}: processed row {p} does not name it"));
                }
            }
            if let Some(s) = r.slot {
                let first = seen
                    .get_mut(s as usize)
                    .is_some_and(|x| !std::mem::replace(x, true));
                if !first || r.processed.is_none() {
                    return Err(format!("row {i}: slot {s} out of range or used twice"));
                }
            }
        }
        if let Some(f) = self.fills.iter().find(|f| f.slot >= self.slots) {
            return Err(format!("fill of slot {} past {} slots", f.slot, self.slots));
        }
        let ascending = self.host_rows.windows(2).all(|w| w[0] < w[1]);
        let plain = self.host_rows.iter().all(|&h| {
            self.rows
                .get(h as usize)
                .is_some_and(|r| r.processed.is_none())
        });
        if !ascending || !plain {
            return Err("host rows not ascending, past the rows, or processed".into());
        }
        Ok(())
    }
}

/// Floats per output row for `n_top` top logprobs.
pub const fn out_stride(n_top: usize) -> usize {
    2 + 2 * n_top
}

/// The kernel's output (`rows x out_stride(n_top)` floats) as each row's
/// [`SampleOut`], with the top logprobs it asked for.
pub fn unpack(out: &[f32], rows: &[DeviceRow], n_top: usize) -> Vec<SampleOut> {
    out.chunks_exact(out_stride(n_top))
        .zip(rows)
        .map(|(o, r)| SampleOut {
            token: o[0] as u32,
            logprob: o[1],
            top_logprobs: o[2..]
                .chunks_exact(2)
                .take(r.logprobs)
                .filter(|p| p[0] >= 0.0)
                .map(|p| (p[0] as u32, p[1]))
                .collect(),
        })
        .collect()
}

/// Runs plain rows (no processing) on the host emulator over `logits`.
pub fn emulate_rows(logits: &Logits, rows: &[DeviceRow]) -> Vec<SampleOut> {
    let r = rows.len().min(logits.rows);
    let mut copy = Logits {
        rows: r,
        vocab: logits.vocab,
        data: logits.data[..r * logits.vocab].to_vec(),
    };
    let draws = DeviceDraws::plain(rows[..r].to_vec());
    emulate_draws(&mut copy, &draws, &mut Vec::new()).map_or_else(|_| Vec::new(), |o| o.rows)
}

/// Runs a step's draws on the host emulator, as the GPU executor does on
/// the device: `logits` is biased in place, `counts` is the count table
/// (`slots x vocab`, kept by the caller across steps; grown with zeros).
pub fn emulate_draws(
    logits: &mut Logits,
    draws: &DeviceDraws,
    counts: &mut Vec<u32>,
) -> Result<DeviceOut, String> {
    draws.check(logits.rows)?;
    if draws.rows.is_empty() {
        return Ok(DeviceOut {
            rows: Vec::new(),
            host_rows: Vec::new(),
            logits: None,
        });
    }
    let vocab = logits.vocab;
    let n_top = draws.top_n();
    let mut words = Vec::new();
    let layout = draws.pack(&mut words);
    counts.resize((draws.slots as usize * vocab).max(counts.len()), 0);
    let mut draw = vec![0f32; draws.processed.len() * vocab];
    let mut out = vec![0f32; draws.rows.len() * out_stride(n_top)];
    let mut gather = vec![0f32; draws.host_rows.len() * vocab];
    let bufs = Buffers {
        gather: gather.as_mut_ptr() as u64,
        out: out.as_mut_ptr() as u64,
        logits: logits.data.as_mut_ptr() as u64,
        draw: draw.as_mut_ptr() as u64,
        counts: counts.as_mut_ptr() as u64,
        words: words.as_ptr() as u64,
    };
    for l in draws.launches(layout, bufs, vocab, 32) {
        // SAFETY: `check` passed, so every row, processed row, host row and
        // slot the words name is inside `logits` (`rows x vocab`), `draw`
        // (`processed x vocab`), `gather` (`host_rows x vocab`) and `counts`
        // (`slots x vocab`); `words` is
        // the packed buffer the offsets index; `out` holds `rows x
        // out_stride(n_top)` with `n_top <= MAX_LOGPROBS = MAX_TOP_N`.
        unsafe { gpu_kernels::entries::emulate(l.stage.kernel(), l.cfg, &l.args) }
            .map_err(|e| format!("{}: {e:?}", l.stage.kernel()))?;
    }
    Ok(DeviceOut {
        rows: unpack(&out, &draws.rows, n_top),
        host_rows: draws.host_rows.clone(),
        logits: host_logits(&draws.host_rows, vocab, gather),
    })
}

/// The host rows' logits as downloaded (`None` when there are none).
pub fn host_logits(host_rows: &[u32], vocab: usize, data: Vec<f32>) -> Option<Logits> {
    (!host_rows.is_empty()).then_some(Logits {
        rows: host_rows.len(),
        vocab,
        data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::{sample_row, SeqContext};

    #[test]
    fn processing_is_asked_only_when_the_row_changes() {
        let d = SamplingParams::default;
        assert!(Processing::of(&d(), 0, &[2]).is_none());
        let pen = SamplingParams {
            presence_penalty: 0.5,
            ..d()
        };
        assert!(Processing::of(&pen, 3, &[2]).is_some());
        let min = SamplingParams {
            min_tokens: 4,
            ..d()
        };
        let p = Processing::of(&min, 3, &[2, 9]).expect("suppressed");
        assert_eq!(p.suppress, vec![2, 9]);
        assert!(Processing::of(&min, 4, &[2]).is_none());
        assert!(Processing::of(&min, 3, &[]).is_none());
        let bias = SamplingParams {
            logit_bias: vec![(3, -1.0)],
            ..d()
        };
        assert_eq!(
            Processing::of(&bias, 0, &[]).map(|p| p.bias),
            Some(vec![(3, -1.0)])
        );
    }

    #[test]
    fn fills_count_the_prompt_and_the_output_apart() {
        let f = Fill::from_tokens(4, &[7, 3, 7, 3, 3, 9], 3);
        assert_eq!(
            f.entries,
            vec![(3, pack_count(true, 2)), (7, pack_count(true, 0)), (9, 1)]
        );
    }

    #[test]
    fn inconsistent_draws_are_refused() {
        let row = DeviceRow::of(&SamplingParams::default(), 1, 0, 0);
        let mut d = DeviceDraws::plain(vec![row]);
        assert!(d.check(2).is_err());
        assert!(d.check(1).is_ok());
        let pen = Processing {
            slot: Some(0),
            repetition: 1.2,
            frequency: 0.0,
            presence: 0.0,
            bias: Vec::new(),
            suppress: Vec::new(),
        };
        d.push(row, Some(pen.clone()));
        // Slot 0 but a table of no slots.
        assert!(d.check(2).is_err());
        d.slots = 1;
        assert!(d.check(2).is_ok());
        // Two rows on one slot.
        d.push(row, Some(pen));
        d.slots = 2;
        assert!(d.check(3).is_err());
    }

    #[test]
    fn emulated_rows_equal_the_cpu_sampler_with_top_logprobs() {
        let vocab = 64;
        let data: Vec<f32> = (0..3 * vocab)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 9.0)
            .collect();
        let logits = Logits {
            rows: 3,
            vocab,
            data,
        };
        let params = [
            SamplingParams::default(),
            SamplingParams {
                temperature: 0.9,
                top_p: 0.8,
                logprobs: Some(5),
                ..SamplingParams::default()
            },
            SamplingParams {
                temperature: 1.2,
                top_k: Some(7),
                min_p: 0.05,
                logprobs: Some(2),
                ..SamplingParams::default()
            },
        ];
        let tokens = [1u32, 2, 3];
        let rows: Vec<DeviceRow> = params
            .iter()
            .enumerate()
            .map(|(i, p)| DeviceRow::of(p, 77 + i as u64, i, 2))
            .collect();
        let got = emulate_rows(&logits, &rows);
        assert_eq!(got.len(), 3);
        for (r, p) in params.iter().enumerate() {
            let ctx = SeqContext {
                params: p,
                tokens: &tokens,
                prompt_len: 1,
                seed: 77 + r as u64,
                seq_index: r,
                stop_ids: &[],
            };
            let want = sample_row(logits.row(r), &ctx);
            assert_eq!(got[r].token, want.token, "row {r}");
            assert!((got[r].logprob - want.logprob).abs() < 1e-5);
            assert_eq!(got[r].top_logprobs.len(), want.top_logprobs.len());
            for (g, w) in got[r].top_logprobs.iter().zip(&want.top_logprobs) {
                assert_eq!(g.0, w.0);
                assert!((g.1 - w.1).abs() < 1e-5);
            }
        }
    }
}
