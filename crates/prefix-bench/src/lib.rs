//! `prefix-bench`: routing quality and overhead, measured against real processes.

pub mod catalogue;
pub mod cluster;
pub mod driver;
pub mod engines;
pub mod event_faults;
pub mod misses;
pub mod noop_ext_proc;
pub mod oracle;
pub mod overhead;
pub mod pd;
pub mod peer;
pub mod picker_config;
pub mod placement_search;
pub mod probe;
pub mod profiles;
pub mod project;
pub mod report;
pub mod routing_floor;
pub mod row_config;
pub mod rows;
pub mod suite_results;
pub mod summary;
pub mod sync_cost;
pub mod tokenize_cost;
pub mod workload;
