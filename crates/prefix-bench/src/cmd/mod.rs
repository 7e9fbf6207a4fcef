//! The subcommands, a module each (their flags beside them when they have their own options
//! struct); `main.rs` parses the command line and dispatches. The small ones call the library
//! module that does the work (`tokenize_cost`, `noop_ext_proc`, `routing_floor`,
//! `sync_cost`); what the others
//! share (the workload catalogue, the rows, starting a row's processes) is the library's too.

pub mod misses;
pub mod noop_ext_proc;
pub mod overhead;
pub mod pd;
pub mod replicas;
pub mod report;
pub mod routing_floor;
pub mod run;
pub mod suite;
pub mod sync_apply;
pub mod tokenize_cost;
