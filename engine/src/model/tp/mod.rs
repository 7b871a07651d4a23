//! The model split for tensor parallelism: [`plan`] says which heads, FFN
//! columns and vocabulary rows each rank holds; [`shard`] hands a rank only
//! its slices of each tensor, so the one model definition (`arch/`) loads
//! a shard as it loads a whole model. The communication is
//! [`crate::dist`]'s; the model files mark where it happens
//! ([`super::backend::Backend::linear_row_parallel`]).

pub mod plan;
pub mod shard;

pub use plan::{RankShard, TpPlan};
pub use shard::ShardSource;

use crate::dist::Collective;
use std::sync::Arc;

/// What one rank's forward pass needs: the collectives and the plan.
#[derive(Clone)]
pub struct TpRank {
    pub comm: Arc<dyn Collective>,
    pub plan: Arc<TpPlan>,
}

impl TpRank {
    /// This rank's shard.
    pub fn shard(&self) -> &RankShard {
        &self.plan.ranks[self.comm.rank()]
    }
}

impl std::fmt::Debug for TpRank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TpRank")
            .field("rank", &self.comm.rank())
            .field("world", &self.comm.world())
            .field("library", &self.comm.library())
            .finish()
    }
}
