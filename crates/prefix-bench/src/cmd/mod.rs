//! The subcommands, a module each (their flags beside them when they have their own options
//! struct); `main.rs` parses the command line and dispatches. What they share (the workload
//! catalogue, the rows, starting a row's processes) is the library's.

pub mod overhead;
pub mod pd;
pub mod replicas;
pub mod report;
pub mod run;
pub mod suite;
