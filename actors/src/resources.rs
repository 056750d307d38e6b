//! J-1: the resource queue, pure — no actix, no clock, no store. Named resources with
//! capacities; Jobs waiting in admission order (their ids are UUID v7); leases offered,
//! held and released.
//!
//! Admission is all or nothing: a Job is offered every amount it asks for at once, or
//! nothing, so no Job ever holds part of what it needs (no deadlock). Each resource serves
//! its Jobs first come, first served: a Job that cannot be leased yet keeps every resource it
//! asks for from the Jobs behind it, so a stream of small requests never starves a large
//! one (the Jobs behind it that ask for none of those resources go on).
//!
//! Invariant: `in_use` counts every lease held and every lease offered and not yet answered,
//! and never exceeds a capacity. An offer counts before its Job commits it and a lease
//! stops counting only once its release is committed, so the committed leases never exceed
//! what this counts (the queue actor, `resource_queue.rs`, keeps that order).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use openprogram_storage::{ExecutionId, LeaseId};

use crate::error::{Error, Result};

/// The resources a runtime declares, with their capacities.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resources {
    capacity: BTreeMap<String, u32>,
}

impl Resources {
    /// Declares `(name, capacity)` pairs; a name twice or a capacity of 0 is refused.
    pub fn new(declared: impl IntoIterator<Item = (String, u32)>) -> Result<Self> {
        let mut capacity = BTreeMap::new();
        for (name, amount) in declared {
            if name.is_empty() || amount == 0 {
                return Err(Error::InvalidRequest(format!(
                    "resource `{name}={amount}`: a resource needs a name and a capacity of at least 1"
                )));
            }
            if capacity.insert(name.clone(), amount).is_some() {
                return Err(Error::InvalidRequest(format!(
                    "resource `{name}` is declared twice"
                )));
            }
        }
        Ok(Self { capacity })
    }

    /// Parses `NAME=CAPACITY` (the `--resource` flag).
    pub fn parse_one(text: &str) -> Result<(String, u32)> {
        let invalid = || {
            Error::InvalidRequest(format!(
                "`{text}` is not NAME=CAPACITY (a name and a whole number of at least 1)"
            ))
        };
        let (name, capacity) = text.split_once('=').ok_or_else(invalid)?;
        let capacity: u32 = capacity.trim().parse().map_err(|_| invalid())?;
        if name.trim().is_empty() || capacity == 0 {
            return Err(invalid());
        }
        Ok((name.trim().to_owned(), capacity))
    }

    pub fn is_empty(&self) -> bool {
        self.capacity.is_empty()
    }

    pub fn capacity(&self, name: &str) -> Option<u32> {
        self.capacity.get(name).copied()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, u32)> {
        self.capacity
            .iter()
            .map(|(name, capacity)| (name.as_str(), *capacity))
    }

    /// What a Job may ask for: at least one resource, each declared, each amount between 1
    /// and its capacity. In name order.
    pub fn check(&self, asked: &BTreeMap<String, u32>) -> Result<Vec<(String, u32)>> {
        if asked.is_empty() {
            return Err(Error::InvalidRequest(
                "a Job asks for at least one resource".into(),
            ));
        }
        let mut checked = Vec::with_capacity(asked.len());
        for (name, amount) in asked {
            let capacity = self
                .capacity(name)
                .ok_or_else(|| Error::UnknownResource(name.clone()))?;
            if *amount == 0 {
                return Err(Error::InvalidRequest(format!(
                    "a Job asks for at least 1 of `{name}`"
                )));
            }
            if *amount > capacity {
                return Err(Error::ExceedsCapacity {
                    resource: name.clone(),
                    amount: *amount,
                    capacity,
                });
            }
            checked.push((name.clone(), *amount));
        }
        Ok(checked)
    }
}

/// A lease the queue counts: offered (`epoch` none yet) or held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub lease_id: LeaseId,
    pub job_id: ExecutionId,
    /// The attempt holding it, once the Job committed it.
    pub epoch: Option<u64>,
    pub resources: Vec<(String, u32)>,
}

/// A lease offered to a Job: it takes it by committing it (`LeaseGranted`) or refuses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offer {
    pub job_id: ExecutionId,
    pub lease_id: LeaseId,
    pub resources: Vec<(String, u32)>,
    /// How long it waited in the queue, in the clock's unit.
    pub waited: u64,
}

