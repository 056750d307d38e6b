//! Integration tests of the storage crate, named after SPEC ids. One binary, one module per
//! area; `support` holds the shared helpers.

mod pg_cluster;
mod support;

mod b1_sessions;
mod conformance;
mod conformance_backends;
mod conformance_conversations;
mod conformance_sessions;
mod k4_commands;
mod n4_restored_dump;
mod pg_positions;
mod planted;
mod r07_locking;
mod r13_disk_full;
mod r13_fail_stop;
mod s1_event_index;
mod s1_log;
mod s2_transitions;
mod s3_crash;
mod s4_corruption;
mod s5_blobs;
mod s6_startup;
mod s7_acknowledged;
mod s8_projections;
mod s8_purge;
mod s9_generations;
