//! The scheduler: filters, weighted score plugins, and the pick (primary + fallbacks).

pub mod prefix_cache;