#[derive(Debug, Clone)]
struct Waiting {
    resources: Vec<(String, u32)>,
    since: u64,
}

/// One resource as the queue sees it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceView {
    pub name: String,
    pub capacity: u32,
    pub in_use: u32,
    /// Jobs waiting that ask for it.
    pub queued: usize,
    /// Every lease of it, offered or held, by job id.
    pub leases: Vec<(Lease, u32)>,
    /// The Jobs waiting for it, in the order they are served.
    pub waiting: Vec<ExecutionId>,
}

/// The queue's state.
#[derive(Debug, Clone, Default)]
pub struct Queue {
    resources: Resources,
    in_use: BTreeMap<String, u32>,
    waiting: BTreeMap<ExecutionId, Waiting>,
    /// Leases offered or held, by job.
    leases: HashMap<ExecutionId, Lease>,
    /// Jobs that asked to wait again while their offer was unanswered.
    requeue: BTreeSet<ExecutionId>,
}

impl Queue {
    pub fn new(resources: Resources) -> Self {
        Self {
            resources,
            ..Self::default()
        }
    }

    pub fn resources(&self) -> &Resources {
        &self.resources
    }

    /// A Job waits for its resources from `now` (in the clock's unit). Nothing changes for
    /// one that waits already; one whose offer is unanswered waits again if that offer is
    /// refused. One the queue counts a held lease for is refused: its lease is returned, for
    /// the caller to check against the store (a release the queue was never told of).
    pub fn enqueue(
        &mut self,
        job_id: ExecutionId,
        resources: Vec<(String, u32)>,
        now: u64,
    ) -> Option<LeaseId> {
        if let Some(lease) = self.leases.get(&job_id) {
            if lease.epoch.is_some() {
                return Some(lease.lease_id);
            }
            self.requeue.insert(job_id);
            return None;
        }
        self.waiting.entry(job_id).or_insert(Waiting {
            resources,
            since: now,
        });
        None
    }

    /// A Job left the queue (paused, cancelled, expired): it waits no more.
    pub fn dequeue(&mut self, job_id: ExecutionId) -> bool {
        self.requeue.remove(&job_id);
        self.waiting.remove(&job_id).is_some()
    }

    pub fn is_waiting(&self, job_id: ExecutionId) -> bool {
        self.waiting.contains_key(&job_id)
    }

    /// A lease found held at startup (its Job's record).
    pub fn held(&mut self, lease: Lease) {
        self.count(&lease.resources, true);
        self.waiting.remove(&lease.job_id);
        self.leases.insert(lease.job_id, lease);
    }

    /// J-2: the release of `lease_id`, committed by its Job, frees it — only that lease:
    /// a release of an older lease of the same Job frees nothing. (Its answer to the offer
    /// may still be on its way: a Job releases only a lease it committed.)
    pub fn release(&mut self, job_id: ExecutionId, lease_id: LeaseId) -> bool {
        match self.leases.get(&job_id) {
            Some(lease) if lease.lease_id == lease_id => {
                let lease = self.leases.remove(&job_id).expect("found above");
                self.count(&lease.resources, false);
                true
            }
            _ => false,
        }
    }

    /// The Job answered `lease_id`: committed by its attempt of `epoch`, or refused (it is
    /// counted no more; the Job waits again if it asked to meanwhile, or `still_waits`).
    pub fn answered(
        &mut self,
        job_id: ExecutionId,
        lease_id: LeaseId,
        epoch: Option<u64>,
        still_waits: bool,
        now: u64,
    ) {
        let Some(lease) = self
            .leases
            .get_mut(&job_id)
            .filter(|lease| lease.lease_id == lease_id && lease.epoch.is_none())
        else {
            return;
        };
        if epoch.is_some() {
            lease.epoch = epoch;
            self.requeue.remove(&job_id);
            return;
        }
        let lease = self.leases.remove(&job_id).expect("found above");
        self.count(&lease.resources, false);
        if self.requeue.remove(&job_id) || still_waits {
            // It holds no lease now: this always waits.
            let _ = self.enqueue(job_id, lease.resources, now);
        }
    }

