//! One execution: the pure state machine (`machine.rs`) and, around it, the actor shell
//! that persists transitions and performs actions.

pub mod machine;

#[cfg(test)]
mod machine_tests;
