//! Process wiring: builds the router from a config and runs the gRPC and admin listeners until
//! shutdown. Tests start it in-process on port 0 and stop it through the cancellation token.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tonic_health::pb::health_server::{Health, HealthServer};

use crate::admin::{self, Admin};
use crate::config::Config;
use crate::discovery::{DiscoveryMetrics, KubernetesDiscovery, kubernetes};
use crate::endpoints::{EndpointSpec, PodId, Update};
use crate::envoy::ExtProc;
use crate::envoy::access_log::AccessLogSink;
use crate::metrics::{PrefixCacheMetrics, RouterMetrics, pod_label_values};
use crate::pod_metrics::{self, ScrapeConfig};
use crate::routing::Router;
use crate::tls::{ClientAuth, ClientCertFor, ServerTls};

/// Health service names served on the gRPC port and the health port (besides the ext_proc
/// service's own name); `inference-extension` is what GIE's chart probes.
pub const HEALTH_SERVICES: [&str; 4] = ["liveness", "readiness", "", "inference-extension"];

/// The health services that report NOT_SERVING until ready and again while draining.
pub const READINESS_SERVICES: [&str; 3] = ["readiness", "", "inference-extension"];

/// Where to listen. `health`: a plaintext gRPC health-only listener (kubelet probes cannot
/// speak TLS), besides the health service on the gRPC port.
#[derive(Debug, Clone, Copy)]
pub struct Listeners<'a> {
    pub grpc: &'a str,
    pub admin: &'a str,
    pub health: Option<&'a str>,
}

/// A running picker.
pub struct Running {
    pub grpc_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub health_addr: Option<SocketAddr>,
    /// Who may call the debug endpoints (`off`, `loopback`, ...), for the start-up line.
    pub debug_endpoints: &'static str,
    /// The shared KV-event socket's endpoint (`picker.kvEvents.bind`), with the port bound.
    pub kv_events_bound: Option<String>,
    pub router: Arc<Router>,
    pub shutdown: CancellationToken,
    tasks: JoinSet<anyhow::Result<()>>,
    ready: Arc<AtomicBool>,
    health: tonic_health::server::HealthReporter,
    drain_delay: Duration,
    grace: Duration,
    /// Reports ready once Kubernetes discovery has listed the pods (see [`start`]).
    ready_waiter: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("grpc_addr", &self.grpc_addr)
            .field("admin_addr", &self.admin_addr)
            .field("health_addr", &self.health_addr)
            .finish_non_exhaustive()
    }
}

impl Running {
    /// Graceful shutdown (SIGTERM): report not-ready first (`/readyz` 503, gRPC health
    /// [`READINESS_SERVICES`] NOT_SERVING; liveness stays up), wait `shutdownDelaySeconds` so load
    /// balancers notice, then stop accepting streams and let open ones finish for up to
    /// `shutdownGraceSeconds`; whatever is still open then is dropped.
    pub async fn drain(mut self) -> anyhow::Result<()> {
        if let Some(waiter) = self.ready_waiter.take() {
            // Finished or cancelled before readiness goes down, never after.
            waiter.abort();
            let _ = waiter.await;
        }
        self.ready.store(false, Ordering::Relaxed);
        for name in READINESS_SERVICES {
            self.health
                .set_service_status(name, tonic_health::ServingStatus::NotServing)
                .await;
        }
        tracing::info!(delay = ?self.drain_delay, grace = ?self.grace, "draining: reported not ready");
        tokio::time::sleep(self.drain_delay).await;
        self.shutdown.cancel();
        let grace = self.grace;
        match tokio::time::timeout(grace, self.wait()).await {
            Ok(r) => r,
            Err(_) => {
                tracing::warn!(
                    ?grace,
                    "open streams did not finish within the grace period; dropping them"
                );
                self.tasks.abort_all();
                Ok(())
            }
        }
    }

    /// Cancels and waits for every task.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        self.wait().await
    }

    /// Waits until the picker stops (after the token is cancelled).
    pub async fn wait(&mut self) -> anyhow::Result<()> {
        while let Some(r) = self.tasks.join_next().await {
            r??;
        }
        Ok(())
    }
}

