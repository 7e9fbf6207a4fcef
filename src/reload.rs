//! Config reload: on SIGHUP, or when the config file's content changes, the config is read and
//! resolved again (flags included, as at start-up) and compared with the live one.
//!
//! - Reloaded: the scheduler (`scheduler:` plugins, weights and args, `pdGroup:`) and the
//!   picker keys that only steer decisions (`seed`, `maxEndpoints`, `affinity`,
//!   `loadShedding`, `flowControl` but its `halfLifeSeconds`), built into a new scheduler generation over the same prefix index
//!   ([`crate::routing::LiveScheduler`]), and the static `endpoints:` (an unchanged pod keeps
//!   its entries, a removed one loses them as when a pod leaves).
//! - A change of the block layout (block size or chain scheme) clears the index (logged).
//! - Refused, naming the key, the old config kept: keys read once at start-up (`picker.tls`,
//!   `picker.debug`, `picker.sessions`, `picker.kvEvents`, `picker.tokenizer`, the scrape and
//!   shutdown knobs, `maxBodyBytes`,
//!   `responseTimeoutSeconds`, `allowTestEndpointSelection`, `maxHashCacheSize`), `sync:`,
//!   `discovery:`, and with discovery on, `endpoints:` and `pdGroup:` (the pod watch holds
//!   them); with sync on, anything that changes the block hashes; with `engineBudget` on, any
//!   affinity or block-size change. An invalid config is refused the same way.
//!
//! The file is polled (its content hash every [`POLL_INTERVAL`]) rather than watched with
//! inotify: a mounted ConfigMap changes by swapping a `..data` symlink, which a poll of the
//! content sees whatever the mount does. Listeners are flags, never reloaded.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::endpoints::Update;
use crate::metrics::ReloadResult;
use crate::routing::{Generation, Router};
use crate::scheduler::config::BlockLayout;

/// How often the config file's content is checked.
pub const POLL_INTERVAL: Duration = Duration::from_secs(2);

/// Why a reload was refused (the old config stays).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Keys that need a restart changed.
    #[error("{} changed (restart to apply)", .0.join(", "))]
    Restart(Vec<String>),
    /// The new config does not load.
    #[error("invalid config: {}", .0.join("; "))]
    Invalid(Vec<String>),
}

/// What a reload changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The block layout changed from `.0` to `.1`: the index is cleared.
    pub layout: Option<(BlockLayout, BlockLayout)>,
    /// The static endpoints changed.
    pub endpoints: bool,
}

/// Decides a reload from `old` to `new`: `Ok(None)` when nothing that matters changed.
pub fn check(old: &Config, new: &Config) -> Result<Option<Plan>, Refused> {
    let (os, ns) = (&old.scheduler, &new.scheduler);
    let layout =
        (os.block_layout() != ns.block_layout()).then(|| (os.block_layout(), ns.block_layout()));
    let endpoints = old.endpoints != new.endpoints;
    let mut keys = start_up_keys(old, new);
    keys.extend(index_keys(old, new, layout.is_some()));
    keys.extend(discovery_keys(old, new, endpoints));
    if !keys.is_empty() {
        return Err(Refused::Restart(
            keys.into_iter().map(String::from).collect(),
        ));
    }
    let unchanged = os == ns && old.picker == new.picker && !endpoints;
    Ok((!unchanged).then_some(Plan { layout, endpoints }))
}

/// The changed keys read once at start-up. A table: each row is a key and whether it changed.
fn start_up_keys(old: &Config, new: &Config) -> Vec<&'static str> {
    let (o, n) = (&old.picker, &new.picker);
    let mut keys: Vec<&str> = [
        ("picker.tls", o.tls != n.tls),
        ("picker.debug", o.debug != n.debug),
        ("picker.sessions", o.sessions != n.sessions),
        ("picker.kvEvents", o.kv_events != n.kv_events),
        ("picker.tokenizer", o.tokenizer != n.tokenizer),
        (
            "picker.flowControl.halfLifeSeconds",
            o.flow_control.half_life_seconds != n.flow_control.half_life_seconds,
        ),
        (
            "picker.allowTestEndpointSelection",
            o.allow_test_endpoint_selection != n.allow_test_endpoint_selection,
        ),
        (
            "picker.decisionHeader",
            o.decision_header != n.decision_header,
        ),
        ("picker.maxBodyBytes", o.max_body_bytes != n.max_body_bytes),
        (
            "picker.responseTimeoutSeconds",
            o.response_timeout_seconds != n.response_timeout_seconds,
        ),
        (
            "picker.scrapeIntervalSeconds",
            o.scrape_interval_seconds != n.scrape_interval_seconds,
        ),
        (
            "picker.scrapeTimeoutSeconds",
            o.scrape_timeout_seconds != n.scrape_timeout_seconds,
        ),
        (
            "picker.scrapeConcurrency",
            o.scrape_concurrency != n.scrape_concurrency,
        ),
        ("picker.engineMetrics", o.engine_metrics != n.engine_metrics),
        (
            "picker.shutdownDelaySeconds",
            o.shutdown_delay_seconds != n.shutdown_delay_seconds,
        ),
        (
            "picker.shutdownGraceSeconds",
            o.shutdown_grace_seconds != n.shutdown_grace_seconds,
        ),
        ("sync", old.sync != new.sync),
        ("discovery", old.discovery != new.discovery),
    ]
    .into_iter()
    .filter_map(|(key, changed)| changed.then_some(key))
    .collect();
    // A picker key missing from the list above (one added later) is refused, not ignored.
    let start_up_only = |p: &crate::config::PickerConfig| crate::config::PickerConfig {
        seed: 0,
        max_endpoints: 0,
        affinity: None,
        load_shedding: None,
        flow_control: crate::flow_control::FlowControlConfig {
            half_life_seconds: p.flow_control.half_life_seconds,
            ..Default::default()
        },
        ..p.clone()
    };
    if keys.is_empty() && start_up_only(o) != start_up_only(n) {
        keys.push("picker (a key read at start-up)");
    }
    keys
}

