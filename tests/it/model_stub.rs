//! An in-process HTTP server that speaks a model API from a script (issue 35's tests): each
//! request gets the next scripted reply — a status with a body, a whole SSE stream, or a
//! stream cut off mid-way (the connection closed before its end). Every request is recorded
//! with its headers, body and arrival time. One connection per request (`Connection:
//! close`), so a cut-off stream is a dropped connection to the client.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

#[derive(Debug, Clone)]
pub enum Reply {
    /// A status, extra headers and a body (JSON or not).
    Body {
        status: u16,
        headers: Vec<(String, String)>,
        body: String,
    },
    /// `text/event-stream` frames, each written and flushed on its own; with `cut`, the
    /// connection closes after them (no end marker follows).
    Stream { frames: Vec<String>, cut: bool },
    /// Writes `frames`, then holds the connection open until the test releases it (a child
    /// `serve` is killed meanwhile).
    StreamHeld { frames: Vec<String> },
    /// Answers nothing and holds the connection open until the test releases it: a request
    /// that went out and got no answer.
    Hold,
    /// Sends the stream's head, waits for `open_gate`, then sends `frames` like `Stream`
    /// and ends: a response the test holds back while it watches or controls the turn.
    Gated { frames: Vec<String> },
}

impl Reply {
    pub fn json(body: &Value) -> Self {
        Self::Body {
            status: 200,
            headers: Vec::new(),
            body: body.to_string(),
        }
    }

    pub fn status(status: u16, headers: &[(&str, &str)], body: &str) -> Self {
        Self::Body {
            status,
            headers: headers
                .iter()
                .map(|(name, value)| (name.to_string(), value.to_string()))
                .collect(),
            body: body.to_owned(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    /// Lower-case names.
    pub headers: Vec<(String, String)>,
    pub body: Value,
    /// The body as it came, lossily decoded.
    pub raw: String,
    /// The body's bytes.
    pub bytes: Vec<u8>,
    pub at: Instant,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }
}

pub struct Stub {
    pub url: String,
    requests: Arc<Mutex<Vec<Recorded>>>,
    held: Arc<Mutex<Vec<TcpStream>>>,
    gate: Gate,
}

/// Whether `Reply::Gated` may go on.
type Gate = Arc<(Mutex<bool>, std::sync::Condvar)>;

impl Stub {
    /// Serves `replies` in order; past the last, `500 no more replies`.
    pub fn start(replies: Vec<Reply>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the stub");
        let url = format!("http://{}", listener.local_addr().expect("stub address"));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let held = Arc::new(Mutex::new(Vec::new()));
        let replies = Arc::new(Mutex::new(std::collections::VecDeque::from(replies)));
        let gate = Gate::default();
        {
            let requests = requests.clone();
            let held = held.clone();
            let gate = gate.clone();
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    let Ok(stream) = stream else { continue };
                    let requests = requests.clone();
                    let held = held.clone();
                    let replies = replies.clone();
                    let gate = gate.clone();
                    std::thread::spawn(move || serve(stream, &requests, &held, &replies, &gate));
                }
            });
        }
        Self {
            url,
            requests,
            held,
            gate,
        }
    }

    /// Lets every `Reply::Gated` go on, now and later.
    pub fn open_gate(&self) {
        let (open, opened) = &*self.gate;
        *open.lock().expect("stub lock") = true;
        opened.notify_all();
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().expect("stub lock").clone()
    }

    /// Waits until `count` requests arrived (at most 30 s).
    pub fn wait_requests(&self, count: usize) -> Vec<Recorded> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let requests = self.requests();
            if requests.len() >= count {
                return requests;
            }
            assert!(
                Instant::now() < deadline,
                "the stub got {} requests, expected {count}",
                requests.len()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Closes the connections held open by `StreamHeld`.
    pub fn release(&self) {
        self.held.lock().expect("stub lock").clear();
    }
}

type Replies = Arc<Mutex<std::collections::VecDeque<Reply>>>;