/// The static endpoints of a config as discovery data.
pub fn static_endpoints(config: &Config) -> Vec<EndpointSpec> {
    config
        .endpoints
        .iter()
        .map(|e| EndpointSpec {
            id: PodId {
                namespace: e.namespace.clone(),
                name: e.name.clone(),
            },
            address: e.address,
            models: e.models.clone(),
            generation: e.generation.clone().unwrap_or_default(),
            role: None,
            labels: e.labels.clone(),
            kv_events: e.kv_events_endpoint.as_ref().map(|endpoint| {
                crate::endpoints::KvEventsAddress {
                    endpoint: endpoint.clone(),
                    replay: e.kv_events_replay_endpoint.clone(),
                }
            }),
            // Static endpoints carry no start time: their kvcache-aware ownership is kept.
            containers_started: None,
            engine_started: None,
        })
        .collect()
}

/// Binds the gRPC and admin listeners and starts serving.
pub async fn start(config: Config, grpc: &str, admin: &str) -> anyhow::Result<Running> {
    start_with(
        config,
        Listeners {
            grpc,
            admin,
            health: None,
        },
    )
    .await
}

/// Binds every listener and starts serving, step by step: listeners, router, discovery, health,
/// the gRPC, admin and health servers, engine scraping, route expiry, sync, readiness.
pub async fn start_with(config: Config, listen: Listeners<'_>) -> anyhow::Result<Running> {
    // A bad certificate stops start-up before anything listens.
    let tls = config.picker.tls.server()?;
    let debug_access = Arc::new(config.picker.debug.access().await?);
    let listeners = bind(listen).await?;
    let (grpc_addr, admin_addr, health_addr) = listeners.addrs()?;

    let registry = prometheus::Registry::new();
    let (router, prefix_metrics) = router(&config, &registry);
    let discovery = discovery(&config, &router, &registry).await?;
    // A socket that cannot be bound stops start-up, as a listener does.
    let shared_events = match &config.picker.kv_events.bind {
        Some(at) => {
            let filter = &config.picker.kv_events.topic_prefix;
            Some(crate::kv_events::SharedSocket::bind(at, filter).await?)
        }
        None => None,
    };
    let kv_events_bound = shared_events.as_ref().map(|s| s.bound().to_string());

    let shutdown = CancellationToken::new();
    let ready = Arc::new(AtomicBool::new(false));
    let mut tasks = JoinSet::new();
    watch_objectives(&config, &router, &shutdown, &mut tasks).await?;

    // Not ready until the sync warm replay is done (or timed out) and discovery has listed the
    // pods; see `readiness`.
    let wait_before_ready = discovery.is_some() || config.sync.is_some();
    let admin = Admin {
        router: router.clone(),
        registry: registry.clone(),
        prefix_metrics,
        ready: ready.clone(),
        debug: debug_access.clone(),
    };
    let health = serve_listeners(
        listeners,
        &config,
        tls.as_ref(),
        wait_before_ready,
        admin,
        &shutdown,
        &mut tasks,
    )
    .await?;
    let pods_listed = discovery.as_ref().map(KubernetesDiscovery::synced);
    let sync = start_background(
        &config,
        &router,
        &registry,
        pods_listed,
        shared_events,
        &shutdown,
        &mut tasks,
    )?;
    let ready_waiter = readiness(discovery, sync, &ready, &health, &shutdown, &mut tasks).await;
    Ok(Running {
        grpc_addr,
        admin_addr,
        health_addr,
        debug_endpoints: debug_access.as_str(),
        kv_events_bound,
        router,
        shutdown,
        tasks,
        ready,
        health,
        drain_delay: Duration::from_secs_f64(config.picker.shutdown_delay_seconds),
        grace: Duration::from_secs_f64(config.picker.shutdown_grace_seconds),
        ready_waiter,
    })
}

/// Serves the health (when asked for), gRPC and admin listeners; returns the health reporter
/// that readiness flips.
async fn serve_listeners(
    listeners: Bound,
    config: &Config,
    tls: Option<&ServerTls>,
    wait_before_ready: bool,
    admin: Admin,
    shutdown: &CancellationToken,
    tasks: &mut JoinSet<anyhow::Result<()>>,
) -> anyhow::Result<tonic_health::server::HealthReporter> {
    let (health, health_service) = health(wait_before_ready).await;
    if let Some(listener) = listeners.health {
        serve_health(listener, health_service.clone(), shutdown, tasks);
    }
    let router = admin.router.clone();
    serve_grpc(
        listeners.grpc,
        config,
        tls,
        health_service,
        &router,
        shutdown,
        tasks,
    )?;
    serve_admin(listeners.admin, admin, shutdown, tasks);
    Ok(health)
}

