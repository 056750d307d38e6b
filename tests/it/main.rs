//! Integration tests of the `openprogram` package, through the library facade (I-1), named
//! after SPEC ids; `tidy` keeps the conventions of GUIDE.md honest across the workspace.

mod support;

// The throwaway PostgreSQL cluster of the storage tests, shared rather than copied.
#[path = "../../storage/tests/it/pg_cluster.rs"]
mod pg_cluster;

mod agent_loop;
mod attempts;
mod branches;
mod browser;
mod capabilities;
mod cli;
mod cli_select;
mod compaction;
mod context;
mod context_providers;
mod controls;
mod embedder;
mod functions;
mod functions_crash;
mod functions_parallel;
mod functions_versions;
mod grants;
mod http;
mod http_branches;
mod http_cli;
mod http_commands;
mod http_debug;
mod http_script;
mod http_stream;
mod http_tool;
mod imports;
mod jobs;
mod jobs_crash;
mod jobs_property;
mod jobs_restart;
mod k2_contract;
mod k3_property;
mod k3_states;
mod k3_world;
mod k7_restart_window;
mod kill9;
mod metrics;
mod model_stub;
mod n3_forwarded;
mod n4_restored;
mod planted;
mod postgres;
mod processes;
mod providers;
mod providers_errors;
mod providers_stream;
mod questions;
mod r01_failpoints;
mod r03_ack_after_fsync;
mod r06_sigstop;
mod r14_injected_io_errors;
mod r22_model;
mod recovery;
mod restart_window;
mod resume;
mod s8_history;
mod s8_retention;
mod served;
mod session_turns;
mod tidy;
mod traces;
mod transcript;
mod waits;
mod waits_structured;
