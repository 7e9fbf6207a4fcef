//! An in-process fake Kubernetes API server for discovery tests (no cluster exists here).
//!
//! Serves Pods (`/api/v1/namespaces/{ns}/pods`), InferencePools
//! (`/apis/inference.networking.k8s.io/v1/namespaces/{ns}/inferencepools`) and InferenceObjectives
//! (llm-d's and GIE's groups, `v1alpha2`) the way the real API server does for kube-runtime's
//! watcher:
//! - list: `{kind: PodList, metadata: {resourceVersion}, items}` (items without apiVersion/kind),
//!   filtered by `labelSelector` (equality requirements only: `k=v`, `k==v`, `k!=v`) and
//!   `fieldSelector` (`metadata.name=...` only); anything else is a 400.
//! - watch (`watch=true`): a chunked stream of newline-delimited `{type, object}` events with
//!   resourceVersion greater than the one asked for. As with a real selector-filtered watch, an
//!   object that stops matching arrives as DELETED and one that starts matching as ADDED. A watch
//!   from a compacted resourceVersion gets an `ERROR` event with a `410 Expired` Status, then
//!   ends. `timeoutSeconds` ends the stream cleanly.
//!
//! Test knobs: [`FakeKube::disconnected`] aborts every open watch mid-stream (the connection is
//! reset) and applies changes before anyone can reconnect, optionally compacting history so the
//! reconnect gets 410 and must relist; [`FakeKube::hold_lists`] delays list responses.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};
use tokio::sync::watch;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Pod,
    InferencePool,
    /// llm-d's InferenceObjective (`llm-d.ai/v1alpha2`).
    LlmdObjective,
    /// GIE's InferenceObjective (`inference.networking.x-k8s.io/v1alpha2`).
    GieObjective,
}

impl Kind {
    fn api_version(self) -> &'static str {
        match self {
            Kind::Pod => "v1",
            Kind::InferencePool => "inference.networking.k8s.io/v1",
            Kind::LlmdObjective => "llm-d.ai/v1alpha2",
            Kind::GieObjective => "inference.networking.x-k8s.io/v1alpha2",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Pod => "Pod",
            Kind::InferencePool => "InferencePool",
            Kind::LlmdObjective | Kind::GieObjective => "InferenceObjective",
        }
    }
}

/// One change in the history: the object before and after (None = absent).
struct Change {
    rv: u64,
    kind: Kind,
    namespace: String,
    old: Option<Value>,
    new: Option<Value>,
}

/// The stored cluster state; mutate it through [`FakeKube`].
#[derive(Default)]
pub struct Cluster {
    rv: u64,
    objects: BTreeMap<(Kind, String, String), Value>,
    history: Vec<Change>,
    /// Watches from a resourceVersion below this get 410.
    compacted: u64,
    /// Bumped to abort every open watch.
    epoch: u64,
    lists: u64,
    watches: u64,
    /// TokenReview: token -> username of the tokens the server authenticates.
    tokens: BTreeMap<String, String>,
}

impl Cluster {
    /// Makes TokenReviews of `token` answer authenticated as `username`.
    pub fn authenticate(&mut self, token: &str, username: &str) {
        self.tokens.insert(token.into(), username.into());
    }

    /// Creates or replaces an object (by kind, `metadata.namespace`, `metadata.name`).
    pub fn put(&mut self, kind: Kind, mut object: Value) {
        self.rv += 1;
        object["apiVersion"] = json!(kind.api_version());
        object["kind"] = json!(kind.name());
        object["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        let key = key(kind, &object);
        let old = self.objects.insert(key.clone(), object.clone());
        self.history.push(Change {
            rv: self.rv,
            kind,
            namespace: key.1,
            old,
            new: Some(object),
        });
    }

    pub fn delete(&mut self, kind: Kind, namespace: &str, name: &str) {
        let key = (kind, namespace.to_string(), name.to_string());
        let Some(mut old) = self.objects.remove(&key) else {
            panic!("no {name} to delete");
        };
        self.rv += 1;
        old["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.history.push(Change {
            rv: self.rv,
            kind,
            namespace: key.1,
            old: Some(old),
            new: None,
        });
    }

    /// Forgets the history: watches resuming from an older resourceVersion get 410 Gone.
    pub fn compact(&mut self) {
        self.compacted = self.rv;
        self.history.clear();
    }
}

