//! The shared socket: one ZeroMQ SUB socket the picker binds and every engine's publisher
//! connects to (llm-d's `kvEventsConfig.zmqEndpoint`, here `picker.kvEvents.bind`), instead of
//! one subscriber per pod connecting to each engine's own PUB socket ([`super::subscriber`]).
//!
//! - [`BindEndpoint`]: where to bind, `tcp://HOST:PORT`, HOST `*` (every interface), an IP or a
//!   bracketed IPv6; port 0 lets the system choose ([`SharedSocket::bound`] says which). Parsed
//!   once, errors naming the value ([`BindEndpointError`]).
//! - [`SharedSocket::recv`]: the next message, split into `[topic, seq, payload]` as every
//!   vLLM message is (`seq` 8 bytes big-endian, from 0 per publisher), or why not
//!   ([`Refusal`]): not three frames, a bad sequence frame, or a topic outside the filter
//!   (llm-d's `topicFilter`, ZeroMQ's subscription). The socket subscribes to the filter, so the
//!   publishers drop other topics before sending; the check here covers publishers that do not
//!   filter.
//!
//! Which pod a message is for, its sequence and its decoding are the caller's
//! (`engine_events::shared`): this socket neither knows pods nor replays (an engine that
//! connects has no replay endpoint the picker could know).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use serde::Deserialize;
use zeromq::{Socket, SocketRecv, SubSocket, ZmqMessage};

/// Where the shared socket binds, as written (`tcp://*:5557`) and as an address.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct BindEndpoint {
    written: String,
    address: SocketAddr,
}

/// Why a bind endpoint is refused; each names the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BindEndpointError {
    #[error(
        "{0:?} is not tcp://HOST:PORT (the shared KV-event socket is ZeroMQ over TCP, e.g. tcp://*:5557)"
    )]
    NotTcp(String),
    #[error(
        "{value:?}: the host must be * (every interface), an IP address or a bracketed IPv6 address of this host, got {host:?}"
    )]
    Host { value: String, host: String },
    #[error("{value:?}: the port must be a number 0-65535, got {port:?}")]
    Port { value: String, port: String },
}

impl TryFrom<String> for BindEndpoint {
    type Error = BindEndpointError;

    fn try_from(written: String) -> Result<BindEndpoint, BindEndpointError> {
        let Some((host, port)) = written
            .strip_prefix("tcp://")
            .and_then(|rest| rest.rsplit_once(':'))
        else {
            return Err(BindEndpointError::NotTcp(written));
        };
        let Ok(port) = port.parse::<u16>() else {
            return Err(BindEndpointError::Port {
                port: port.to_string(),
                value: written,
            });
        };
        let ip = match host {
            "*" => Some(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
            _ => match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
                Some(v6) => v6.parse().ok().filter(IpAddr::is_ipv6),
                None => host.parse().ok().filter(IpAddr::is_ipv4),
            },
        };
        let Some(ip) = ip else {
            return Err(BindEndpointError::Host {
                host: host.to_string(),
                value: written,
            });
        };
        Ok(BindEndpoint {
            address: SocketAddr::new(ip, port),
            written,
        })
    }
}

impl fmt::Display for BindEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.written)
    }
}

impl BindEndpoint {
    /// The address bound (`*` is `0.0.0.0`).
    pub fn address(&self) -> SocketAddr {
        self.address
    }
}

/// Why a message was not one ([`SharedSocket::recv`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Not three frames: how many.
    Frames(usize),
    /// A sequence frame that is not 8 bytes: its length.
    SeqFrame(usize),
    /// A topic outside the filter.
    Topic(Vec<u8>),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Frames(n) => write!(f, "{n} frames, expected 3 (topic, seq, payload)"),
            Refusal::SeqFrame(n) => write!(f, "a {n}-byte sequence frame, expected 8"),
            Refusal::Topic(t) => write!(
                f,
                "topic {:?} outside the filter",
                String::from_utf8_lossy(t)
            ),
        }
    }
}

/// One message of a publisher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub topic: Vec<u8>,
    pub seq: u64,
    pub payload: Vec<u8>,
}

/// The bound SUB socket.
pub struct SharedSocket {
    socket: SubSocket,
    bound: String,
    filter: Vec<u8>,
}

impl fmt::Debug for SharedSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedSocket")
            .field("bound", &self.bound)
            .field("filter", &self.filter)
            .finish_non_exhaustive()
    }
}

/// The shared socket could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("picker.kvEvents.bind {at}: {source}")]
pub struct BindError {
    at: String,
    source: zeromq::ZmqError,
}