/// Changes the prefix index cannot follow live: a pod budget sized at start-up, the index's
/// size, or (with sync on) the block hashes other replicas share.
fn index_keys(old: &Config, new: &Config, layout_changed: bool) -> Vec<&'static str> {
    let (os, ns) = (&old.scheduler, &new.scheduler);
    let mut keys = Vec::new();
    let budget = |c: &Config| c.scheduler.affinity.is_some_and(|a| a.engine_budget);
    let affinity_changed = os.affinity != ns.affinity || layout_changed;
    if (budget(old) || budget(new)) && affinity_changed {
        keys.push(
            "picker.affinity (engineBudget is on: the engine scrape sizes pod budgets at start-up)",
        );
    } else if os.prefix_cache.max_hash_cache_size != ns.prefix_cache.max_hash_cache_size {
        keys.push("scheduler.pluginConfig prefix-cache maxHashCacheSize");
    }
    let hashes_changed = layout_changed
        || os.prefix_cache.max_blocks_to_match != ns.prefix_cache.max_blocks_to_match;
    if old.sync.is_some() && hashes_changed {
        keys.push(
            "the block hashes (blockSizeToHash, maxBlocksToMatch or the affinity block layout; sync is on: replicas must hash alike)",
        );
    }
    keys
}

/// With discovery on, the pod watch holds the static endpoints and `pdGroup:`.
fn discovery_keys(old: &Config, new: &Config, endpoints_changed: bool) -> Vec<&'static str> {
    let mut keys = Vec::new();
    if old.discovery.kubernetes.is_some() {
        if endpoints_changed {
            keys.push("endpoints (discovery is on: the pod watch merges them at start-up)");
        }
        if old.scheduler.pd != new.scheduler.pd {
            keys.push("pdGroup (discovery is on: the pod watch reads its labels at start-up)");
        }
    }
    keys
}

/// The live config and its hash, and the router a reload changes.
#[derive(Debug)]
pub struct Reloader {
    router: Arc<Router>,
    live: Mutex<Live>,
}

#[derive(Debug)]
struct Live {
    config: Config,
    sha256: String,
}

impl Reloader {
    /// Starts from the config the router was built from; `sha256` is its text's hash (empty
    /// without a config), exported as `prefix_picker_config_info`.
    pub fn new(router: Arc<Router>, config: Config, sha256: String) -> Reloader {
        set_info(&router, None, &sha256);
        Reloader {
            router,
            live: Mutex::new(Live { config, sha256 }),
        }
    }

    /// The live config's hash.
    pub fn sha256(&self) -> String {
        self.live.lock().sha256.clone()
    }

    /// Applies `next` (a resolved config and its text's hash, or why it does not load) if
    /// [`check`] allows it; logs and counts the result.
    pub fn reload(&self, next: Result<(Config, String), Vec<String>>) -> ReloadResult {
        let result = match next {
            Err(errors) => Err(Refused::Invalid(errors)),
            Ok((config, sha256)) => self.apply(config, sha256),
        };
        let result = match result {
            Ok(r) => r,
            Err(refused) => {
                tracing::error!(
                    live_config_sha256 = %self.sha256(),
                    "config reload refused: {refused}; the old config is kept"
                );
                ReloadResult::Failure
            }
        };
        self.router
            .metrics
            .config_reloads
            .with_label_values(&[result.as_str()])
            .inc();
        result
    }

