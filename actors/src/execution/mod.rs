//! One execution: the pure state machine (`machine*.rs`, the plan of a transition in
//! `plan.rs`) and, around it, the actor shell that persists plans and performs their
//! actions (`actor.rs`, one file per part of its work).

pub mod actor;
mod branch_context;
pub mod commands;
mod decision;
mod effects;
pub mod fork;
mod function_run;
mod function_types;
pub mod job;
pub mod job_run;
mod job_state;
pub mod live;
pub mod machine;
mod machine_controls;
mod machine_decide;
mod machine_functions;
pub mod machine_grants;
mod machine_history;
mod machine_next;
mod machine_processes;
mod machine_restart;
pub mod machine_session;
mod machine_types;
pub mod machine_waits;
pub mod plan;
pub mod processes;
pub mod projection;
pub(crate) mod recovery_claim;
mod refusal;
pub mod restart;
mod session_turn;
pub mod wait_expiry;
mod wait_types;
mod writes;

#[cfg(test)]
mod machine_grants_tests;
#[cfg(test)]
mod machine_restart_tests;
#[cfg(test)]
mod machine_sim;
#[cfg(test)]
mod machine_sim_checks;
#[cfg(test)]
mod machine_tests;
#[cfg(test)]
mod machine_waits_tests;
