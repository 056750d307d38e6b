//! One execution's actor: the shell around the pure state machine (`crate::machine`) that
//! persists its plans and performs their actions (`actor.rs`, one file per part of its work:
//! commands, effects, restarts, function and Job runs, processes, the session's line).

pub mod actor;
mod branch_context;
pub mod commands;
mod effects;
mod function_run;
pub mod job_run;
pub mod live;
pub mod processes;
pub(crate) mod recovery_claim;
pub mod restart;
mod run_steps;
mod session_turn;
pub mod wait_expiry;
mod writes;
