//! R03 (RELIABILITY.md): acknowledgement strictly after fsync, which kill -9 cannot check
//! (the page cache survives a process kill). `openprogram serve` runs under `strace -f`; a
//! client sends admissions and commands one at a time, each one group commit; in the trace,
//! between the read of each request and the write of its 2xx response, the journal is
//! fdatasync'd exactly once: one device wait per acknowledged group (sled's own files are
//! synced in the background, off that path; so are the zeros the journal's own thread writes
//! ahead of its frames, whose fdatasyncs no group waits for). The negative control runs the
//! same under `eatmydata` (fsync made a no-op): the check must fail there, or it proves
//! nothing.

use std::collections::{HashMap, HashSet};
use std::io::BufRead;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::http::call_raw;
use crate::support::DEADLINE;

const TOKEN: &str = "r03-admin-token";
/// Durable requests the client sends (half admissions, half commands).
const REQUESTS: usize = 12;

/// The trace of a run, and the ids of the threads that write zeros ahead of the journal.
struct Trace {
    text: String,
    zeroing: HashSet<String>,
}

/// Runs `serve` under strace (optionally through `eatmydata`), sends the requests, stops it
/// by pid, and returns the trace.
fn traced_run(data: &Path, trace: &Path, eat_my_data: bool) -> Trace {
    let mut command = Command::new("strace");
    command
        .args(["-f", "-y", "-qq", "-s", "512", "-o"])
        .arg(trace)
        .args([
            "-e",
            "trace=fdatasync,fsync,read,recvfrom,write,writev,sendto,sendmsg",
        ]);
    if eat_my_data {
        command.arg("eatmydata");
    }
    let mut strace = command
        .arg(env!("CARGO_BIN_EXE_openprogram"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--token",
            TOKEN,
            "--data",
        ])
        .arg(data)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn strace (needs strace: apt-get install strace)");
    let mut url = String::new();
    std::io::BufReader::new(strace.stdout.take().expect("stdout"))
        .read_line(&mut url)
        .expect("the listen URL");
    // The traced server's pid is the first in the trace (it has written by now).
    let server_pid = std::fs::read_to_string(trace)
        .expect("trace")
        .lines()
        .find_map(|line| line.split_whitespace().next().map(str::to_owned))
        .expect("a traced line");
    let mut traced = Traced {
        strace: Some(strace),
        server_pid,
    };
    let url = url.trim().to_owned();
    assert!(url.starts_with("http://"), "{url:?}");
    let (_, session) = call_raw(&url, "POST", "/v1/sessions", Some(TOKEN), None);
    let session = session["session_id"].as_str().expect("id").to_owned();
    for _ in 0..REQUESTS / 2 {
        let path = format!("/v1/sessions/{session}/executions");
        let body = json!({"message": "m", "start_paused": true, "script": [{"reply": "ok"}]});
        let (status, started) = call_raw(&url, "POST", &path, Some(TOKEN), Some(body.to_string()));
        assert_eq!(status, 201, "{started}");
        let execution = started["execution_id"].as_str().expect("id");
        let body = json!({"command_id": openprogram::storage::CommandId::new(), "kind": "steer", "text": "s"});
        let path = format!("{path}/{execution}/commands");
        let (status, reply) = call_raw(&url, "POST", &path, Some(TOKEN), Some(body.to_string()));
        assert_eq!(status, 202, "{reply}");
    }
    let zeroing = threads_named(&traced.server_pid, "openprogram-zero");
    assert!(!zeroing.is_empty(), "the journal's zeroing thread runs");
    traced.stop();
    let text = std::fs::read_to_string(trace).expect("trace");
    Trace { text, zeroing }
}

/// The ids of a process's threads of that name (the kernel keeps its first 15 bytes).
fn threads_named(pid: &str, name: &str) -> HashSet<String> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the server's threads");
    let kept = &name[..name.len().min(15)];
    let named = |task: &std::fs::DirEntry| {
        std::fs::read_to_string(task.path().join("comm")).is_ok_and(|comm| comm.trim() == kept)
    };
    let tasks = tasks.filter_map(Result::ok).filter(named);
    tasks
        .map(|task| task.file_name().to_string_lossy().into_owned())
        .collect()
}

