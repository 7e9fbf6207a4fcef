//! A Kubernetes Service in front of picker replicas, as kube-proxy makes one: one address, each
//! new TCP connection spliced to the next ready replica in turn (a replica whose endpoint left
//! the Service, [`Service::set_ready`], or that refuses connections is skipped). Connections
//! already open stay with their replica, as kube-proxy's do when an endpoint leaves.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// The Service: `addr` forwards to the replicas; dropped, it stops accepting.
pub struct Service {
    pub addr: SocketAddr,
    /// Connections spliced so far, per replica (in the order given).
    pub connections: Arc<Vec<AtomicUsize>>,
    ready: Arc<Vec<AtomicBool>>,
    stop: CancellationToken,
}

impl Service {
    /// Listens on a port of its own and forwards to `replicas`.
    pub async fn start(replicas: Vec<SocketAddr>) -> Service {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections: Arc<Vec<AtomicUsize>> =
            Arc::new(replicas.iter().map(|_| AtomicUsize::new(0)).collect());
        let ready: Arc<Vec<AtomicBool>> =
            Arc::new(replicas.iter().map(|_| AtomicBool::new(true)).collect());
        let stop = CancellationToken::new();
        let (token, counts, endpoints) = (stop.clone(), connections.clone(), ready.clone());
        tokio::spawn(async move {
            let next = AtomicUsize::new(0);
            loop {
                let accepted = tokio::select! {
                    _ = token.cancelled() => return,
                    a = listener.accept() => a,
                };
                let Ok((mut client, _)) = accepted else {
                    continue;
                };
                let first = next.fetch_add(1, Ordering::Relaxed);
                let (replicas, counts, endpoints) =
                    (replicas.clone(), counts.clone(), endpoints.clone());
                tokio::spawn(async move {
                    let _ = client.set_nodelay(true);
                    for i in 0..replicas.len() {
                        let at = (first + i) % replicas.len();
                        if !endpoints[at].load(Ordering::Relaxed) {
                            continue;
                        }
                        let Ok(mut upstream) = TcpStream::connect(replicas[at]).await else {
                            continue;
                        };
                        let _ = upstream.set_nodelay(true);
                        counts[at].fetch_add(1, Ordering::Relaxed);
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                        return;
                    }
                });
            }
        });
        Service {
            addr,
            connections,
            ready,
            stop,
        }
    }

    /// The endpoints controller's part: replica `i` enters (`true`) or leaves the Service.
    pub fn set_ready(&self, i: usize, ready: bool) {
        self.ready[i].store(ready, Ordering::Relaxed);
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