fn key(kind: Kind, object: &Value) -> (Kind, String, String) {
    let s = |k: &str| object["metadata"][k].as_str().expect(k).to_string();
    (kind, s("namespace"), s("name"))
}

struct Shared {
    cluster: Mutex<Cluster>,
    /// Bumped on every change (and on a disconnect) to wake the watches.
    changed: watch::Sender<()>,
    hold_lists: watch::Sender<bool>,
}

/// A running fake API server.
pub struct FakeKube {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeKube {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeKube {
    pub async fn start() -> FakeKube {
        let shared = Arc::new(Shared {
            cluster: Mutex::default(),
            changed: watch::Sender::new(()),
            hold_lists: watch::Sender::new(false),
        });
        let app = Router::new()
            .route(
                "/api/v1/namespaces/{ns}/pods",
                get(|s, p, q| serve(s, p, q, Kind::Pod)),
            )
            .route(
                "/apis/inference.networking.k8s.io/v1/namespaces/{ns}/inferencepools",
                get(|s, p, q| serve(s, p, q, Kind::InferencePool)),
            )
            .route(
                "/apis/llm-d.ai/v1alpha2/namespaces/{ns}/inferenceobjectives",
                get(|s, p, q| serve(s, p, q, Kind::LlmdObjective)),
            )
            .route(
                "/apis/inference.networking.x-k8s.io/v1alpha2/namespaces/{ns}/inferenceobjectives",
                get(|s, p, q| serve(s, p, q, Kind::GieObjective)),
            )
            .route(
                "/apis/authentication.k8s.io/v1/tokenreviews",
                axum::routing::post(token_review),
            )
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        FakeKube { addr, shared, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Applies changes that open watches see as they happen.
    pub fn change(&self, f: impl FnOnce(&mut Cluster)) {
        f(&mut self.shared.cluster.lock().unwrap());
        self.shared.changed.send_replace(());
    }

    /// Aborts every open watch mid-stream and applies `f` before any watch can reconnect.
    pub fn disconnected(&self, f: impl FnOnce(&mut Cluster)) {
        self.change(|c| {
            c.epoch += 1;
            f(c);
        });
    }

    pub fn hold_lists(&self, hold: bool) {
        self.shared.hold_lists.send_replace(hold);
    }

    /// (list requests, watch requests) received so far.
    pub fn requests(&self) -> (u64, u64) {
        let c = self.shared.cluster.lock().unwrap();
        (c.lists, c.watches)
    }
}

async fn serve(
    State(shared): State<Arc<Shared>>,
    Path(namespace): Path<String>,
    Query(q): Query<BTreeMap<String, String>>,
    kind: Kind,
) -> Response {
    let selector = match Selector::parse(&q) {
        Ok(s) => s,
        Err(message) => return status(StatusCode::BAD_REQUEST, "BadRequest", &message),
    };
    if q.get("watch").is_some_and(|w| w == "true" || w == "1") {
        return watch(shared, namespace, kind, selector, &q);
    }
    shared.cluster.lock().unwrap().lists += 1;
    let mut held = shared.hold_lists.subscribe();
    let _ = held.wait_for(|hold| !hold).await;
    let c = shared.cluster.lock().unwrap();
    let items: Vec<Value> = c
        .objects
        .iter()
        .filter(|((k, ns, _), o)| *k == kind && *ns == namespace && selector.matches(o))
        .map(|(_, o)| {
            let mut item = o.clone();
            let map = item.as_object_mut().expect("object");
            map.remove("apiVersion");
            map.remove("kind");
            item
        })
        .collect();
    let list = json!({
        "apiVersion": kind.api_version(),
        "kind": format!("{}List", kind.name()),
        "metadata": {"resourceVersion": c.rv.to_string()},
        "items": items,
    });
    axum::Json(list).into_response()
}

/// `POST tokenreviews`: authenticated when the token was registered with
/// [`Cluster::authenticate`] (the review echoed back with its status, as the API server does).
async fn token_review(
    State(shared): State<Arc<Shared>>,
    axum::Json(mut review): axum::Json<Value>,
) -> Response {
    let token = review["spec"]["token"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let user = shared.cluster.lock().unwrap().tokens.get(&token).cloned();
    review["status"] = match user {
        Some(username) => json!({"authenticated": true, "user": {"username": username}}),
        None => json!({"authenticated": false, "error": "invalid bearer token"}),
    };
    (StatusCode::CREATED, axum::Json(review)).into_response()
}

fn watch(
    shared: Arc<Shared>,
    namespace: String,
    kind: Kind,
    selector: Selector,
    q: &BTreeMap<String, String>,
) -> Response {
    let from: u64 = q
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_secs(290), Duration::from_secs);
    let deadline = tokio::time::Instant::now() + timeout;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(16);
    let mut wake = shared.changed.subscribe();
    let epoch = {
        let mut c = shared.cluster.lock().unwrap();
        c.watches += 1;
        c.epoch
    };
    tokio::spawn(async move {
        let line = |v: Value| Ok(Bytes::from(format!("{v}\n")));
        let mut cursor = from;
        loop {
            wake.borrow_and_update();
            // Decide under the lock, send after it.
            let (events, end) = {
                let c = shared.cluster.lock().unwrap();
                if c.epoch != epoch {
                    let broken =
                        std::io::Error::new(std::io::ErrorKind::ConnectionReset, "watch broken");
                    (vec![Err(broken)], true)
                } else if cursor < c.compacted {
                    let gone = json!({"type": "ERROR", "object": {
                        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": format!("too old resource version: {cursor} ({})", c.compacted),
                        "reason": "Expired", "code": 410}});
                    (vec![line(gone)], true)
                } else {
                    let mut out = Vec::new();
                    for change in c.history.iter().filter(|ch| ch.rv > cursor) {
                        if change.kind == kind && change.namespace == namespace {
                            out.extend(selector.event(change).map(line));
                        }
                    }
                    cursor = cursor.max(c.rv);
                    (out, false)
                }
            };
            for event in events {
                if tx.send(event).await.is_err() {
                    return;
                }
            }
            if end {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => return,
                r = wake.changed() => if r.is_err() { return },
            }
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from_stream(stream))
        .expect("response")
}

fn status(code: StatusCode, reason: &str, message: &str) -> Response {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16()});
    (code, axum::Json(body)).into_response()
}

/// Equality label requirements and a `metadata.name` field selector.
struct Selector {
    labels: Vec<(String, String, bool)>,
    name: Option<String>,
}

impl Selector {
    fn parse(q: &BTreeMap<String, String>) -> Result<Selector, String> {
        let mut labels = Vec::new();
        for r in q
            .get("labelSelector")
            .into_iter()
            .flat_map(|s| s.split(','))
        {
            let (k, v, eq) = if let Some((k, v)) = r.split_once("!=") {
                (k, v, false)
            } else if let Some((k, v)) = r.split_once("==").or_else(|| r.split_once('=')) {
                (k, v, true)
            } else {
                return Err(format!("unsupported label requirement {r:?}"));
            };
            labels.push((k.trim().to_string(), v.trim().to_string(), eq));
        }
        let name = match q.get("fieldSelector") {
            None => None,
            Some(f) => match f.strip_prefix("metadata.name=") {
                Some(n) => Some(n.to_string()),
                None => return Err(format!("unsupported field selector {f:?}")),
            },
        };
        Ok(Selector { labels, name })
    }

    fn matches(&self, o: &Value) -> bool {
        let meta = &o["metadata"];
        self.name.as_ref().is_none_or(|n| meta["name"] == json!(n))
            && self
                .labels
                .iter()
                .all(|(k, v, eq)| (meta["labels"][k].as_str() == Some(v.as_str())) == *eq)
    }

    /// The watch event a selector-filtered watch sees for a change, if any.
    fn event(&self, change: &Change) -> Option<Value> {
        let was = change.old.as_ref().is_some_and(|o| self.matches(o));
        let is = change.new.as_ref().is_some_and(|o| self.matches(o));
        let (kind, object) = match (was, is) {
            (false, true) => ("ADDED", change.new.clone()),
            (true, true) => ("MODIFIED", change.new.clone()),
            (true, false) => ("DELETED", change.new.clone().or_else(|| change.old.clone())),
            (false, false) => return None,
        };
        Some(json!({"type": kind, "object": object}))
    }
}

/// A kubeconfig file content pointing at the fake server.
pub fn kubeconfig(url: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster: {{server: \"{url}\"}}\n\
         users:\n- name: fake\n  user: {{}}\ncontexts:\n- name: fake\n  context: {{cluster: fake, user: fake}}\n\
         current-context: fake\n"
    )
}
