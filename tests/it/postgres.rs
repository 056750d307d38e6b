//! The runtime on the PostgreSQL store (N-1), where the backend matters: startup recovery
//! after a crash (R-2, R-4, R-5, E-4, E-8), an orderly restart, and the R02 kill -9 loop
//! of real `serve --store postgres://…` processes. Each runs the body of the sled test of
//! the same name on a fresh database of the throwaway cluster (`pg_cluster`); they report
//! themselves ignored under plain `cargo test` (PostgreSQL may be missing) and `.ci/run`
//! installs PostgreSQL and runs them.

use crate::support::Restarts;

/// Each test, on PostgreSQL: `name` runs `body(Restarts::on_postgres())`.
macro_rules! on_postgres {
    ($($name:ident => $body:path),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            #[ignore = "needs PostgreSQL (apt-get install postgresql); run with \
                        `cargo test --workspace -- --include-ignored`"]
            async fn $name() {
                $body(Restarts::on_postgres()).await
            }
        )*
    };
}

on_postgres!(
    n1_r2_a_restart_inside_the_window_continues_with_the_original_ids =>
        crate::restart_window::r2_a_restart_inside_the_window_continues_with_the_original_ids_and_e6_adds_no_text_on,
    n1_r2_a_restart_beyond_the_window_expires_and_keeps_everything =>
        crate::restart_window::r2_a_restart_beyond_the_window_expires_and_r6_keeps_everything_for_a_manual_continue_on,
    n1_k7_recovery_applies_each_executions_own_window =>
        crate::k7_restart_window::k7_recovery_applies_each_executions_own_window_on,
    n1_r4_a_user_pause_stays_paused =>
        crate::restart_window::r4_a_user_pause_stays_paused_on,
    n1_r4_an_abandoned_cancellation_ends_cancelled =>
        crate::restart_window::r4_an_abandoned_cancellation_ends_cancelled_and_runs_nothing_more_on,
    n1_r5_an_interrupted_model_request_is_regenerated_and_committed_tools_are_skipped =>
        crate::resume::r5_an_interrupted_model_request_is_regenerated_and_committed_tools_are_skipped_on,
    n1_r7_orderly_shutdown_pauses_and_the_next_start_resumes =>
        crate::resume::r7_orderly_shutdown_pauses_running_executions_and_the_next_start_resumes_them_on,
    n1_e4_an_external_effect_left_in_flight_becomes_unknown =>
        crate::recovery::e4_an_external_effect_left_in_flight_becomes_unknown_and_never_runs_again_on,
    n1_e8_a_branch_read_after_a_restart_is_the_one_cached_before_it =>
        crate::context::e8_a_branch_read_after_a_restart_is_the_one_cached_before_it_on,
);

/// R02 on PostgreSQL: `serve --store postgres://…` killed with SIGKILL at random moments
/// (seed printed; `OP_KILL_SEED` replays it, `OP_KILL_CYCLES` sizes it), started again each
/// time; every effect is delivered exactly once, with the original ids, and every execution
/// completes.
#[test]
#[ignore = "needs PostgreSQL (apt-get install postgresql); run with \
            `cargo test --workspace -- --include-ignored`"]
fn n1_r02_kill9_loop_on_postgres_delivers_every_effect_exactly_once() {
    crate::kill9::r02_on(Some(crate::pg_cluster::database()));
}

/// N-2, N-3: three nodes on one database, 300 executions admitted across them, a random
/// node killed with SIGKILL and started again every 0.5–3 s (seed printed; `OP_KILL_SEED`
/// replays it, `OP_CLUSTER_FAULTS` sets the number of kills, 10 by default, 100 in README's
/// run): every effect delivered exactly once, every execution completed with its ids, the
/// survivors took executions over.
#[test]
#[ignore = "needs PostgreSQL (apt-get install postgresql); run with \
            `cargo test --workspace -- --include-ignored`"]
fn n2_three_nodes_killed_at_random_deliver_every_effect_exactly_once() {
    cluster(openprogram::soak::cluster_loop::Fault::Kill);
}

/// N-3, R06 across nodes: the same with SIGSTOP instead of SIGKILL — a node stopped for two
/// leases, then continued. Its executions are taken over while it sleeps; its effects in
/// flight land before the survivor's reconciliation looks or are refused by the sink's
/// fence (`append_file`), never both; it finds its lease lost and exits, and is started
/// again.
#[test]
#[ignore = "needs PostgreSQL (apt-get install postgresql); run with \
            `cargo test --workspace -- --include-ignored`"]
