//! F-5: what the execution actor knows of a durable function's run's steps: those it told the
//! body to run (their intent committed) and those the body started. A step told and never
//! started when the run ends never ran: it is recorded `not_started` (`Machine::not_started`),
//! not left in doubt.

use std::collections::HashSet;
use std::sync::Arc;

use openprogram_storage::EffectId;

use crate::function::StartedSteps;

/// F-5: the External steps the run in flight was told to run, the ones it started, and once
/// it ended, those that never started (until their receipts are decided).
#[derive(Debug, Default)]
pub(crate) struct RunSteps {
    told: HashSet<EffectId>,
    started: Arc<StartedSteps>,
    never_started: HashSet<EffectId>,
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

    /// The run ended: the steps it was told to run and never started are kept for their
    /// receipts, and none of them starts from now on.
    pub(super) fn end(&mut self) {
        let told = std::mem::take(&mut self.told);
        self.never_started.extend(self.started.close(told));
    }

    /// Their receipts are being decided: forgotten here.
    pub(super) fn take_never_started(&mut self) -> HashSet<EffectId> {
        std::mem::take(&mut self.never_started)
    }
}
