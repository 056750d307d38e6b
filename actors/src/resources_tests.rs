//! J-1: the pure queue — all-or-nothing admission, first come first served per resource,
//! no starvation of a large request, releases by lease id only.

use std::collections::BTreeMap;

use openprogram_storage::{ExecutionId, LeaseId};

use super::*;

fn resources() -> Resources {
    Resources::new([("model".to_owned(), 4), ("gpu".to_owned(), 1)]).expect("declared")
}

fn ask(pairs: &[(&str, u32)]) -> Vec<(String, u32)> {
    pairs
        .iter()
        .map(|(name, amount)| (name.to_string(), *amount))
        .collect()
}

/// Ids in admission order (UUID v7 is ordered by time only to the millisecond).
fn jobs(count: usize) -> Vec<ExecutionId> {
    let mut ids: Vec<ExecutionId> = (0..count).map(|_| ExecutionId::new()).collect();
    ids.sort();
    ids
}

fn commit(queue: &mut Queue, offers: &[Offer]) {
    for offer in offers {
        queue.answered(offer.job_id, offer.lease_id, Some(1), false, 0);
    }
}

#[test]
fn j1_checks_what_a_job_asks_for() {
    let declared = resources();
    let asked = |pairs: &[(&str, u32)]| -> BTreeMap<String, u32> {
        pairs
            .iter()
            .map(|(name, amount)| (name.to_string(), *amount))
            .collect()
    };
    assert_eq!(
        declared.check(&asked(&[("disk", 1)])).unwrap_err().code(),
        "unknown_resource"
    );
    assert_eq!(
        declared.check(&asked(&[("gpu", 2)])).unwrap_err().code(),
        "exceeds_capacity"
    );
    assert_eq!(
        declared.check(&asked(&[])).unwrap_err().code(),
        "invalid_request"
    );
    assert_eq!(
        declared.check(&asked(&[("model", 0)])).unwrap_err().code(),
        "invalid_request"
    );
    assert_eq!(
        declared
            .check(&asked(&[("model", 4), ("gpu", 1)]))
            .expect("fits"),
        ask(&[("gpu", 1), ("model", 4)])
    );
    assert!(Resources::parse_one("model=8").is_ok());
    for bad in ["model", "model=0", "=3", "model=x", "model=-1"] {
        assert!(Resources::parse_one(bad).is_err(), "{bad}");
    }
}

#[test]
fn j1_admission_is_all_or_nothing_and_first_come_first_served() {
    let mut queue = Queue::new(resources());
    let ids = jobs(4);
    queue.enqueue(ids[0], ask(&[("model", 3)]), 0);
    queue.enqueue(ids[1], ask(&[("model", 2), ("gpu", 1)]), 0);
    queue.enqueue(ids[2], ask(&[("model", 1)]), 0);
    queue.enqueue(ids[3], ask(&[("gpu", 1)]), 0);
    let offers = queue.offers(0, LeaseId::new);
    // The first fits; the second does not (model) and holds nothing, and it keeps `model`
    // and `gpu` from the Jobs behind it: the small ones wait their turn.
    assert_eq!(
        offers.iter().map(|offer| offer.job_id).collect::<Vec<_>>(),
        vec![ids[0]]
    );
    assert_eq!(queue.position(ids[1]), Some(1));
    assert_eq!(queue.position(ids[2]), Some(2));
    assert_eq!(queue.position(ids[3]), Some(2));
    commit(&mut queue, &offers);
    assert!(
        queue.offers(0, LeaseId::new).is_empty(),
        "nothing fits the second yet"
    );
    // A release of another lease id frees nothing (J-2).
    assert!(!queue.release(ids[0], LeaseId::new()));
    assert!(queue.offers(0, LeaseId::new).is_empty());
    assert!(queue.release(ids[0], offers[0].lease_id));
    let next = queue.offers(0, LeaseId::new);
    assert_eq!(
        next.iter().map(|offer| offer.job_id).collect::<Vec<_>>(),
        vec![ids[1], ids[2]],
        "the large request first, then what still fits; gpu is taken"
    );
    let view = queue.view();
    let model = view
        .iter()
        .find(|view| view.name == "model")
        .expect("model");
    assert_eq!((model.in_use, model.capacity), (3, 4));
}

