//! kvcache-aware's I/O: the lookup before routing ([`lookup`]), the shared Redis connection
//! ([`store`]), Kthena's Redis environment ([`redis_env`]), the hourly GC ([`gc`]) and the
//! writer beside an engine ([`relay`], `prefix-picker kv-relay`). The scoring itself is pure
//! and lives in [`crate::scheduler::kvcache_aware`].

pub mod gc;
pub mod lookup;
pub mod redis_env;
pub mod relay;
pub mod store;

pub use lookup::KvLookup;
pub use store::KvStore;