/// The background tasks: engine scraping, route expiry, KV-event subscribers, kvcache-aware,
/// and sync, whose warm replay waits for the pods listed and the engines' generations known.
fn start_background(
    config: &Config,
    router: &Arc<Router>,
    registry: &prometheus::Registry,
    pods_listed: Option<watch::Receiver<bool>>,
    shared_events: Option<crate::kv_events::SharedSocket>,
    shutdown: &CancellationToken,
    tasks: &mut JoinSet<anyhow::Result<()>>,
) -> anyhow::Result<Option<crate::sync::Sync>> {
    let generations_known = scrape_engines(config, router, registry, shutdown, tasks);
    expire_routes(router, shutdown, tasks);
    dispatch_queued(router, shutdown, tasks);
    follow_engines(config, router, shared_events, shutdown, tasks);
    start_kvcache(config, router, shutdown, tasks)?;
    let Some(sync) = &config.sync else {
        return Ok(None);
    };
    let env = |name: &str| std::env::var(name).ok();
    let gates = pods_listed.into_iter().chain([generations_known]).collect();
    let sync = crate::sync::start(&sync.redis, router, registry, &env, gates, shutdown, tasks)?;
    Ok(Some(sync))
}

/// kvcache-aware, when the config enables it: the shared Redis connection (Kthena's
/// `REDIS_*` environment), the lookup the ext_proc streams await and the hourly GC. Redis
/// being down is no error: the connection is retried, and requests are routed without the
/// plugin's score meanwhile.
fn start_kvcache(
    config: &Config,
    router: &Arc<Router>,
    shutdown: &CancellationToken,
    tasks: &mut JoinSet<anyhow::Result<()>>,
) -> anyhow::Result<()> {
    if config.scheduler.kvcache_aware().is_none() {
        return Ok(());
    }
    let env = |name: &str| config.env_var(name);
    let target = crate::kvcache::redis_env::from_env(&env)?;
    tracing::info!(redis = %target.shown, "kvcache-aware: reading block owners from Redis");
    let metrics = router.metrics.kvcache.clone();
    let status = crate::sync::connection::LinkStatus {
        context: "kvcache",
        role: "kvcache-aware",
        connected: metrics.redis_connected.clone(),
        reconnects: None,
    };
    // Kthena's 5 s Redis timeout bounds each command; a request waits at most the lookup's
    // deadline (crate::kvcache::lookup::DEADLINE).
    let store =
        crate::kvcache::KvStore::start(target, Duration::from_secs(5), status, shutdown, tasks)?;
    let tokenizer = crate::tokenizer::EngineTokenizer::new(crate::tokenizer::TokenizerConfig {
        timeout: crate::kvcache::lookup::TOKENIZE_TIMEOUT,
        ..crate::tokenizer::TokenizerConfig::default()
    })?;
    let engine = config
        .picker
        .tokenizer
        .as_ref()
        .map_or(crate::tokenizer::EngineKind::Vllm, |t| t.engine);
    let lookup = crate::kvcache::KvLookup::new(store.clone(), tokenizer, engine, metrics.clone());
    let _ = router.kv_lookup.set(Arc::new(lookup));
    let token = shutdown.clone();
    tasks.spawn(async move {
        crate::kvcache::gc::run(store, metrics.gc_removed, token).await;
        Ok(())
    });
    Ok(())
}

/// The bound listeners.
struct Bound {
    grpc: TcpListener,
    admin: TcpListener,
    health: Option<TcpListener>,
}

impl Bound {
    fn addrs(&self) -> anyhow::Result<(SocketAddr, SocketAddr, Option<SocketAddr>)> {
        let health = self
            .health
            .as_ref()
            .map(TcpListener::local_addr)
            .transpose()?;
        Ok((self.grpc.local_addr()?, self.admin.local_addr()?, health))
    }
}