/// strace and the server it traces, both started by this test: the server is stopped by
/// its pid (SIGTERM, SIGKILL past the deadline or on drop), then strace is reaped.
struct Traced {
    strace: Option<std::process::Child>,
    server_pid: String,
}

impl Traced {
    fn stop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.server_pid])
            .status();
        let deadline = Instant::now() + DEADLINE;
        if let Some(strace) = self.strace.as_mut() {
            while strace.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        self.end();
    }

    fn end(&mut self) {
        if let Some(mut strace) = self.strace.take() {
            if strace.try_wait().ok().flatten().is_none() {
                let _ = Command::new("kill")
                    .args(["-KILL", &self.server_pid])
                    .status();
                let _ = strace.kill();
            }
            let _ = strace.wait();
        }
    }
}

impl Drop for Traced {
    fn drop(&mut self) {
        self.end();
    }
}

/// How many durable responses followed exactly one fdatasync of the journal since their
/// request was read, and how many did not (the zeroing threads' fdatasyncs not counted).
fn acks_after_fsync(trace: &Trace) -> (usize, usize) {
    // A syscall cut by another thread's is "<unfinished ...>", completed in a later
    // "<... NAME resumed>" line of the same pid: its name and file are in the first part,
    // the data it read is in the second, so the two are read as one line.
    let mut unfinished: HashMap<&str, &str> = HashMap::new();
    let mut joined = String::new();
    let (mut covered, mut uncovered) = (0, 0);
    let (mut pending, mut journal_syncs) = (false, 0);
    for line in trace.text.lines() {
        let Some((pid, call)) = line.split_once(' ') else {
            continue;
        };
        if trace.zeroing.contains(pid) {
            continue;
        }
        let call = call.trim_start();
        if call.ends_with("<unfinished ...>") {
            unfinished.insert(pid, call);
            continue;
        }
        let call = if call.starts_with("<...") {
            let Some(started) = unfinished.remove(pid) else {
                continue;
            };
            let resumed = call.split_once("resumed>").map_or("", |(_, rest)| rest);
            joined.clear();
            joined.push_str(started.trim_end_matches("<unfinished ...>"));
            joined.push_str(resumed);
            joined.as_str()
        } else {
            call
        };
        let is_request = (call.starts_with("read(") || call.starts_with("recvfrom("))
            && call.contains("POST /v1/sessions/");
        if is_request {
            pending = true;
            journal_syncs = 0;
        } else if call.starts_with("fdatasync(") && call.contains("/journal/") {
            // A group's frame. (A new segment is synced whole, with `fsync`, once per 64 MiB.)
            journal_syncs += 1;
        } else if pending && (call.contains("\"HTTP/1.1 201") || call.contains("\"HTTP/1.1 202")) {
            pending = false;
            if journal_syncs == 1 {
                covered += 1;
            } else {
                uncovered += 1;
            }
        }
    }
    (covered, uncovered)
}

#[test]
#[ignore = "needs strace and eatmydata (beyond the Rust toolchain): `.ci/run` installs them \
            and runs it; or `apt-get install -y strace eatmydata` and \
            `cargo test --test it -- --include-ignored r03`"]
fn r03_every_acknowledgement_follows_the_fsync_that_covers_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let trace = traced_run(&dir.path().join("data"), &dir.path().join("trace"), false);
    let (covered, uncovered) = acks_after_fsync(&trace);
    assert_eq!(
        (covered, uncovered),
        (REQUESTS, 0),
        "durable responses after/before fsync"
    );

    // Negative control: with fsync a no-op, the same check must fail.
    let eaten = traced_run(
        &dir.path().join("eaten"),
        &dir.path().join("eaten-trace"),
        true,
    );
    let (covered, uncovered) = acks_after_fsync(&eaten);
    assert_eq!(
        covered, 0,
        "under eatmydata no response can follow an fsync"
    );
    assert_eq!(uncovered, REQUESTS, "the check saw every response");
}