#[test]
fn j1_a_stream_of_small_requests_never_starves_a_large_one() {
    let mut queue = Queue::new(Resources::new([("model".to_owned(), 4)]).expect("declared"));
    let ids = jobs(200);
    let mut held = Vec::new();
    // Three small ones run; then a large one (4) waits; then small ones keep coming.
    for id in &ids[..3] {
        queue.enqueue(*id, ask(&[("model", 1)]), 0);
    }
    let first = queue.offers(0, LeaseId::new);
    commit(&mut queue, &first);
    held.extend(first);
    let large = ids[3];
    queue.enqueue(large, ask(&[("model", 4)]), 0);
    for id in &ids[4..] {
        queue.enqueue(*id, ask(&[("model", 1)]), 0);
        let offers = queue.offers(0, LeaseId::new);
        assert!(
            offers.iter().all(|offer| offer.job_id == large),
            "no small request passes the large one waiting ahead of it"
        );
        commit(&mut queue, &offers);
        held.extend(offers);
        if let Some(done) = held.iter().position(|offer| offer.job_id != large) {
            let offer = held.remove(done);
            assert!(queue.release(offer.job_id, offer.lease_id));
        }
        if held.iter().any(|offer| offer.job_id == large) {
            return;
        }
    }
    panic!("the large request was never admitted");
}

#[test]
fn j1_a_refused_offer_frees_its_units_and_an_unanswered_one_counts() {
    let mut queue = Queue::new(resources());
    let ids = jobs(2);
    queue.enqueue(ids[0], ask(&[("gpu", 1)]), 0);
    queue.enqueue(ids[1], ask(&[("gpu", 1)]), 0);
    let offers = queue.offers(0, LeaseId::new);
    assert_eq!(offers.len(), 1);
    assert!(
        queue.offers(0, LeaseId::new).is_empty(),
        "the offer counts until answered"
    );
    // Enqueued again while offered (a pause and a continue raced the offer): it waits again
    // once the offer is refused.
    queue.enqueue(ids[0], ask(&[("gpu", 1)]), 0);
    queue.answered(ids[0], offers[0].lease_id, None, false, 0);
    let next = queue.offers(0, LeaseId::new);
    assert_eq!(
        next.iter().map(|offer| offer.job_id).collect::<Vec<_>>(),
        vec![ids[0]]
    );
    // Dequeued while offered, then refused: it waits no more.
    queue.dequeue(ids[0]);
    queue.answered(ids[0], next[0].lease_id, None, false, 0);
    let last = queue.offers(0, LeaseId::new);
    assert_eq!(
        last.iter().map(|offer| offer.job_id).collect::<Vec<_>>(),
        vec![ids[1]]
    );
}

#[test]
fn j2_a_release_that_overtakes_its_offers_answer_frees_the_lease_once() {
    let mut queue = Queue::new(resources());
    let ids = jobs(2);
    queue.enqueue(ids[0], ask(&[("gpu", 1)]), 0);
    queue.enqueue(ids[1], ask(&[("gpu", 1)]), 0);
    let offers = queue.offers(0, LeaseId::new);
    // The Job committed the lease, ran, paused and released it before its answer arrived.
    assert!(queue.release(ids[0], offers[0].lease_id));
    queue.answered(ids[0], offers[0].lease_id, Some(1), false, 0);
    let next = queue.offers(0, LeaseId::new);
    assert_eq!(
        next.iter().map(|offer| offer.job_id).collect::<Vec<_>>(),
        vec![ids[1]]
    );
    assert_eq!(queue.view()[0].in_use, 1, "the late answer holds nothing");
}

#[test]
fn j1_a_capacity_near_the_top_of_u32_never_wraps() {
    let mut queue = Queue::new(Resources::new([("x".to_owned(), u32::MAX)]).expect("declared"));
    let ids = jobs(2);
    queue.enqueue(ids[0], ask(&[("x", u32::MAX)]), 0);
    let offers = queue.offers(0, LeaseId::new);
    commit(&mut queue, &offers);
    queue.enqueue(ids[1], ask(&[("x", 1)]), 0);
    assert!(
        queue.offers(0, LeaseId::new).is_empty(),
        "nothing is left of x"
    );
    // A Job the queue counts a held lease for is not put in line: its lease is named.
    assert_eq!(
        queue.enqueue(ids[0], ask(&[("x", 1)]), 0),
        Some(offers[0].lease_id)
    );
}