fn n3_r06_three_nodes_stopped_past_their_lease_deliver_every_effect_exactly_once() {
    cluster(openprogram::soak::cluster_loop::Fault::Stop);
}

fn cluster(fault: openprogram::soak::cluster_loop::Fault) {
    let seed = crate::kill9::env_or("OP_KILL_SEED", rand::random::<u64>());
    let faults = crate::kill9::env_or("OP_CLUSTER_FAULTS", 10);
    eprintln!("n2 {fault:?}: OP_KILL_SEED={seed} OP_CLUSTER_FAULTS={faults}");
    let options = openprogram::soak::cluster_loop::options(
        env!("CARGO_BIN_EXE_openprogram").into(),
        crate::pg_cluster::database(),
        seed,
        fault,
        faults,
    );
    let report = openprogram::soak::cluster_loop::run(&options, |_| {}).expect("the harness");
    eprintln!("n2: {}", serde_json::to_string(&report).expect("json"));
    assert_eq!(report.tally.duplicates, 0, "I1: {report:#?}");
    assert_eq!(report.tally.lost, 0, "I8: {report:#?}");
    assert_eq!(
        report.tally.deliveries,
        report.executions * report.steps,
        "{report:#?}"
    );
    // The violations last: a long report is cut in the middle by CI's log.
    assert_eq!(
        report.unfinished, 0,
        "L1: {report:#?}\nviolations: {:#?}",
        report.violations
    );
    assert_eq!(report.quarantined, 0, "{report:#?}");
    assert!(report.violations.is_empty(), "I3, I4, I7: {report:#?}");
    assert!(
        report.takeovers > 0,
        "no survivor took an execution over: {report:#?}"
    );
}

/// N-2's local cluster in one command: `openprogram cluster --nodes 3` starts a throwaway
/// PostgreSQL and three nodes, says where they are (one JSON line), runs an execution
/// admitted on one node and read on another, lists three live nodes, and on SIGTERM stops
/// the nodes and the database and removes its directory. Where this machine lets it (root,
/// cgroup v1 `cpu`), each node runs capped (`--cpu-per-node 0.5`, N-4's bench): in a group
/// of its own with that quota, removed when the node stops.
#[test]
#[ignore = "needs PostgreSQL (apt-get install postgresql); run with \
            `cargo test --workspace -- --include-ignored`"]
