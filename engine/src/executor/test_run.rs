//! Test shorthands over [`Executor::execute`]: one method per [`Sampling`].

use super::{BlockOps, ExecError, Executor, ForwardBatch, Logits, Sampling};
use crate::sampler::device::{DeviceDraws, DeviceOut};
use crate::sampler::SampleOut;

/// `execute` by the sampling it asks for.
pub(crate) trait Run {
    /// [`Sampling::Host`]: the logits rows.
    fn logits(&mut self, ops: &BlockOps, b: &ForwardBatch) -> Result<Logits, ExecError>;
    /// [`Sampling::Greedy`]: each row's greedy draw.
    fn greedy(&mut self, ops: &BlockOps, b: &ForwardBatch) -> Result<Vec<SampleOut>, ExecError>;
    /// [`Sampling::Device`].
    fn sampled(
        &mut self,
        ops: &BlockOps,
        b: &ForwardBatch,
        draws: &DeviceDraws,
    ) -> Result<DeviceOut, ExecError>;
}

fn drawn(out: super::StepOutput) -> Result<DeviceOut, ExecError> {
    match out {
        super::StepOutput::Drawn(d) => Ok(d),
        super::StepOutput::Logits(_) => Err(ExecError::WrongAnswer("logits".into())),
    }
}

impl<E: Executor + ?Sized> Run for E {
    fn logits(&mut self, ops: &BlockOps, b: &ForwardBatch) -> Result<Logits, ExecError> {
        self.execute(ops, b, &Sampling::Host)?.into_logits()
    }

    fn greedy(&mut self, ops: &BlockOps, b: &ForwardBatch) -> Result<Vec<SampleOut>, ExecError> {
        Ok(drawn(self.execute(ops, b, &Sampling::Greedy)?)?.rows)
    }

    fn sampled(
        &mut self,
        ops: &BlockOps,
        b: &ForwardBatch,
        draws: &DeviceDraws,
    ) -> Result<DeviceOut, ExecError> {
        drawn(self.execute(ops, b, &Sampling::Device(draws.clone()))?)
    }
}