/// Binds every listener, naming the one that fails.
async fn bind(listen: Listeners<'_>) -> anyhow::Result<Bound> {
    let bind = |addr: &str, what: &'static str| {
        let addr = addr.to_string();
        async move {
            TcpListener::bind(&addr)
                .await
                .map_err(|e| anyhow::anyhow!("cannot listen on {addr} ({what}): {e}"))
        }
    };
    let grpc = bind(listen.grpc, "gRPC").await?;
    let admin = bind(listen.admin, "admin").await?;
    let health = match listen.health {
        Some(addr) => Some(bind(addr, "gRPC health").await?),
        None => None,
    };
    Ok(Bound {
        grpc,
        admin,
        health,
    })
}

/// The router over the config's static endpoints, its metrics in `registry`.
fn router(config: &Config, registry: &prometheus::Registry) -> (Arc<Router>, PrefixCacheMetrics) {
    let prefix_metrics = PrefixCacheMetrics::register(registry);
    let metrics = RouterMetrics::register(registry);
    let router = Arc::new(Router::assemble(
        config.scheduler.clone(),
        config.picker.clone(),
        prefix_metrics.clone(),
        metrics,
    ));
    router
        .endpoints
        .apply(Update::Reset(static_endpoints(config)));
    (router, prefix_metrics)
}

/// InferenceObjectives for flow control's priorities, when `discovery.kubernetes` asks.
async fn watch_objectives(
    config: &Config,
    router: &Arc<Router>,
    shutdown: &CancellationToken,
    tasks: &mut JoinSet<anyhow::Result<()>>,
) -> anyhow::Result<()> {
    let Some(k) = config
        .discovery
        .kubernetes
        .as_ref()
        .filter(|k| k.inference_objectives)
    else {
        return Ok(());
    };
    let client = kubernetes::infer_client().await?;
    let pool = match &k.source {
        crate::discovery::Source::InferencePool(name) => Some(name.clone()),
        crate::discovery::Source::Static(_) => None,
    };
    let (namespace, priorities, token) = (
        k.process_namespace(),
        router.flow.objectives.clone(),
        shutdown.clone(),
    );
    tasks.spawn(async move {
        crate::discovery::inference_objective::watch(client, namespace, pool, priorities, token)
            .await;
        Ok(())
    });
    Ok(())
}

/// Kubernetes discovery, when configured: not ready until the first full pod list is applied.
async fn discovery(
    config: &Config,
    router: &Router,
    registry: &prometheus::Registry,
) -> anyhow::Result<Option<KubernetesDiscovery>> {
    Ok(match &config.discovery.kubernetes {
        Some(k) => Some(
            KubernetesDiscovery::new(
                kubernetes::infer_client().await?,
                k.process_namespace(),
                k.clone(),
                static_endpoints(config),
                router.endpoints.clone(),
                DiscoveryMetrics::register(registry),
            )
            .with_pd_group(config.scheduler.pd.clone())
            .keeping_labels(
                config
                    .scheduler
                    .epp
                    .as_ref()
                    .map_or_else(Vec::new, |p| p.label_keys()),
            ),
        ),
        None => None,
    })
}

/// The gRPC health services: serving, except [`READINESS_SERVICES`] when start-up must wait
/// before reporting ready.
async fn health(
    wait_before_ready: bool,
) -> (
    tonic_health::server::HealthReporter,
    HealthServer<impl Health>,
) {
    let (health, health_service) = tonic_health::server::health_reporter();
    for name in HEALTH_SERVICES {
        let status = if wait_before_ready && READINESS_SERVICES.contains(&name) {
            tonic_health::ServingStatus::NotServing
        } else {
            tonic_health::ServingStatus::Serving
        };
        health.set_service_status(name, status).await;
    }
    health
        .set_serving::<envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessorServer<ExtProc>>()
        .await;
    (health, health_service)
}

/// The plaintext health-only listener (kubelet probes cannot speak TLS).
fn serve_health<H: Health>(
    listener: TcpListener,
    health_service: HealthServer<H>,
    shutdown: &CancellationToken,
    tasks: &mut JoinSet<anyhow::Result<()>>,
) {
    let token = shutdown.clone();
    tasks.spawn(async move {
        tonic::transport::Server::builder()
            .add_service(health_service)
            .serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(listener),
                token.cancelled(),
            )
            .await?;
        Ok(())
    });
}

