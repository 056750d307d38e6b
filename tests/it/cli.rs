//! The `openprogram` binary (SPEC §6 CLI): `load` with `--json`, usage errors (`serve`, `ctl`
//! and `inspect` against a running server are in `http_cli`). Exit codes: 0 ok, 1 failed, 2 usage.

use std::process::Command;

fn openprogram(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_openprogram"))
        .args(args)
        .output()
        .expect("run openprogram")
}

#[test]
fn i4_load_json_reports_every_execution_and_step() {
    let output = openprogram(&[
        "load",
        "--executions",
        "30",
        "--steps",
        "4",
        "--concurrency",
        "8",
        "--payload-bytes",
        "64",
        "--json",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().last().expect("one JSON line");
    let report: serde_json::Value = serde_json::from_str(line).expect("JSON");
    assert_eq!(report["executions"], 30);
    assert_eq!(report["steps"], 4);
    assert_eq!(report["total_steps"], 120);
    assert_eq!(report["completed"], 30, "{report}");
    assert_eq!(report["failed"], 0);
    for field in [
        "concurrency",
        "wall_s",
        "steps_per_s",
        "executions_per_s",
        "step_p50_ms",
        "step_p99_ms",
        "execution_p50_ms",
        "execution_p99_ms",
        "fsyncs",
        "peak_rss_mib",
    ] {
        assert!(report[field].is_number(), "{field} missing in {report}");
    }
    // Read from /proc/self/stat: on Linux (the platform of this runtime) a number.
    if cfg!(target_os = "linux") {
        assert!(report["cpu_us_per_step"].is_number(), "{report}");
        // The same CPU, by thread role: the roles add up to the whole (which /proc/self/stat
        // gives in 10 ms ticks, so up to two ticks less than the threads' own times), and where
        // the kernel keeps each thread's nanoseconds, the actors and the committer show
        // their work. (User and system time are each cut to a tick.)
        let roles = report["cpu_us_per_step_by_role"]
            .as_object()
            .unwrap_or_else(|| panic!("no CPU by role in {report}"));
        let sum: f64 = roles.values().filter_map(serde_json::Value::as_f64).sum();
        let whole = report["cpu_us_per_step"].as_f64().unwrap_or(0.0);
        let tick_per_step = 10_000.0 / 120.0;
        assert!(sum >= whole * 0.99, "{report}");
        assert!(sum <= whole * 1.01 + 2.0 * tick_per_step, "{report}");
        if std::fs::read_to_string("/proc/self/schedstat").is_ok() {
            for role in ["actors", "committer"] {
                let spent = roles[role].as_f64().unwrap_or(0.0);
                assert!(spent > 0.0, "{role}: {report}");
            }
            // And the time each role waited for a CPU, as a share of the wall. The one
            // committer thread fsyncs during the run, so it cannot have waited all of it;
            // the margin is for a wait already under way at the first reading, which the
            // kernel counts once the thread runs (the ticker wakes it every few ms).
            let waited = report["run_queue_wait_pct_by_role"]
                .as_object()
                .unwrap_or_else(|| panic!("no run-queue wait in {report}"));
            let pct = |role: &str| waited.get(role).and_then(serde_json::Value::as_f64);
            for role in ["actors", "committer"] {
                assert!(pct(role).is_some_and(|pct| pct >= 0.0), "{role}: {report}");
            }
            assert!(pct("committer").is_some_and(|pct| pct <= 105.0), "{report}");
        }
    }
    // The committer's time: busy a share of the wall (a group already running when the load
    // started may add a little), flush and fsync parts of it.
    let pct = |field: &str| report[field].as_f64().unwrap_or(-1.0);
    let (busy, flush, fsync) = (
        pct("committer_busy_pct"),
        pct("committer_flush_pct"),
        pct("committer_fsync_pct"),
    );
    assert!(busy > 0.0 && busy <= 105.0, "{report}");
    assert!(
        flush > 0.0 && fsync > 0.0 && flush + fsync <= busy,
        "{report}"
    );
    // Every step is two durable transitions, so there was at least one fsync.
    assert!(report["fsyncs"].as_u64().unwrap_or(0) > 0, "{report}");
    // The store holds every step; what reached its device (every step is fsynced) is read
    // from /sys/dev/block, where the temporary directory's file system has a device.
    let stored = report["disk_bytes_stored_per_step"].as_f64().unwrap_or(0.0);
    assert!(stored > 0.0, "{report}");
    if openprogram::process_stats::disk_written(&std::env::temp_dir()).is_some() {
        let written = report["disk_bytes_written_per_step"].as_f64();
        assert!(written.is_some_and(|bytes| bytes > 0.0), "{report}");
    }
}

#[test]
fn i4_usage_errors_exit_2_with_one_line() {
    let output = openprogram(&["load", "--executions", "lots"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("invalid value 'lots'"), "{stderr}");
    let zero = openprogram(&["load", "--executions", "0", "--json"]);
    assert_eq!(zero.status.code(), Some(2));
    assert_eq!(String::from_utf8_lossy(&zero.stderr).lines().count(), 1);
}

#[test]
fn r2_serve_refuses_a_malformed_restart_window() {
    let output = openprogram(&["serve", "--restart-window", "soon"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("invalid restart window"));
}

#[test]
fn i4_load_reports_command_latency_and_parked_memory_when_asked() {
    let output = openprogram(&[
        "load",
        "--executions",
        "40",
        "--steps",
        "20",
        "--concurrency",
        "10",
        "--commands-per-s",
        "20",
        "--park",
        "50",
        "--json",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let report: serde_json::Value =
        serde_json::from_str(stdout.lines().last().expect("line")).expect("JSON");
    assert_eq!(
        report["completed"], 40,
        "paused executions were all continued: {report}"
    );
    assert_eq!(report["parked"], 50);
    assert!(report["rss_per_parked_bytes"].is_number(), "{report}");
    let commands = report["commands"].as_u64().expect("commands counted");
    let rejected = report["commands_rejected"]
        .as_u64()
        .expect("rejections counted");
    assert_eq!(
        report["command_p99_ms"].is_number(),
        commands > rejected,
        "a latency exactly when a command was applied: {report}"
    );
    assert_eq!(
        report["rejected_p99_ms"].is_number(),
        rejected > 0,
        "{report}"
    );
}

/// I-4, F-1: `load --function steps` runs durable functions, every step counted once; an
/// unknown function is a usage error.
#[test]
fn i4_load_function_steps_reports_every_function_step() {
    let output = openprogram(&[
        "load",
        "--function",
        "steps",
        "--executions",
        "20",
        "--steps",
        "5",
        "--concurrency",
        "8",
        "--json",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().last().expect("one JSON line");
    let report: serde_json::Value = serde_json::from_str(line).expect("JSON");
    assert_eq!(report["kind"], "steps", "{report}");
    assert_eq!(report["total_steps"], 100, "{report}");
    assert_eq!(
        (report["completed"].clone(), report["failed"].clone()),
        (20.into(), 0.into())
    );
    assert!(report["steps_per_s"].is_number(), "{report}");
    let output = openprogram(&["load", "--function", "fanout", "--executions", "1"]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
}

/// What users read says what a flag does, not which requirement it serves: no `--help`
/// names a requirement id (such as S-8 or K-4) or a fault scenario's (R02).
#[test]
fn i4_help_names_no_requirement_id() {
    let commands = [
        "load", "serve", "cluster", "soak", "compact", "ctl", "call", "inspect", "send", "approve",
        "deny",
    ];
    for args in
        std::iter::once(vec!["--help"]).chain(commands.map(|command| vec![command, "--help"]))
    {
        let output = openprogram(&args);
        assert!(output.status.success(), "{args:?}");
        let text = String::from_utf8_lossy(&output.stdout);
        let ids = crate::support::requirement_ids(&text);
        assert!(
            ids.is_empty(),
            "`openprogram {}` names {ids:?}",
            args.join(" ")
        );
    }
}

/// I-4: what an error says names no requirement id either: every string in the code that
/// builds the errors people read (the HTTP API's, `serve`'s, the CLI's, the refusals').
#[test]
fn i4_errors_name_no_requirement_id() {
    let root = env!("CARGO_MANIFEST_DIR");
    let mut files = vec![
        format!("{root}/src/serve.rs"),
        format!("{root}/src/main.rs"),
        format!("{root}/actors/src/error.rs"),
        format!("{root}/actors/src/machine/refusal.rs"),
        format!("{root}/actors/src/command.rs"),
        format!("{root}/actors/src/command_fields.rs"),
        format!("{root}/storage/src/error.rs"),
    ];
    for entry in std::fs::read_dir(format!("{root}/src/http")).expect("src/http") {
        let path = entry.expect("an entry").path();
        if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path.display().to_string());
        }
    }
    let (mut found, mut literals) = (Vec::new(), 0);
    for file in &files {
        let text = std::fs::read_to_string(file).expect("a source file");
        for (number, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            // The string literals of the line: every other piece between quotes.
            for literal in line.split('"').skip(1).step_by(2) {
                literals += 1;
                let ids = crate::support::requirement_ids(literal);
                if !ids.is_empty() {
                    found.push(format!("{file}:{}: {ids:?} in \"{literal}\"", number + 1));
                }
            }
        }
    }
    assert!(literals > 500, "the sources were read: {literals} strings");
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// I-4: no log line names a requirement id: the string literals of every `trace!` …
/// `error!` call in the runtime's production sources (src, actors, storage).
#[test]
fn i4_log_lines_name_no_requirement_id() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["src", "actors/src", "storage/src"] {
        rust_files(&root.join(dir), &mut files);
    }
    let (mut found, mut calls) = (Vec::new(), 0);
    let production = |file: &&std::path::PathBuf| !file.to_string_lossy().ends_with("_tests.rs");
    for file in files.iter().filter(production) {
        let text = std::fs::read_to_string(file).expect("a source file");
        for call in log_calls(&text) {
            calls += 1;
            for literal in call.split('"').skip(1).step_by(2) {
                let ids = crate::support::requirement_ids(literal);
                if !ids.is_empty() {
                    found.push(format!("{}: {ids:?} in \"{literal}\"", file.display()));
                }
            }
        }
    }
    assert!(calls > 100, "the sources were read: {calls} log calls");
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// The `.rs` files under `dir`, recursively.
fn rust_files(dir: &std::path::Path, into: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir)
        .expect("a source directory")
        .flatten()
    {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, into);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            into.push(path);
        }
    }
}

/// The arguments of each logging macro call in `text` (to its closing parenthesis).
fn log_calls(text: &str) -> Vec<&str> {
    let mut calls = Vec::new();
    for level in ["trace!(", "debug!(", "info!(", "warn!(", "error!("] {
        for (at, _) in text.match_indices(level) {
            let args = &text[at + level.len()..];
            let mut depth = 1;
            let end = args.char_indices().find_map(|(i, c)| {
                depth += match c {
                    '(' => 1,
                    ')' => -1,
                    _ => 0,
                };
                (depth == 0).then_some(i)
            });
            calls.push(&args[..end.unwrap_or(args.len())]);
        }
    }
    calls
}