fn n2_openprogram_cluster_runs_three_nodes_on_a_throwaway_database() {
    use std::io::BufRead as _;
    // Fails with the reason when PostgreSQL is missing, as every test of this file does.
    crate::pg_cluster::database();
    let dir = tempfile::tempdir().expect("temp dir");
    let cluster_dir = dir.path().join("cluster");
    let cgroups = std::path::Path::new("/sys/fs/cgroup/cpu");
    let capped = std::fs::OpenOptions::new()
        .write(true)
        .open(cgroups.join("cpu.cfs_period_us"))
        .is_ok();
    if !capped {
        eprintln!(
            "N-4's CPU cap not checked: /sys/fs/cgroup/cpu is not writable here (root, cgroup v1)"
        );
    }
    let cap: &[&str] = if capped {
        &["--cpu-per-node", "0.5"]
    } else {
        &[]
    };
    let mut cluster = std::process::Command::new(env!("CARGO_BIN_EXE_openprogram"))
        .args([
            "cluster",
            "--nodes",
            "3",
            "--token",
            "cluster-token",
            "--dir",
        ])
        .arg(&cluster_dir)
        .args(cap)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .expect("spawn cluster");
    // A failed assertion stops the cluster (SIGTERM: its nodes and database go too).
    struct StopOnPanic(u32);
    impl Drop for StopOnPanic {
        fn drop(&mut self) {
            if std::thread::panicking() {
                let _ = std::process::Command::new("kill")
                    .args(["-TERM", &self.0.to_string()])
                    .status();
            }
        }
    }
    let _stop = StopOnPanic(cluster.id());
    let mut line = String::new();
    let stdout = cluster.stdout.take().expect("stdout");
    std::io::BufReader::new(stdout)
        .read_line(&mut line)
        .expect("the cluster's line");
    let described: serde_json::Value = serde_json::from_str(&line).expect("one JSON line");
    let urls: Vec<String> = described["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|node| node["url"].as_str().expect("url").to_owned())
        .collect();
    assert_eq!(urls.len(), 3, "{described}");
    let groups: Vec<_> = (1..=3)
        .map(|index| cgroups.join(format!("openprogram-{}-n{index}", cluster.id())))
        .collect();
    if capped {
        for (group, node) in groups
            .iter()
            .zip(described["nodes"].as_array().expect("nodes"))
        {
            let read = |file: &str| std::fs::read_to_string(group.join(file)).expect(file);
            assert_eq!(
                read("cpu.cfs_quota_us").trim(),
                "50000",
                "{}",
                group.display()
            );
            let pid = node["pid"].as_u64().expect("pid").to_string();
            assert!(
                read("cgroup.procs").lines().any(|line| line == pid),
                "{pid} not capped"
            );
        }
    }
    assert!(described["store"]
        .as_str()
        .is_some_and(|store| store.starts_with("postgres://")));
    let call = |url: &str, method: &str, path: &str, body: Option<serde_json::Value>| {
        crate::http::call_raw(
            url,
            method,
            path,
            Some("cluster-token"),
            body.map(|b| b.to_string()),
        )
    };
    let (status, session) = call(
        &urls[0],
        "POST",
        "/v1/sessions",
        Some(serde_json::json!({})),
    );
    assert_eq!(status, 201, "{session}");
    let session = session["session_id"].as_str().expect("session").to_owned();
    let body = serde_json::json!({
        "kind": "agent",
        "message": "hello",
        "script": [{"tool": "echo", "args": {"text": "x"}}, {"reply": "done"}],
    });
    let (status, started) = call(
        &urls[1],
        "POST",
        &format!("/v1/sessions/{session}/executions"),
        Some(body),
    );
    assert_eq!(status, 201, "{started}");
    let execution = started["execution_id"].as_str().expect("id").to_owned();
    let path = format!("/v1/sessions/{session}/executions/{execution}");
    let deadline = std::time::Instant::now() + crate::support::DEADLINE;
    loop {
        let (status, read) = call(&urls[2], "GET", &path, None);
        assert_eq!(status, 200, "{read}");
        if read["state"] == "completed" {
            assert_eq!(read["text"], "done", "{read}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never completed: {read}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let (status, nodes) = call(&urls[0], "GET", "/debug/nodes", None);
    assert_eq!(status, 200, "{nodes}");
    let live = nodes["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter(|node| node["live"] == true)
        .count();
    assert_eq!(live, 3, "{nodes}");

    let status = std::process::Command::new("kill")
        .args(["-TERM", &cluster.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let exit = cluster.wait().expect("the cluster ends");
    assert!(exit.success(), "{exit}");
    for group in &groups {
        assert!(!group.exists(), "{} left behind", group.display());
    }
    for url in &urls {
        let answered = crate::http::try_call_raw(url, "GET", "/health", None, None);
        assert!(
            answered.is_err(),
            "{url} still answers after the cluster stopped"
        );
    }
    assert!(
        !cluster_dir
            .join("postgres")
            .join("data")
            .join("postmaster.pid")
            .exists(),
        "the database still runs"
    );
}

/// N-2 with R-7: a node keeps renewing its lease through an orderly shutdown — its pauses
/// are its own writes, which a survivor taking over meanwhile would fence. The shutdown
/// here outlasts several leases (a call in flight finishes before its execution pauses).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL (apt-get install postgresql); run with \
            `cargo test --workspace -- --include-ignored`"]
async fn n2_a_node_keeps_its_lease_through_an_orderly_shutdown() {
    use std::time::{Duration, Instant};
    let ttl = Duration::from_millis(300);
    let restarts = Restarts::on_postgres();
    let runtime = restarts.open_with(|builder| {
        builder
            .node("n1", "http://127.0.0.1:9")
            .lease_ttl(ttl)
            .shutdown_timeout(Duration::from_secs(30))
            .tool(std::sync::Arc::new(Hold(Duration::from_secs(2))))
    });
    let hold = serde_json::json!({"tool": "hold", "args": {}});
    let started = restarts.start(&runtime, vec![hold, crate::support::reply("done")]);
    let execution = started.await.execution_id;
    // The call is in flight once its dispatch is recorded.
    restarts
        .wait_events(&runtime, execution, "the call's dispatch", 1, |event| {
            matches!(event, openprogram::storage::Event::ToolDispatched { .. })
        })
        .await;
    let started = Instant::now();
    let shutdown = runtime.shutdown();
    tokio::pin!(shutdown);
    let mut looked = 0;
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tokio::time::sleep(ttl / 3) => {
                let nodes = runtime.nodes().expect("nodes");
                let this = nodes.nodes.iter().find(|node| node.this_node).expect("this node");
                assert!(
                    this.live,
                    "the lease lapsed {} ms into the shutdown: {nodes:?}",
                    started.elapsed().as_millis()
                );
                looked += 1;
            }
        }
    }
    // Otherwise the test proved nothing: the shutdown outlasted several leases.
    assert!(started.elapsed() > ttl * 3, "{:?}", started.elapsed());
    assert!(looked >= 9, "{looked}");
}

/// N-2, C-2: a turn waiting for its session on a node of a shared store looks at the session
/// again each lease; it writes nothing while it waits, so no fence stops it. Once another
/// node moved its execution (here a Cancel applied there), the actor on the first node stops
/// instead of looking for ever, and that node's reads show the execution as it is, not the
/// actor's old view.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL (apt-get install postgresql); run with \
            `cargo test --workspace -- --include-ignored`"]
async fn n2_a_turn_waiting_for_its_session_stops_once_another_node_moved_it() {
    use std::time::Duration;
    let ttl = Duration::from_millis(300);
    let restarts = Restarts::on_postgres();
    let open = |node: &str| {
        restarts.open_with(|builder| {
            builder
                .node(node, "http://127.0.0.1:9")
                .lease_ttl(ttl)
                .tool(std::sync::Arc::new(Hold(Duration::from_secs(60))))
        })
    };
    let first = open("n1");
    let hold = serde_json::json!({"tool": "hold", "args": {}});
    let holder = restarts.start(&first, vec![hold, crate::support::reply("held")]);
    let holder = holder.await.execution_id;
    restarts.wait_state(&first, holder, "running").await;
    let second_turn = vec![crate::support::reply("second")];
    let queued = restarts.start(&first, second_turn).await.execution_id;
    restarts.wait_state(&first, queued, "queued").await;
    // It has looked at its session (and will again each lease) on the first node.
    tokio::time::sleep(ttl * 2).await;

    let other = open("n2");
    let cancel = crate::support::command_of(serde_json::json!({"kind": "cancel"}));
    let reply = other
        .command(restarts.session, queued, cancel)
        .await
        .expect("cancel on the other node");
    assert_eq!(reply.status, "applied", "{reply:?}");
    // Without the stop, the first node's actor kept answering `queued` for ever.
    restarts.wait_state(&first, queued, "cancelled").await;
    other.halt();
    first.halt();
}

/// An External call that takes its time: recorded as dispatched before it runs, so a test
/// knows it is in flight.
struct Hold(std::time::Duration);

impl openprogram::agent::Tool for Hold {
    fn name(&self) -> &str {
        "hold"
    }
    fn recovery(&self) -> openprogram::actors::machine::Recovery {
        openprogram::actors::machine::Recovery::External
    }
    fn call(
        &self,
        _call: openprogram::agent::ToolCall,
    ) -> futures::future::BoxFuture<'static, openprogram::agent::ToolResult> {
        let hold = self.0;
        Box::pin(async move {
            tokio::time::sleep(hold).await;
            Ok("held".to_owned())
        })
    }
}

/// N-1, I-4: `openprogram load --store postgres://…` runs the load on a database (the node's
/// mark in a temporary directory of its own) and reports every step.
#[test]
#[ignore = "needs PostgreSQL (apt-get install postgresql); run with \
            `cargo test --workspace -- --include-ignored`"]
fn n1_load_runs_on_a_database() {
    let url = crate::pg_cluster::database();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_openprogram"))
        .args([
            "load",
            "--store",
            &url,
            "--executions",
            "20",
            "--steps",
            "3",
        ])
        .args(["--concurrency", "10", "--json"])
        .output()
        .expect("run load");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let report: serde_json::Value =
        serde_json::from_str(stdout.lines().last().expect("one JSON line")).expect("JSON");
    assert_eq!(report["total_steps"], 60, "{report}");
    assert_eq!(report["completed"], 20, "{report}");
}