/// The gRPC listener: ext_proc, the access log and health, with TLS when configured.
fn serve_grpc<H: Health>(
    listener: TcpListener,
    config: &Config,
    tls: Option<&ServerTls>,
    health_service: HealthServer<H>,
    router: &Arc<Router>,
    shutdown: &CancellationToken,
    tasks: &mut JoinSet<anyhow::Result<()>>,
) -> anyhow::Result<()> {
    let router = router.clone();
    let token = shutdown.clone();
    let grace = Duration::from_secs_f64(config.picker.shutdown_grace_seconds);
    let mut server = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        server = server.tls_config(server_tls_config(tls))?;
    }
    let access_log = AccessLogSink::new(router.clone(), token.clone(), grace).require_client_cert(
        config
            .picker
            .tls
            .requires_client_cert(ClientCertFor::AccessLog),
    );
    tasks.spawn(async move {
        server
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .add_service(health_service)
            .add_service(access_log.into_server())
            .add_service(ExtProc::new(router).into_server())
            .serve_with_incoming_shutdown(
                // Envoy waits on every reply: never let Nagle + delayed ACK add 40 ms.
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
                token.cancelled(),
            )
            .await?;
        Ok(())
    });
    Ok(())
}

/// tonic's TLS settings: the identity, and the client CAs when client certificates are asked for
/// (`optional`: rustls's verifier with unauthenticated clients allowed).
fn server_tls_config(tls: &ServerTls) -> tonic::transport::ServerTlsConfig {
    use tonic::transport::{Certificate, Identity, ServerTlsConfig};
    let id = &tls.identity;
    let config = ServerTlsConfig::new().identity(Identity::from_pem(&id.cert_pem, &id.key_pem));
    match &tls.client_ca_pem {
        Some(cas) => config
            .client_ca_root(Certificate::from_pem(cas))
            .client_auth_optional(tls.client_auth != ClientAuth::Required),
        None => config,
    }
}

/// The admin listener (`/metrics`, probes, `/debug/explain`).
fn serve_admin(
    listener: TcpListener,
    admin: Admin,
    shutdown: &CancellationToken,
    tasks: &mut JoinSet<anyhow::Result<()>>,
) {
    let app = admin::app(admin);
    let token = shutdown.clone();
    tasks.spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(token.cancelled_owned())
        .await?;
        Ok(())
    });
}

/// Engine-metrics scraping, when enabled. Returns whether the static pods' generations are
/// known: static pods without `generation:` learn it from their engine's first scrape (without
/// scraping it stays unknown, which matches any record).
fn scrape_engines(
    config: &Config,
    router: &Router,
    registry: &prometheus::Registry,
    shutdown: &CancellationToken,
    tasks: &mut JoinSet<anyhow::Result<()>>,
) -> watch::Receiver<bool> {
    let scraping = config.picker.scrape_interval_seconds > 0.0;
    let scrape_metrics = pod_metrics::ScrapeMetrics::register(registry);
    let (first_scrape, generations_known) =
        watch::channel(!scraping || config.endpoints.iter().all(|e| e.generation.is_some()));
    if scraping {
        let scrape = ScrapeConfig {
            interval: Duration::from_secs_f64(config.picker.scrape_interval_seconds),
            timeout: Duration::from_secs_f64(config.picker.scrape_timeout_seconds),
            concurrency: config.picker.scrape_concurrency,
            budget: config
                .scheduler
                .affinity
                .filter(|a| a.engine_budget)
                .map(|affinity| pod_metrics::EngineBudget {
                    affinity,
                    block_bytes: config.scheduler.prefix_cache.block_size_to_hash,
                }),
            names: config.picker.engine_metrics.resolve(),
        };
        let (endpoints, metrics, token) = (
            router.endpoints.clone(),
            router.metrics.clone(),
            shutdown.clone(),
        );
        tasks.spawn(async move {
            pod_metrics::run(
                endpoints,
                metrics,
                scrape_metrics,
                scrape,
                first_scrape,
                token,
            )
            .await;
            Ok(())
        });
    }
    generations_known
}

