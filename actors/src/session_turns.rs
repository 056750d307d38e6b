//! C-2, the service's side of a session's foreground turn: admitting a message while
//! another turn holds the session, by its declared strategy (`BusyStrategy`): `queue` admits
//! it `queued` behind the others, `interrupt` first in line (the turn itself, when it looks,
//! asks the holder to pause: `execution/session_turn.rs`), `steer`
//! makes it the holder's steering text, `reject` refuses it (`409 session_busy`). The
//! session's record changes in the admission's own transition (a compare-and-swap, read
//! again when it moved). Which turn takes the session, and when, is `execution/session_turn.rs`.

use openprogram_storage::{Event, ExecutionId, ExecutionKind, SessionId, SessionRecord};

use crate::admission::{Admission, BusyStrategy, StartRequest};
use crate::command::{Command, CommandBody};
use crate::error::{Error, Result};
use crate::service::{Service, StartReply};

/// How often an admission reads the session record again after it moved.
const ADMISSION_TRIES_MAX: usize = 8;

impl Service {
    /// Admits the agent turn a person starts as its session's foreground turn.
    pub(crate) async fn admit_turn(
        &self,
        session_id: SessionId,
        execution_id: ExecutionId,
        request: StartRequest,
        kind: ExecutionKind,
    ) -> Result<StartReply> {
        let strategy = request.when_busy.unwrap_or_default();
        let store = self.env().store.as_ref();
        for _ in 0..ADMISSION_TRIES_MAX {
            let record = store.session(session_id)?.unwrap_or(SessionRecord {
                session_id,
                ..SessionRecord::default()
            });
            // An unreadable head (quarantined) holds nothing up, as for a turn taking it.
            let state = |id: ExecutionId| store.head(id).ok().flatten().map(|head| head.state);
            let holder = record
                .foreground
                .filter(|holder| state(*holder).is_some_and(|state| !state.is_terminal()));
            let mut line = crate::machine::session::line_of(&record.waiting, None, state);
            let ahead = holder.or(line.first().copied());
            let (name, behind) = match (ahead, strategy) {
                (None, _) => ("immediate", None),
                (Some(busy), BusyStrategy::Reject) => {
                    return Err(Error::SessionBusy {
                        foreground: busy,
                        message: "another turn runs, and the message asked to be refused then (`when_busy`: `reject`)".into(),
                    })
                }
                (Some(busy), BusyStrategy::Steer) => {
                    match self.steer_into(session_id, busy, request.message.clone()).await? {
                        Some(steered) => return Ok(steered),
                        // It ended meanwhile: the session is read again.
                        None => continue,
                    }
                }
                (Some(_), BusyStrategy::Queue) => {
                    let behind = line.last().copied().or(holder);
                    line.push(execution_id);
                    ("queue", behind)
                }
                // The turn, first in line, asks the holder to pause when it looks (its
                // activation, just after this commit; again after a restart).
                (Some(busy), BusyStrategy::Interrupt) => {
                    line.insert(0, execution_id);
                    ("interrupt", Some(busy))
                }
            };
            let turn = Event::SessionTurn {
                strategy: name.into(),
                behind,
            };
            let admission = Admission::new(
                execution_id,
                session_id,
                self.env().contract.revision,
                request.clone(),
                kind,
            )?
            .into_session_turn(turn);
            let reply = StartReply {
                session_turn: Some(name),
                ..StartReply::of(&admission.head)
            };
            let write = crate::machine::session::admitted(&record, execution_id, behind, line);
            let Some((head, machine, version)) = admission.commit_with(store, Some(write)).await?
            else {
                continue;
            };
            self.start_admitted(head, machine)?;
            return Ok(StartReply { version, ..reply });
        }
        Err(Error::Unavailable(
            "the session's record kept changing; send the message again".into(),
        ))
    }

    /// `steer`: the message becomes the running turn's steering text; nothing is admitted.
    async fn steer_into(
        &self,
        session_id: SessionId,
        busy: ExecutionId,
        text: String,
    ) -> Result<Option<StartReply>> {
        let steer = Command::new(CommandBody::Steer { text });
        let reply = self.command(session_id, busy, steer).await?;
        let ended = self
            .env()
            .store
            .head(busy)?
            .is_none_or(|head| head.state.is_terminal());
        if reply.status == "rejected" && ended {
            return Ok(None);
        }
        if reply.status == "rejected" {
            return Err(Error::SessionBusy {
                foreground: busy,
                message: format!(
                    "the running turn takes no steering now: {}",
                    reply.reason.clone().unwrap_or_default()
                ),
            });
        }
        let head = self.head_in(session_id, busy)?;
        Ok(Some(StartReply {
            version: reply.version,
            steered: Some(reply),
            ..StartReply::of(&head)
        }))
    }
}
