//! The engine-events fault rows (issue 55): the shipped engine-events row with its event
//! stream misconfigured the ways deployments get it wrong, to measure whether the picker falls
//! back to the estimate (the shipped row without event endpoints) or below it.
//!
//! - [`EventFault::TopicMismatch`]: the sims publish on topic [`ENGINE_TOPIC`] (`"kv-events"`,
//!   one many deployments set) while the picker's `picker.kvEvents.topic` is left at its
//!   default, `""` (vLLM's default).
//! - [`EventFault::SilentPublisher`]: every pod's `kvEventsEndpoint` names a
//!   [`SilentPublisher`], a real ZeroMQ PUB socket that accepts the picker's subscriber and never
//!   sends; its `kvEventsReplayEndpoint` a ROUTER that answers every replay request with vLLM's
//!   end marker alone (nothing buffered). The sims still publish, on sockets no one reads.

use bytes::Bytes;
use testkit::KvEventPorts;
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

use super::picker_config::Pod;

/// The topic the sims of a [`EventFault::TopicMismatch`] row publish on.
pub const ENGINE_TOPIC: &str = "kv-events";

/// How an engine-events fault row's event stream is wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventFault {
    TopicMismatch,
    SilentPublisher,
}

impl EventFault {
    pub const ALL: [EventFault; 2] = [EventFault::TopicMismatch, EventFault::SilentPublisher];

    /// The fault's name in its row's name.
    pub fn as_str(self) -> &'static str {
        match self {
            EventFault::TopicMismatch => "topic mismatch",
            EventFault::SilentPublisher => "silent publisher",
        }
    }

    /// The topic the sims publish on under this fault (`""`: vLLM's default, the picker's).
    pub fn engine_topic(self) -> &'static str {
        match self {
            EventFault::TopicMismatch => ENGINE_TOPIC,
            EventFault::SilentPublisher => "",
        }
    }
}

/// A ZeroMQ publisher that never publishes: a PUB socket and a replay ROUTER on
/// `127.0.0.1`, held by a task that answers replay requests with the end marker (stopped and
/// unbound on drop).
#[derive(Debug)]
pub struct SilentPublisher {
    ports: KvEventPorts,
    task: tokio::task::JoinHandle<()>,
}

impl SilentPublisher {
    /// Binds both sockets on port 0.
    pub async fn start() -> anyhow::Result<SilentPublisher> {
        let mut publish = zeromq::PubSocket::new();
        let publish_port = port(publish.bind("tcp://127.0.0.1:0").await?)?;
        let mut replay = zeromq::RouterSocket::new();
        let replay_port = port(replay.bind("tcp://127.0.0.1:0").await?)?;
        let task = tokio::spawn(async move {
            // Owned here so the PUB socket keeps accepting subscribers until the task ends.
            let _publish = publish;
            while let Ok(request) = replay.recv().await {
                let Some(client) = request.into_vec().into_iter().next() else {
                    continue;
                };
                // vLLM's end of replay: [identity, "", "", -1 as 8 bytes, ""].
                let end = vec![
                    client,
                    Bytes::new(),
                    Bytes::new(),
                    Bytes::copy_from_slice(&(-1i64).to_be_bytes()),
                    Bytes::new(),
                ];
                let end = ZmqMessage::try_from(end).expect("never empty");
                if replay.send(end).await.is_err() {
                    break;
                }
            }
        });
        Ok(SilentPublisher {
            ports: KvEventPorts {
                publish: publish_port,
                replay: replay_port,
            },
            task,
        })
    }

    /// Its PUB and replay ports, as a sim's.
    pub fn ports(&self) -> KvEventPorts {
        self.ports
    }
}

impl Drop for SilentPublisher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The TCP port of a bound endpoint.
fn port(endpoint: zeromq::Endpoint) -> anyhow::Result<u16> {
    match endpoint {
        zeromq::Endpoint::Tcp(_, port) => Ok(port),
        other => anyhow::bail!("bound {other}, not a TCP endpoint"),
    }
}

/// `pods` with every pod's KV-event sockets replaced by those of a new [`SilentPublisher`]
/// (returned: they stop when dropped).
pub async fn silent_pods(pods: &[Pod]) -> anyhow::Result<(Vec<Pod>, Vec<SilentPublisher>)> {
    let mut silent = Vec::with_capacity(pods.len());
    let mut out = Vec::with_capacity(pods.len());
    for pod in pods {
        let publisher = SilentPublisher::start().await?;
        out.push(Pod {
            kv_events: Some(publisher.ports()),
            ..pod.clone()
        });
        silent.push(publisher);
    }
    Ok((out, silent))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn only_the_topic_mismatch_moves_the_engines_off_the_default_topic() {
        assert_eq!(EventFault::TopicMismatch.engine_topic(), "kv-events");
        assert_eq!(EventFault::SilentPublisher.engine_topic(), "");
        let names: Vec<&str> = EventFault::ALL.iter().map(|f| f.as_str()).collect();
        assert_eq!(names, ["topic mismatch", "silent publisher"]);
    }

    #[tokio::test]
    async fn a_silent_publisher_accepts_a_subscriber_sends_nothing_and_replays_nothing() {
        let silent = SilentPublisher::start().await.unwrap();
        let ports = silent.ports();
        assert_ne!(ports.publish, ports.replay);
        let mut sub = zeromq::SubSocket::new();
        tokio::time::timeout(Duration::from_secs(5), sub.connect(&ports.endpoint()))
            .await
            .expect("the PUB socket accepts the subscriber")
            .unwrap();
        sub.subscribe("").await.unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(300), sub.recv())
                .await
                .is_err(),
            "it never sends"
        );
        // A replay from seq 0: only the end marker.
        let mut dealer = zeromq::DealerSocket::new();
        dealer.connect(&ports.replay_endpoint()).await.unwrap();
        let request = ZmqMessage::try_from(vec![
            Bytes::new(),
            Bytes::copy_from_slice(&0i64.to_be_bytes()),
        ])
        .unwrap();
        dealer.send(request).await.unwrap();
        let reply = tokio::time::timeout(Duration::from_secs(5), dealer.recv())
            .await
            .expect("a reply")
            .unwrap()
            .into_vec();
        assert_eq!(reply.len(), 4, "{reply:?}");
        assert!(reply[0].is_empty() && reply[1].is_empty() && reply[3].is_empty());
        assert_eq!(reply[2].as_ref(), (-1i64).to_be_bytes());
    }

    #[tokio::test]
    async fn silent_pods_keep_their_names_and_addresses_and_lose_their_sims_sockets() {
        let pods: Vec<Pod> = (0..2)
            .map(|i| Pod {
                name: format!("sim-{i}"),
                addr: format!("127.0.0.1:{}", 8000 + i).parse().unwrap(),
                kv_events: Some(KvEventPorts {
                    publish: 5557 + 2 * i,
                    replay: 5558 + 2 * i,
                }),
            })
            .collect();
        let (silent, publishers) = silent_pods(&pods).await.unwrap();
        assert_eq!(publishers.len(), 2);
        for ((s, p), publisher) in silent.iter().zip(&pods).zip(&publishers) {
            assert_eq!((&s.name, s.addr), (&p.name, p.addr));
            assert_eq!(s.kv_events, Some(publisher.ports()));
            assert_ne!(s.kv_events, p.kv_events);
        }
    }
}
