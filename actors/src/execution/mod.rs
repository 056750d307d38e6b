//! One execution: the pure state machine (`machine.rs`) and, around it, the actor shell
//! that persists transitions and performs actions (`actor.rs`), and how it takes commands
//! (`commands.rs`).

pub mod actor;
pub mod commands;
pub mod machine;

#[cfg(test)]
mod machine_sim;
#[cfg(test)]
mod machine_tests;
