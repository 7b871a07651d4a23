//! Sampling where the logits are: which rows the sampling kernel
//! (`gpu_kernels::sampling::sample_rows`) can draw, the words it reads per
//! row, and its output turned back into [`SampleOut`]s. The GPU executor
//! (`executor::gpu::sample`) launches it; [`emulate_rows`] runs it on the
//! host emulator for tests.
//!
//! Device rows: temperature (0 = argmax), top-k, top-p, min-p, the seeded
//! draw and up to [`MAX_LOGPROBS`] top logprobs. Rows that keep the logits
//! path (the CPU sampler): penalties, `min_tokens` suppression, `logit_bias`,
//! grammar masks, beam search, the first draws of a forking group, and steps
//! with prompt-logprob rows.
//!
//! Invariants: for a supported row, [`emulate_rows`] and
//! [`super::sample_row`] give the same token (same definition, same Philox
//! uniforms, same scalar functions) and logprobs equal up to rounding;
//! on a GPU, rounding aside. Cost: `PARAM_WORDS` words up and `2 + 2 n`
//! floats down per row (n the step's largest `logprobs`).

use super::ops::SampleOut;
use super::params::{SamplingParams, MAX_LOGPROBS};
use crate::executor::Logits;
use gpu_kernels::sampling::PARAM_WORDS;

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
}

impl DeviceRow {
    /// The device row of a sequence with `output_len` tokens generated, or
    /// `None` when its draw needs the logits path (see the module docs;
    /// the caller checks beam search, forks, bias and grammar).
    pub fn of(p: &SamplingParams, seed: u64, seq_index: usize, output_len: usize) -> Option<Self> {
        let suppress = output_len < p.min_tokens;
        (!p.has_penalties() && !suppress).then(|| Self {
            temperature: p.temperature,
            top_p: p.top_p,
            min_p: p.min_p,
            top_k: p.top_k,
            seed,
            seq_index,
            step: output_len,
            logprobs: p.logprobs.unwrap_or(0).min(MAX_LOGPROBS),
        })
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
        ]
    }
}

/// Top logprobs the step's output rows carry: the largest any row asks for.
pub fn step_top_n(rows: &[DeviceRow]) -> usize {
    rows.iter().map(|r| r.logprobs).max().unwrap_or(0)
}

/// Appends the parameter words of `rows` to `words` (cleared first).
pub fn pack(rows: &[DeviceRow], words: &mut Vec<u32>) {
    words.clear();
    words.extend(rows.iter().flat_map(DeviceRow::words));
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

/// Runs the sampling kernel on the host emulator over `logits` (one row per
/// [`DeviceRow`]): what the GPU executor computes on the device.
pub fn emulate_rows(logits: &Logits, rows: &[DeviceRow]) -> Vec<SampleOut> {
    use gpu_kernels::sig::KernelArg;
    let r = rows.len().min(logits.rows);
    if r == 0 {
        return Vec::new();
    }
    let n_top = step_top_n(rows);
    let mut words = Vec::new();
    pack(&rows[..r], &mut words);
    let mut out = vec![0f32; r * out_stride(n_top)];
    let args = [
        KernelArg::Ptr(out.as_mut_ptr() as u64),
        KernelArg::Ptr(logits.data.as_ptr() as u64),
        KernelArg::Ptr(words.as_ptr() as u64),
        KernelArg::U32(logits.vocab as u32),
        KernelArg::U32(n_top as u32),
    ];
    let cfg = gpu_kernels::launch::per_row(r as u32, 32);
    // SAFETY: `logits.data` holds at least `r` rows of `vocab` f32, `words`
    // `r * PARAM_WORDS` u32, `out` `r * out_stride(n_top)` f32 with
    // `n_top <= MAX_LOGPROBS = MAX_TOP_N`; one block per row. The kernel
    // exists with this signature (a mismatch is an error, not UB).
    let ran = unsafe { gpu_kernels::entries::emulate("sample_rows_f32", cfg, &args) };
    if ran.is_err() {
        return Vec::new();
    }
    unpack(&out, &rows[..r], n_top)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::{sample_row, SeqContext};

    #[test]
    fn unsupported_rows_are_refused() {
        let d = SamplingParams::default;
        let pen = SamplingParams {
            presence_penalty: 0.5,
            ..d()
        };
        assert!(DeviceRow::of(&pen, 1, 0, 3).is_none());
        let min = SamplingParams {
            min_tokens: 4,
            ..d()
        };
        assert!(DeviceRow::of(&min, 1, 0, 3).is_none());
        assert!(DeviceRow::of(&min, 1, 0, 4).is_some());
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
            .map(|(i, p)| DeviceRow::of(p, 77 + i as u64, i, 2).expect("supported"))
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
