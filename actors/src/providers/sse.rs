//! Server-Sent Events as model APIs send them: `event:` and `data:` fields, one event per
//! blank line, comments (`:`) ignored. Bytes arrive in arbitrary pieces; an event is handed
//! out only once its blank line has arrived, so a cut-off stream never yields a half event.

/// One event: its `event:` name (empty if none) and its `data:` lines joined by `\n`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Event {
    pub(super) name: String,
    pub(super) data: String,
}

/// Splits a byte stream into events.
#[derive(Debug, Default)]
pub(super) struct Parser {
    buffer: Vec<u8>,
    name: String,
    data: Vec<String>,
}

impl Parser {
    /// Takes the next piece of the stream; returns the events it completed.
    pub(super) fn push(&mut self, bytes: &[u8]) -> Vec<Event> {
        self.buffer.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some(end) = self.buffer.iter().position(|&byte| byte == b'\n') {
            let line: Vec<u8> = self.buffer.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches(['\n', '\r']);
            if line.is_empty() {
                // An event without data is not dispatched (the SSE standard).
                let name = std::mem::take(&mut self.name);
                let data = std::mem::take(&mut self.data);
                if !data.is_empty() {
                    events.push(Event {
                        name,
                        data: data.join("\n"),
                    });
                }
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = match line.split_once(':') {
                Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
                None => (line, ""),
            };
            match field {
                "event" => self.name = value.to_owned(),
                "data" => self.data.push(value.to_owned()),
                _ => {}
            }
        }
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e3_events_are_whole_however_the_bytes_are_cut() {
        let stream =
            b"event: a\ndata: {\"x\":\ndata: 1}\n\n: ping\n\ndata: [DONE]\r\n\r\ndata: half";
        for cut in 1..stream.len() {
            let mut parser = Parser::default();
            let mut events = parser.push(&stream[..cut]);
            events.extend(parser.push(&stream[cut..]));
            assert_eq!(
                events,
                vec![
                    Event {
                        name: "a".into(),
                        data: "{\"x\":\n1}".into()
                    },
                    Event {
                        name: String::new(),
                        data: "[DONE]".into()
                    },
                ],
                "cut at {cut}"
            );
        }
    }
}