/// Engine truth: a KV-event subscriber per publishing pod ([`crate::engine_events`]), the
/// shared socket's reader when one is bound, and, with `picker.tokenizer`, the background
/// tokenizer of prompt heads.
fn follow_engines(
    config: &Config,
    router: &Arc<Router>,
    shared_events: Option<crate::kv_events::SharedSocket>,
    shutdown: &CancellationToken,
    tasks: &mut JoinSet<anyhow::Result<()>>,
) {
    if let Some(socket) = shared_events {
        let follow = crate::engine_events::shared::follow(
            socket,
            router.endpoints.clone(),
            router.metrics.engine.clone(),
            shutdown.clone(),
        );
        tasks.spawn(async move {
            follow.await;
            Ok(())
        });
    }
    let follow = crate::engine_events::follow(
        router.endpoints.clone(),
        config.picker.kv_events.clone(),
        router.metrics.engine.clone(),
        shutdown.clone(),
    );
    tasks.spawn(async move {
        follow.await;
        Ok(())
    });
    if let Some(heads) = &router.heads {
        let run = heads.clone().run(shutdown.clone());
        tasks.spawn(async move {
            run.await;
            Ok(())
        });
    }
}

/// Flow control's dispatcher ([`crate::routing::flow::run_dispatcher`]); on shutdown it sends
/// every queued request on.
fn dispatch_queued(
    router: &Arc<Router>,
    shutdown: &CancellationToken,
    tasks: &mut JoinSet<anyhow::Result<()>>,
) {
    let (router, token) = (router.clone(), shutdown.clone());
    tasks.spawn(async move {
        crate::routing::flow::run_dispatcher(router, token).await;
        Ok(())
    });
}

/// Expires completions nobody observed (every second); samples how many still wait.
fn expire_routes(
    router: &Arc<Router>,
    shutdown: &CancellationToken,
    tasks: &mut JoinSet<anyhow::Result<()>>,
) {
    let router = router.clone();
    let token = shutdown.clone();
    tasks.spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut pod_series: HashSet<PodId> = HashSet::new();
        loop {
            tokio::select! {
                _ = token.cancelled() => break,
                _ = tick.tick() => {
                    sample_pod_gauges(&router, &mut pod_series);
                    router.expire_pending(Instant::now());
                    let holds = router.scheduler.tentative().holds();
                    router.metrics.tentative_holds.set(i64::try_from(holds).unwrap_or(i64::MAX));
                    let waiting = i64::try_from(router.pending.len()).unwrap_or(i64::MAX);
                    router.metrics.pending_routes.set(waiting);
                }
            }
        }
        Ok(())
    });
}

/// Every second: each pod's `prefix_picker_pod_index_churn_ratio` while the affinity mode
/// places by churn, and what its latency model learned (`prefix_picker_pod_concurrency`,
/// `prefix_picker_pod_kv_capacity_blocks`,
/// `prefix_picker_pod_service_seconds`, `prefix_picker_prefill_seconds_per_token`) while it
/// runs; removes the series of pods gone since the last sample (or of every pod, once the mode
/// is off), so a pod that left mid-sample keeps no series.
fn sample_pod_gauges(router: &Router, series: &mut HashSet<PodId>) {
    let live = router.scheduler.load();
    let affinity = live.scheduler.affinity();
    let on = affinity.is_some_and(|a| a.place_by_churn);
    let latency = affinity.is_some_and(|a| a.latency_model);
    let set = router.endpoints.snapshot();
    let index = router.endpoints.index();
    let m = &router.metrics;
    let mut now: HashSet<PodId> = HashSet::new();
    for e in set.all() {
        let labels = pod_label_values(&e.spec.id);
        if on {
            m.pod_churn
                .with_label_values(&labels)
                .set(index.churn(&e.index));
            now.insert(e.spec.id.clone());
        }
        if latency {
            if let Some(c) = e.timing.concurrency() {
                m.pod_concurrency.with_label_values(&labels).set(c);
                now.insert(e.spec.id.clone());
            }
            if let Some(s) = e.timing.service() {
                m.pod_service.with_label_values(&labels).set(s);
                now.insert(e.spec.id.clone());
            }
            if let Some(c) = e
                .timing
                .kv()
                .capacity()
                .filter(|_| e.timing.kv().admits_by_kv())
            {
                m.pod_kv_capacity.with_label_values(&labels).set(c);
                now.insert(e.spec.id.clone());
            }
        }
    }
    if latency {
        m.prefill_per_token
            .set(live.scheduler.prefill_rate().seconds_per_token());
    }
    for gone in series.iter() {
        let labels = pod_label_values(gone);
        if !now.contains(gone) || !on {
            let _ = m.pod_churn.remove_label_values(&labels);
        }
        if !now.contains(gone) || !latency {
            let _ = m.pod_concurrency.remove_label_values(&labels);
            let _ = m.pod_service.remove_label_values(&labels);
            let _ = m.pod_kv_capacity.remove_label_values(&labels);
        }
    }
    *series = now;
}