    fn apply(&self, config: Config, sha256: String) -> Result<ReloadResult, Refused> {
        let mut live = self.live.lock();
        let Some(plan) = check(&live.config, &config)? else {
            tracing::info!(config_sha256 = %sha256, "config reload: nothing to change");
            set_info(&self.router, Some(&live.sha256), &sha256);
            live.sha256 = sha256;
            return Ok(ReloadResult::Unchanged);
        };
        for w in &config.warnings {
            tracing::warn!("{w}");
        }
        let router = &self.router;
        let scheduler = router.scheduler.load().scheduler.reconfigured(
            config.scheduler.clone(),
            config.picker.max_endpoints,
            config.picker.seed,
        );
        // lora-affinity reads the engines' served models: fetched while it is on (from the next
        // scrape round; until then a pod never listed serves nothing, as in Kthena).
        router
            .endpoints
            .set_fetch_served_models(config.scheduler.needs_served_models());
        router.scheduler.store(Generation {
            scheduler,
            picker: config.picker.clone(),
        });
        if let Some((old, new)) = plan.layout {
            // Records of requests decided before the swap may still land, under the old
            // layout: they never match and age out.
            let dropped = router.scheduler.index().clear();
            tracing::warn!(
                old = %old,
                new = %new,
                dropped,
                "config reload: the block layout changed; prefix index cleared"
            );
        }
        if plan.endpoints {
            let left = router
                .endpoints
                .apply(Update::Reset(crate::serve::static_endpoints(&config)));
            tracing::info!(
                endpoints = config.endpoints.len(),
                left = left.len(),
                "config reload: static endpoints applied"
            );
        }
        tracing::info!(
            config_sha256 = %sha256,
            mode = %config.scheduler.mode_summary(),
            "config reloaded"
        );
        set_info(router, Some(&live.sha256), &sha256);
        *live = Live { config, sha256 };
        Ok(ReloadResult::Success)
    }
}

/// `prefix_picker_config_info{sha256}`: the live hash only.
fn set_info(router: &Router, old: Option<&str>, new: &str) {
    let info = &router.metrics.config_info;
    if let Some(old) = old.filter(|o| *o != new && !o.is_empty()) {
        let _ = info.remove_label_values(&[old]);
    }
    if !new.is_empty() {
        info.with_label_values(&[new]).set(1);
    }
}

/// Reloads on SIGHUP and, when the config came from `file`, whenever its content hash changes
/// (checked every `interval`). `load` resolves the config again, as at start-up. Without a
/// file (`--config-text`, or no config), SIGHUP is logged and ignored. SIGHUP is handled from
/// the call on (its default action would end the process), before the future first runs.
pub fn watch<L>(
    reloader: Arc<Reloader>,
    file: Option<PathBuf>,
    interval: Duration,
    load: L,
    token: CancellationToken,
) -> impl std::future::Future<Output = ()> + Send
where
    L: Fn() -> Result<(Config, String), Vec<String>> + Send,
{
    let hangup = hangup();
    watching(reloader, file, interval, load, token, hangup)
}

async fn watching<L>(
    reloader: Arc<Reloader>,
    file: Option<PathBuf>,
    interval: Duration,
    load: L,
    token: CancellationToken,
    mut hangup: Hangup,
) where
    L: Fn() -> Result<(Config, String), Vec<String>>,
{
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seen = reloader.sha256();
    loop {
        let signalled = tokio::select! {
            _ = token.cancelled() => return,
            _ = recv(&mut hangup) => true,
            _ = tick.tick(), if file.is_some() => false,
        };
        let Some(path) = &file else {
            tracing::warn!(
                "SIGHUP: the config was not read from a file (--config-text or none), so it cannot reload; restart to apply a change"
            );
            continue;
        };
        // A ConfigMap swap can leave the path missing for a moment: the poll checks again at
        // the next tick, a SIGHUP reload reports the read error.
        let hash = tokio::fs::read(path)
            .await
            .map(|text| crate::cli::sha256_hex(&text));
        if signalled {
            tracing::info!(config = %path.display(), "SIGHUP; reloading the config");
        } else {
            match &hash {
                Ok(h) if *h != seen => {
                    tracing::info!(config = %path.display(), "config file changed; reloading")
                }
                _ => continue,
            }
        }
        if let Ok(h) = hash {
            seen = h;
        }
        reloader.reload(load());
    }
}

#[cfg(unix)]
type Hangup = Option<tokio::signal::unix::Signal>;
#[cfg(not(unix))]
type Hangup = ();

#[cfg(unix)]
fn hangup() -> Hangup {
    use tokio::signal::unix::{SignalKind, signal};
    signal(SignalKind::hangup())
        .inspect_err(|e| tracing::warn!("cannot handle SIGHUP: {e}"))
        .ok()
}

#[cfg(not(unix))]
fn hangup() -> Hangup {}

/// The next SIGHUP (never, without a handler).
#[cfg(unix)]
async fn recv(h: &mut Hangup) {
    match h {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending().await,
    }
}

#[cfg(not(unix))]
async fn recv(_: &mut Hangup) {
    std::future::pending().await
}

#[cfg(test)]
mod tests;
