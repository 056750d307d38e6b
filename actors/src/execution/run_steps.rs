//! F-5: what the execution actor knows of a durable function's run's steps: those it told the
//! body to run (their intent committed) and those the body started. A step told and never
//! started when the run ends never ran: it is recorded `not_started`, not left in doubt.

use std::collections::HashSet;
use std::sync::Arc;

use openprogram_storage::EffectId;

use crate::function::StartedSteps;

/// F-5: the External steps a run of the body was told to run (their intent committed), and
/// the ones it started. When the run ends, the rest never ran.
#[derive(Debug, Default)]
pub(crate) struct RunSteps {
    told: HashSet<EffectId>,
    started: Arc<StartedSteps>,
}

impl RunSteps {
    /// A new run, whose body marks its steps in `started`.
    pub(super) fn begin(&mut self, started: Arc<StartedSteps>) {
        self.told.clear();
        self.started = started;
    }

    /// The run was told to run the step `effect_id` (its intent is committed).
    pub(super) fn told(&mut self, effect_id: EffectId) {
        self.told.insert(effect_id);
    }

    /// The run ended: the steps it was told to run and never started.
    pub(super) fn never_started(&mut self) -> HashSet<EffectId> {
        let started = &self.started;
        let told = std::mem::take(&mut self.told);
        told.into_iter()
            .filter(|effect_id| !started.contains(*effect_id))
            .collect()
    }
}
