//! `openprogram serve` as a child process of a test, on a free port: its URL read from
//! stdout, signalled by pid, killed on drop (continued first, in case a test stopped it).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::http::call_raw;
use crate::support::DEADLINE;

pub struct Served {
    child: Child,
    pub url: String,
    pub token: String,
}

impl Served {
    /// `serve --data DATA --token TOKEN --listen 127.0.0.1:0 EXTRA...`, run through
    /// `wrapper` (a program and its arguments that execs the rest, such as `fiu-run -x`).
    pub fn start(data: &Path, token: &str, wrapper: &[&str], extra: &[&str]) -> Self {
        Self::spawn(data, token, wrapper, extra, &[], false)
    }

    /// `start`, with `env` added to the child's environment; the child's stderr (its log
    /// lines) is appended to `stderr_path(data)`, beside `data`.
    pub fn start_with_env(
        data: &Path,
        token: &str,
        wrapper: &[&str],
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        Self::spawn(data, token, wrapper, extra, env, true)
    }

    fn spawn(
        data: &Path,
        token: &str,
        wrapper: &[&str],
        extra: &[&str],
        env: &[(&str, &str)],
        log: bool,
    ) -> Self {
        let stderr = match log {
            true => std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(stderr_path(data))
                .map_or_else(|_| Stdio::null(), Stdio::from),
            false => Stdio::null(),
        };
        let binary = env!("CARGO_BIN_EXE_openprogram");
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(binary);
                command
            }
            None => Command::new(binary),
        };
        let mut child = command
            .args(["serve", "--listen", "127.0.0.1:0", "--token", token])
            .args(extra)
            .envs(env.iter().copied())
            .arg("--data")
            .arg(data)
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|error| panic!("spawn {wrapper:?} openprogram serve: {error}"));
        let mut url = String::new();
        let stdout = child.stdout.take().expect("stdout");
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut url)
            .expect("the listen URL");
        let url = url.trim().to_owned();
        assert!(url.starts_with("http://"), "no listen URL: {url:?}");
        Self {
            child,
            url,
            token: token.to_owned(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `kill -SIGNAL PID`, for the process this test started.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.pid().to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill {signal}");
    }

    /// `(status, body)` of a call with the admin token.
    pub fn call(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        call_raw(
            &self.url,
            method,
            path,
            Some(&self.token),
            body.map(Value::to_string),
        )
    }

    /// SIGKILL (by pid: the child this test started), reaped.
    pub fn kill9(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reap");
    }

    /// SIGTERM, and waits for the orderly shutdown (SIGKILL past the deadline).
    pub fn stop(mut self) {
        self.signal("-TERM");
        let deadline = Instant::now() + DEADLINE;
        while self.child.try_wait().ok().flatten().is_none() {
            assert!(Instant::now() < deadline, "serve did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = Command::new("kill")
                .args(["-CONT", &self.pid().to_string()])
                .status();
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// The body admitting turn `execution`: `steps` times an `append` of `e{execution}-s{step}`
/// to `sink` and a sleep of `sleep_ms`, then the reply `done {execution}`.
pub fn appending_turn(execution: usize, steps: usize, sink: &Path, sleep_ms: u64) -> Value {
    let mut script = Vec::new();
    for step in 0..steps {
        let line = format!("e{execution}-s{step}");
        script.push(json!({"tool": "append", "args": {"path": sink, "line": line}}));
        script.push(json!({"tool": "sleep", "args": {"ms": sleep_ms}}));
    }
    script.push(json!({"reply": format!("done {execution}")}));
    json!({"message": "m", "script": script, "max_iterations": script.len()})
}

/// Where the log lines of the `serve`s started on `data` go: beside it, not in it.
pub fn stderr_path(data: &Path) -> std::path::PathBuf {
    let mut name = data.file_name().unwrap_or_default().to_os_string();
    name.push(".serve-stderr");
    data.with_file_name(name)
}