    /// The leases to offer now, counted from here on: every waiting Job, in order, whose
    /// amounts all fit and whose resources no Job ahead of it still waits for. `fresh`
    /// makes lease ids.
    pub fn offers(&mut self, now: u64, mut fresh: impl FnMut() -> LeaseId) -> Vec<Offer> {
        let mut offers = Vec::new();
        let mut blocked: BTreeSet<&str> = BTreeSet::new();
        let all = self.resources.capacity.len();
        let mut taken = Vec::new();
        // A known defect a harness must catch (`OP_PLANTED_BUG=overcommit_lease`).
        let planted = u32::from(openprogram_storage::planted::planted(
            openprogram_storage::planted::Bug::OvercommitLease,
        ));
        for (job_id, waiting) in &self.waiting {
            if blocked.len() == all {
                break;
            }
            let behind = waiting
                .resources
                .iter()
                .any(|(name, _)| blocked.contains(name.as_str()));
            // In u64: a capacity near u32::MAX must not wrap.
            let fits = waiting.resources.iter().all(|(name, amount)| {
                let capacity = u64::from(self.resources.capacity(name).unwrap_or(0));
                let used = u64::from(self.in_use.get(name).copied().unwrap_or(0));
                used + u64::from(*amount) <= capacity + u64::from(planted)
            });
            if behind || !fits {
                blocked.extend(waiting.resources.iter().map(|(name, _)| name.as_str()));
                continue;
            }
            for (name, amount) in &waiting.resources {
                let used = self.in_use.entry(name.clone()).or_insert(0);
                *used = used.saturating_add(*amount);
            }
            taken.push(*job_id);
            offers.push(Offer {
                job_id: *job_id,
                lease_id: fresh(),
                resources: waiting.resources.clone(),
                waited: now.saturating_sub(waiting.since),
            });
        }
        for (job_id, offer) in taken.into_iter().zip(&offers) {
            self.waiting.remove(&job_id);
            self.leases.insert(
                job_id,
                Lease {
                    lease_id: offer.lease_id,
                    job_id,
                    epoch: None,
                    resources: offer.resources.clone(),
                },
            );
        }
        offers
    }

    /// J-1: the place of a waiting Job: 1 + the Jobs ahead of it that ask for any resource
    /// it asks for.
    pub fn position(&self, job_id: ExecutionId) -> Option<usize> {
        let mine = self.waiting.get(&job_id)?;
        let ahead = self
            .waiting
            .range(..job_id)
            .filter(|(_, other)| {
                other
                    .resources
                    .iter()
                    .any(|(name, _)| amount(&mine.resources, name).is_some())
            })
            .count();
        Some(ahead + 1)
    }

    pub fn waiting_len(&self) -> usize {
        self.waiting.len()
    }

    /// Units in use over units declared, summed over every resource.
    pub fn in_use_total(&self) -> (u64, u64) {
        let used = self.in_use.values().map(|used| u64::from(*used)).sum();
        let capacity = self.resources.iter().map(|(_, c)| u64::from(c)).sum();
        (used, capacity)
    }

    /// Every resource now.
    pub fn view(&self) -> Vec<ResourceView> {
        self.resources
            .iter()
            .map(|(name, capacity)| {
                let mut leases: Vec<(Lease, u32)> = self
                    .leases
                    .values()
                    .filter_map(|lease| Some((lease.clone(), amount(&lease.resources, name)?)))
                    .collect();
                leases.sort_by_key(|(lease, _)| lease.job_id);
                let waiting: Vec<ExecutionId> = self
                    .waiting
                    .iter()
                    .filter(|(_, waiting)| amount(&waiting.resources, name).is_some())
                    .map(|(job_id, _)| *job_id)
                    .collect();
                ResourceView {
                    name: name.to_owned(),
                    capacity,
                    in_use: self.in_use.get(name).copied().unwrap_or(0),
                    queued: waiting.len(),
                    leases,
                    waiting,
                }
            })
            .collect()
    }

    fn count(&mut self, resources: &[(String, u32)], add: bool) {
        for (name, amount) in resources {
            let used = self.in_use.entry(name.clone()).or_insert(0);
            *used = if add {
                used.saturating_add(*amount)
            } else {
                used.saturating_sub(*amount)
            };
        }
    }
}

/// How much of `name` `resources` asks for, if any.
fn amount(resources: &[(String, u32)], name: &str) -> Option<u32> {
    resources
        .iter()
        .find(|(own, _)| own == name)
        .map(|(_, amount)| *amount)
}

#[cfg(test)]
#[path = "resources_tests.rs"]
mod tests;
