//! `openprogram load --jobs` (J-1): what the log says of the resource queue's use.

use std::collections::{HashMap, HashSet};

use openprogram_storage::{Event, EventReader, ExecutionId, LeaseId};

use crate::Result;

/// J-1: the utilisation the log shows, committed leases only: over the time at least one
/// Job waited (from its `JobQueued` to its first `LeaseGranted`), the units its leases held
/// (`LeaseGranted` to `LeaseReleased`) over the units declared. Times are the commits'
/// (milliseconds); `None` if no Job ever waited.
pub(crate) fn committed_utilisation(
    store: &dyn EventReader,
    resources: &[(String, u32)],
) -> Result<Option<f64>> {
    let capacity: u64 = resources.iter().map(|(_, c)| u64::from(*c)).sum();
    let (mut waiting, mut in_use) = (0u64, 0u64);
    let mut leased: HashMap<LeaseId, u64> = HashMap::new();
    let mut granted_once: HashSet<ExecutionId> = Default::default();
    let (mut held_ms, mut declared_ms, mut last_ms) = (0u128, 0u128, None::<u64>);
    let mut after = 0;
    loop {
        let page = store.log_after(after, 10_000)?;
        let Some(last) = page.last() else { break };
        after = last.position;
        for envelope in &page {
            if let Some(since) = last_ms.filter(|_| waiting > 0) {
                let span = u128::from(envelope.at_ms.saturating_sub(since));
                held_ms += span * u128::from(in_use);
                declared_ms += span * u128::from(capacity);
            }
            last_ms = Some(envelope.at_ms);
            match &envelope.event {
                Event::JobQueued { .. } => waiting += 1,
                Event::LeaseGranted {
                    lease_id,
                    resources,
                    ..
                } => {
                    let units: u64 = resources.iter().map(|(_, a)| u64::from(*a)).sum();
                    leased.insert(*lease_id, units);
                    in_use += units;
                    if granted_once.insert(envelope.execution_id) {
                        waiting = waiting.saturating_sub(1);
                    }
                }
                Event::LeaseReleased { lease_id, .. } => {
                    in_use = in_use.saturating_sub(leased.remove(lease_id).unwrap_or(0));
                }
                _ => {}
            }
        }
    }
    Ok((declared_ms > 0).then(|| held_ms as f64 / declared_ms as f64))
}
