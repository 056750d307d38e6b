use openprogram::storage::{EventReader, EventStore, Store};
#[tokio::main]
async fn main() {
    let store = Store::open("/tmp/ret/d3").expect("open");
    let t = std::time::Instant::now();
    println!(
        "unfinished: {} in {:?}",
        store.purges_unfinished().unwrap().len(),
        t.elapsed()
    );
    let ended = store.ended_before(u64::MAX, 5).expect("ended");
    println!("ended: {:?}", ended);
    for (at, id) in ended {
        println!(
            "{at} {id} head={:?}",
            store
                .head(id)
                .unwrap()
                .map(|h| (h.state, h.last_activity_ms))
        );
        println!(
            "purge -> {:?}",
            store.purge(id, Some(at), Some(u64::MAX)).await
        );
    }
    println!("sessions: {:?}", store.sessions().unwrap());
}