impl SharedSocket {
    /// Binds at `at` and subscribes to the topics that start with `filter` (empty: all).
    pub async fn bind(at: &BindEndpoint, filter: &str) -> Result<SharedSocket, BindError> {
        let error = |source| BindError {
            at: at.to_string(),
            source,
        };
        let mut socket = SubSocket::new();
        let bound = socket
            .bind(&format!("tcp://{}", at.address))
            .await
            .map_err(error)?;
        socket.subscribe(filter).await.map_err(error)?;
        Ok(SharedSocket {
            socket,
            bound: bound.to_string(),
            filter: filter.as_bytes().to_vec(),
        })
    }

    /// The endpoint bound, with the port the system chose for port 0.
    pub fn bound(&self) -> &str {
        &self.bound
    }

    /// The next message, or why the one received is not one. `Err` is the socket's own: a
    /// publisher's connection that broke (the socket serves the others still).
    pub async fn recv(&mut self) -> Result<Result<Message, Refusal>, zeromq::ZmqError> {
        let message = self.socket.recv().await?;
        Ok(split(message, &self.filter))
    }
}

/// `[topic, seq, payload]`, the topic within `filter`.
fn split(message: ZmqMessage, filter: &[u8]) -> Result<Message, Refusal> {
    if message.len() != 3 {
        return Err(Refusal::Frames(message.len()));
    }
    let frame = |i| message.get(i).map(|f| f.as_ref()).unwrap_or_default();
    let topic = frame(0);
    if !topic.starts_with(filter) {
        return Err(Refusal::Topic(topic.to_vec()));
    }
    let seq: [u8; 8] = frame(1)
        .try_into()
        .map_err(|_| Refusal::SeqFrame(frame(1).len()))?;
    Ok(Message {
        topic: topic.to_vec(),
        seq: u64::from_be_bytes(seq),
        payload: frame(2).to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<BindEndpoint, BindEndpointError> {
        BindEndpoint::try_from(s.to_string())
    }

    #[test]
    fn bind_endpoints_are_tcp_on_an_address_of_this_host() {
        let every = parse("tcp://*:5557").unwrap();
        assert_eq!(every.address(), "0.0.0.0:5557".parse().unwrap());
        assert_eq!(every.to_string(), "tcp://*:5557");
        assert_eq!(
            parse("tcp://0.0.0.0:5557").unwrap().address(),
            "0.0.0.0:5557".parse().unwrap()
        );
        assert_eq!(
            parse("tcp://[::]:0").unwrap().address(),
            "[::]:0".parse().unwrap()
        );
        assert_eq!(
            parse("tcp://127.0.0.1:0").unwrap().address().port(),
            0,
            "the system chooses"
        );
    }

    #[test]
    fn bad_bind_endpoints_are_refused_naming_the_value() {
        for (bad, says) in [
            ("ipc:///tmp/kv", "\"ipc:///tmp/kv\" is not tcp://HOST:PORT"),
            ("tcp://5557", "\"tcp://5557\" is not tcp://HOST:PORT"),
            ("*:5557", "\"*:5557\" is not tcp://HOST:PORT"),
            (
                "tcp://*:kv",
                "the port must be a number 0-65535, got \"kv\"",
            ),
            ("tcp://*:70000", "got \"70000\""),
            ("tcp://*:", "got \"\""),
            ("tcp://epp:5557", "the host must be *"),
            ("tcp://::1:5557", "got \"::1\""),
            ("tcp://[10.0.0.1]:5557", "got \"[10.0.0.1]\""),
        ] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
            assert!(e.contains(&format!("{bad:?}")), "names the value: {e}");
        }
    }

    fn message(frames: &[&[u8]]) -> ZmqMessage {
        let mut message = ZmqMessage::from(frames[0].to_vec());
        for f in &frames[1..] {
            message.push_back(f.to_vec().into());
        }
        message
    }

    #[test]
    fn messages_are_split_and_checked() {
        let seq = 7u64.to_be_bytes();
        assert_eq!(
            split(message(&[b"kv@a@m", &seq, b"p"]), b"kv@"),
            Ok(Message {
                topic: b"kv@a@m".to_vec(),
                seq: 7,
                payload: b"p".to_vec(),
            })
        );
        assert_eq!(
            split(message(&[b"kv@a@m", &seq]), b"kv@"),
            Err(Refusal::Frames(2))
        );
        assert_eq!(
            split(message(&[b"kv@a@m", b"1234", b"p"]), b"kv@"),
            Err(Refusal::SeqFrame(4))
        );
        assert_eq!(
            split(message(&[b"other", &seq, b"p"]), b"kv@"),
            Err(Refusal::Topic(b"other".to_vec()))
        );
        assert!(split(message(&[b"", &seq, b"p"]), b"").is_ok());
    }
}