/// Reports ready: with Kubernetes discovery, after the first pod list and then the sync warm
/// replay (which needs the pods), from a waiter task that is returned; else once the warm
/// replay (if any) is done.
async fn readiness(
    discovery: Option<KubernetesDiscovery>,
    sync: Option<crate::sync::Sync>,
    ready: &Arc<AtomicBool>,
    health: &tonic_health::server::HealthReporter,
    shutdown: &CancellationToken,
    tasks: &mut JoinSet<anyhow::Result<()>>,
) -> Option<tokio::task::JoinHandle<()>> {
    let Some(discovery) = discovery else {
        if let Some(sync) = sync {
            sync.warm().await;
        }
        ready.store(true, Ordering::Relaxed);
        for name in READINESS_SERVICES {
            health
                .set_service_status(name, tonic_health::ServingStatus::Serving)
                .await;
        }
        return None;
    };
    let mut listed = discovery.synced();
    let token = shutdown.clone();
    tasks.spawn(async move {
        discovery.run(token).await;
        Ok(())
    });
    let (ready, health, token) = (ready.clone(), health.clone(), shutdown.clone());
    Some(tokio::spawn(async move {
        let warmed = async {
            if listed.wait_for(|l| *l).await.is_err() {
                return false;
            }
            tracing::info!("Kubernetes pods listed");
            if let Some(sync) = sync {
                sync.warm().await;
            }
            true
        };
        let warmed = tokio::select! {
            _ = token.cancelled() => false,
            w = warmed => w,
        };
        if warmed {
            ready.store(true, Ordering::Relaxed);
            for name in READINESS_SERVICES {
                health
                    .set_service_status(name, tonic_health::ServingStatus::Serving)
                    .await;
            }
            tracing::info!("ready");
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::live::Generation;
    use crate::testing::{router_from_config, spec, three};

    /// The pods with a `prefix_picker_pod_index_churn_ratio` series, sorted.
    fn churn_pods(registry: &prometheus::Registry) -> Vec<String> {
        let mut pods: Vec<String> = registry
            .gather()
            .iter()
            .filter(|f| f.name() == "prefix_picker_pod_index_churn_ratio")
            .flat_map(|f| f.get_metric().iter())
            .flat_map(|m| m.get_label().iter())
            .filter(|l| l.name() == "model_server_pod")
            .map(|l| l.value().to_string())
            .collect();
        pods.sort();
        pods
    }

    #[test]
    fn the_churn_gauge_follows_the_pods_and_the_mode() {
        let registry = prometheus::Registry::new();
        let router = router_from_config("picker: {affinity: {}}\n", three(), &registry);
        let mut series = HashSet::new();
        sample_pod_gauges(&router, &mut series);
        assert_eq!(churn_pods(&registry), ["pod-0", "pod-1", "pod-2"]);

        // A pod gone: its series goes with it.
        router.endpoints.apply(Update::Reset(three()[..2].to_vec()));
        sample_pod_gauges(&router, &mut series);
        assert_eq!(churn_pods(&registry), ["pod-0", "pod-1"]);

        // A series set for a pod that left between the snapshot and the set (after the
        // endpoint store forgot it) is removed by the next sample.
        let late = spec("pod-9", 18009, &[]);
        router
            .metrics
            .pod_churn
            .with_label_values(&pod_label_values(&late.id))
            .set(0.5);
        series.insert(late.id);
        assert_eq!(churn_pods(&registry), ["pod-0", "pod-1", "pod-9"]);
        sample_pod_gauges(&router, &mut series);
        assert_eq!(churn_pods(&registry), ["pod-0", "pod-1"]);

        // The mode reloaded off: no series left.
        let off =
            Config::parse("picker: {affinity: {experimental: {placeByChurn: false}}}\n").unwrap();
        let scheduler = router.scheduler.load().scheduler.reconfigured(
            off.scheduler,
            off.picker.max_endpoints,
            off.picker.seed,
        );
        router.scheduler.store(Generation {
            scheduler,
            picker: off.picker,
        });
        sample_pod_gauges(&router, &mut series);
        assert!(churn_pods(&registry).is_empty());
        assert!(series.is_empty());
    }
}