fn serve(
    stream: TcpStream,
    requests: &Mutex<Vec<Recorded>>,
    held: &Mutex<Vec<TcpStream>>,
    replies: &Replies,
    gate: &Gate,
) {
    let mut reader = BufReader::new(stream.try_clone().expect("clone the stub's stream"));
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let mut words = line.split_whitespace();
    let method = words.next().unwrap_or_default().to_owned();
    let path = words.next().unwrap_or_default().to_owned();
    let mut headers = Vec::new();
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).unwrap_or(0) == 0 {
            return;
        }
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            headers.push((name.trim().to_lowercase(), value.trim().to_owned()));
        }
    }
    let length: usize = headers
        .iter()
        .find(|(name, _)| name == "content-length")
        .and_then(|(_, value)| value.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    if reader.read_exact(&mut body).is_err() {
        return;
    }
    requests.lock().expect("stub lock").push(Recorded {
        method,
        path,
        headers,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        raw: String::from_utf8_lossy(&body).into_owned(),
        bytes: body.clone(),
        at: Instant::now(),
    });
    let reply = replies.lock().expect("stub lock").pop_front();
    let mut stream = stream;
    let sse_head =
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
    let _ = match reply {
        None => write_body(
            &mut stream,
            500,
            &[],
            r#"{"error":{"message":"no more replies"}}"#,
        ),
        Some(Reply::Body {
            status,
            headers,
            body,
        }) => write_body(&mut stream, status, &headers, &body),
        Some(Reply::Stream { frames, cut }) => {
            let _ = stream.write_all(sse_head.as_bytes());
            for frame in frames {
                let _ = stream.write_all(frame.as_bytes());
                let _ = stream.flush();
                std::thread::sleep(Duration::from_millis(5));
            }
            if cut {
                let _ = stream.shutdown(std::net::Shutdown::Both);
            }
            Ok(())
        }
        Some(Reply::StreamHeld { frames }) => {
            let _ = stream.write_all(sse_head.as_bytes());
            for frame in frames {
                let _ = stream.write_all(frame.as_bytes());
            }
            let _ = stream.flush();
            held.lock().expect("stub lock").push(stream);
            Ok(())
        }
        Some(Reply::Hold) => {
            held.lock().expect("stub lock").push(stream);
            Ok(())
        }
        Some(Reply::Gated { frames }) => {
            let _ = stream.write_all(sse_head.as_bytes());
            let _ = stream.flush();
            let (open, opened) = &**gate;
            let mut is_open = open.lock().expect("stub lock");
            while !*is_open {
                is_open = opened.wait(is_open).expect("stub lock");
            }
            drop(is_open);
            for frame in frames {
                let _ = stream.write_all(frame.as_bytes());
                let _ = stream.flush();
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(())
        }
    };
}

fn write_body(
    stream: &mut TcpStream,
    status: u16,
    headers: &[(String, String)],
    body: &str,
) -> std::io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    stream.flush()
}

/// OpenAI: a streamed tool call, as SSE frames; its arguments arrive in two pieces.
pub fn openai_tool_call_frames(name: &str, arguments: &str) -> Vec<String> {
    let half = arguments.chars().count() / 2;
    let (head, tail) = arguments.split_at(
        arguments
            .char_indices()
            .nth(half)
            .map_or(arguments.len(), |(at, _)| at),
    );
    let call = |call: Value| {
        format!(
            "data: {}\n\n",
            serde_json::json!({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})
        )
    };
    vec![
        call(
            serde_json::json!({"index": 0, "id": "x", "type": "function",
            "function": {"name": name, "arguments": ""}}),
        ),
        call(serde_json::json!({"index": 0, "function": {"arguments": head}})),
        call(serde_json::json!({"index": 0, "function": {"arguments": tail}})),
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n"
            .into(),
        "data: [DONE]\n\n".into(),
    ]
}

/// OpenAI: streamed text in `pieces`, then its end (`finish_reason`, `[DONE]`).
pub fn openai_text_frames(pieces: &[&str]) -> Vec<String> {
    let mut frames: Vec<String> = pieces
        .iter()
        .map(|piece| {
            format!(
                "data: {}\n\n",
                serde_json::json!({"choices": [{"index": 0, "delta": {"content": piece}}]})
            )
        })
        .collect();
    frames.push(
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3}}\n\n"
            .into(),
    );
    frames.push("data: [DONE]\n\n".into());
    frames
}
