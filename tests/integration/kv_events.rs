//! The KV-event subscriber against an independent publisher: `tests/wire/kv_events_wire.py`
//! (msgspec encoding as vLLM declares its structs, pyzmq/libzmq publishing, vLLM's replay
//! handler), from `.venv-wire`, installed by `scripts/test`. Also checks that the script still
//! prints the golden payloads the unit tests decode. Missing tools are a failure, never a skip.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use prefix_picker::kv_events::{
    EngineBlockHash, KvEvent, Limits, ResetReason, Subscriber, SubscriberConfig, SubscriberStats,
    Update,
};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::harness::{DEADLINE, root};

/// The Python of `.venv-wire` (`$WIRE_PYTHON` first).
pub(crate) fn wire_python() -> PathBuf {
    let python = std::env::var_os("WIRE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".venv-wire/bin/python"));
    assert!(
        python.exists(),
        "{} missing: run scripts/test (it installs tests/wire/requirements.txt into .venv-wire \
         and sets WIRE_PYTHON)",
        python.display()
    );
    python
}

fn script() -> PathBuf {
    root().join("tests/wire/kv_events_wire.py")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn the_encoder_still_prints_the_golden_payloads() {
    let out = std::process::Command::new(wire_python())
        .arg(script())
        .arg("golden")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let golden = std::fs::read_to_string(root().join("tests/wire/golden.txt")).unwrap();
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        golden,
        "tests/wire/golden.txt is stale: regenerate it with `kv_events_wire.py golden`"
    );
}

/// The publisher script, driven line by line (also the shared socket's connecting publisher,
/// [`crate::kv_events_shared`]).
pub(crate) struct Publisher {
    _child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    pub_port: u16,
    replay_port: u16,
}

impl Publisher {
    /// A publisher whose replay replies are SGLang's and earlier vLLM's (`[seq, payload]`).
    async fn start(topic: &str) -> Publisher {
        Publisher::launch(&["publish", topic]).await
    }

    /// A publisher whose replay replies are current vLLM's (`[topic, seq, payload]`).
    async fn start_with_topic_in_replay(topic: &str) -> Publisher {
        Publisher::launch(&["publish", topic, "topic-in-replay"]).await
    }

    /// Connects to `endpoint` (the script's `connect` mode, as a vLLM whose endpoint has no
    /// `*`) and waits until the subscriber's subscription reached it (what is published before
    /// would be dropped by the publisher).
    pub(crate) async fn connect(endpoint: &str) -> Publisher {
        let mut p = Publisher::spawn(&["connect", endpoint]);
        while !p.line().await.starts_with("subscribed") {}
        p
    }

    async fn launch(args: &[&str]) -> Publisher {
        let mut p = Publisher::spawn(args);
        let line = p.line().await;
        let ports: Vec<u16> = line
            .strip_prefix("ports ")
            .unwrap_or_else(|| panic!("expected ports, got {line:?}"))
            .split(' ')
            .map(|p| p.parse().unwrap())
            .collect();
        (p.pub_port, p.replay_port) = (ports[0], ports[1]);
        p
    }

    fn spawn(args: &[&str]) -> Publisher {
        let mut child = Command::new(wire_python())
            .arg(script())
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        Publisher {
            _child: child,
            stdin,
            stdout,
            pub_port: 0,
            replay_port: 0,
        }
    }

    async fn line(&mut self) -> String {
        match tokio::time::timeout(DEADLINE, self.stdout.next_line()).await {
            Ok(Ok(Some(line))) => line,
            other => panic!("the publisher script stopped: {other:?}"),
        }
    }

    /// Waits until a subscriber's subscription reached the publisher (subscribers take every
    /// topic and read theirs).
    async fn subscribed(&mut self) {
        let want = "subscribed ";
        while self.line().await != want {}
    }

    /// Waits until a new subscriber's subscription reached the publisher and the publisher
    /// answered its catch-up at connect (a replay from 0), in either order.
    async fn subscribed_and_caught_up(&mut self) {
        let want = "subscribed ";
        let (mut subscribed, mut replayed) = (false, false);
        while !(subscribed && replayed) {
            let line = self.line().await;
            subscribed |= line == want;
            replayed |= line == "replayed 0";
        }
    }

    /// Runs one command and waits for its `ok`.
    pub(crate) async fn run(&mut self, command: &str) {
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .unwrap();
        self.stdin.flush().await.unwrap();
        loop {
            let line = self.line().await;
            if line == "ok" {
                return;
            }
            assert!(
                line.starts_with("subscribed") || line.starts_with("replayed"),
                "{command}: {line:?}"
            );
        }
    }

    /// Publishes batch `seq` (one block, hash 1000 + seq, chained on batch seq - 1's) on
    /// `topic` (`connect` mode).
    pub(crate) async fn publish(&mut self, topic: &str, seq: u64) {
        self.run(&format!("pub {topic} {seq}")).await;
    }

    /// Publishes raw frames.
    async fn raw(&mut self, frames: &[&[u8]]) {
        let args: Vec<String> = frames
            .iter()
            .map(|f| if f.is_empty() { "-".into() } else { hex(f) })
            .collect();
        self.run(&format!("raw {}", args.join(" "))).await;
    }

    fn config(&self, topic: &str, replay: bool) -> SubscriberConfig {
        SubscriberConfig {
            endpoint: format!("tcp://127.0.0.1:{}", self.pub_port),
            replay_endpoint: replay.then(|| format!("tcp://127.0.0.1:{}", self.replay_port)),
            topic: topic.into(),
            topic_prefix: String::new(),
            limits: Limits {
                max_payload_bytes: 4096,
                ..Limits::default()
            },
        }
    }
}

/// A running subscriber and its updates.
struct Running {
    updates: mpsc::Receiver<Update>,
    stats: Arc<SubscriberStats>,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    fn start(config: SubscriberConfig) -> Running {
        let subscriber = Subscriber::new(config);
        let stats = subscriber.stats();
        let (tx, updates) = mpsc::channel(64);
        let cancel = CancellationToken::new();
        let task = tokio::spawn(subscriber.run(tx, cancel.clone()));
        Running {
            updates,
            stats,
            cancel,
            task,
        }
    }

    async fn next(&mut self) -> Update {
        match tokio::time::timeout(DEADLINE, self.updates.recv()).await {
            Ok(Some(u)) => u,
            other => panic!("no update: {other:?}"),
        }
    }

    /// The next update, which must be batch `seq` as the script builds it.
    async fn batch(&mut self, seq: u64) {
        match self.next().await {
            Update::Batch { seq: s, batch } => {
                assert_eq!(s, seq);
                assert_eq!(batch.ts, 1_000_000.0 + seq as f64);
                assert_eq!(batch.data_parallel_rank, Some(0));
                let [KvEvent::BlockStored { block_hashes, .. }] = batch.events.as_slice() else {
                    panic!("batch {seq}: {:?}", batch.events);
                };
                assert_eq!(block_hashes, &[EngineBlockHash(1000 + seq)]);
            }
            other => panic!("expected batch {seq}, got {other:?}"),
        }
    }

    async fn stop(self) {
        self.cancel.cancel();
        tokio::time::timeout(DEADLINE, self.task)
            .await
            .expect("the subscriber stops when cancelled")
            .unwrap();
    }
}

fn count(c: &std::sync::atomic::AtomicU64) -> u64 {
    c.load(Relaxed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gaps_are_replayed_or_reset_and_bad_messages_counted() {
    let topic = "kv@pod-a";
    let mut publisher = Publisher::start(topic).await;
    let mut sub = Running::start(publisher.config(topic, true));
    assert_eq!(sub.next().await, Update::Connected);
    publisher.subscribed_and_caught_up().await;

    publisher.run("pub 0").await;
    publisher.run("pub 1").await;
    sub.batch(0).await;
    sub.batch(1).await;

    // Another topic sharing the prefix, garbage, a payload over the limit, two frames: all
    // dropped and counted, and none of them advances the sequence.
    let seq2 = 2u64.to_be_bytes();
    publisher.raw(&[b"kv@pod-a-other", &seq2, &[0x90]]).await;
    publisher
        .raw(&[topic.as_bytes(), &seq2, b"\xde\xad\xbe\xef"])
        .await;
    publisher
        .raw(&[topic.as_bytes(), &seq2, &[0u8; 5000]])
        .await;
    publisher.raw(&[topic.as_bytes(), &seq2]).await;
    publisher.run("pub 2").await;
    sub.batch(2).await;
    assert_eq!(count(&sub.stats.wrong_topic), 1);
    assert_eq!(count(&sub.stats.decode_errors), 3);
    assert_eq!(count(&sub.stats.gaps), 0);

    // 3 and 4 lost in transit but held for replay: delivered before 5.
    publisher.run("lose 3").await;
    publisher.run("lose 4").await;
    publisher.run("pub 5").await;
    sub.batch(3).await;
    sub.batch(4).await;
    sub.batch(5).await;
    assert_eq!(count(&sub.stats.gaps), 1);
    // The catch-up at connect (nothing held then) and this gap.
    assert_eq!(count(&sub.stats.replays), 2);
    assert_eq!(count(&sub.stats.replayed_batches), 2);

    // 6 never held: replay cannot fill the gap.
    publisher.run("pub 7").await;
    assert_eq!(
        sub.next().await,
        Update::Reset {
            reason: ResetReason::ReplayIncomplete {
                expected: 6,
                received: 7,
                replayed: 0
            }
        }
    );
    sub.batch(7).await;

    // The sequence goes back: the publisher restarted.
    publisher.run("pub 0").await;
    assert_eq!(
        sub.next().await,
        Update::Reset {
            reason: ResetReason::PublisherRestarted {
                last: 7,
                received: 0
            }
        }
    );
    sub.batch(0).await;
    assert_eq!(count(&sub.stats.resets), 2);
    assert_eq!(count(&sub.stats.decoded), 8);
    assert_eq!(count(&sub.stats.received), 10);

    sub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_replay_a_gap_resets_and_a_lost_connection_comes_back() {
    let topic = "";
    let mut publisher = Publisher::start(topic).await;
    let mut sub = Running::start(publisher.config(topic, false));
    assert_eq!(sub.next().await, Update::Connected);
    publisher.subscribed().await;

    publisher.run("pub 0").await;
    publisher.run("pub 2").await;
    sub.batch(0).await;
    assert_eq!(
        sub.next().await,
        Update::Reset {
            reason: ResetReason::NoReplayEndpoint {
                expected: 1,
                received: 2
            }
        }
    );
    sub.batch(2).await;

    // The publisher's socket closes and binds again on the same port: a new connection, whose
    // first batch is not the next one.
    publisher.run("restart").await;
    assert_eq!(sub.next().await, Update::Disconnected);
    assert_eq!(sub.next().await, Update::Connected);
    publisher.subscribed().await;
    publisher.run("pub 5").await;
    assert_eq!(
        sub.next().await,
        Update::Reset {
            reason: ResetReason::Reconnected {
                expected: 3,
                received: 5
            }
        }
    );
    sub.batch(5).await;
    assert_eq!(count(&sub.stats.reconnects), 1);

    sub.stop().await;
}

/// Current vLLM's replay replies carry the topic (its end marker an empty one): a gap is filled
/// through them as through the older replies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_with_the_topic_fill_a_gap() {
    let topic = "kv";
    let mut publisher = Publisher::start_with_topic_in_replay(topic).await;
    let mut sub = Running::start(publisher.config(topic, true));
    assert_eq!(sub.next().await, Update::Connected);
    publisher.subscribed_and_caught_up().await;
    publisher.run("pub 0").await;
    publisher.run("lose 1").await;
    publisher.run("lose 2").await;
    publisher.run("pub 3").await;
    for seq in 0..4 {
        sub.batch(seq).await;
    }
    assert_eq!(count(&sub.stats.gaps), 1);
    assert_eq!(count(&sub.stats.replayed_batches), 2);
    assert_eq!(count(&sub.stats.resets), 0);
    sub.stop().await;
}

/// A subscriber that starts beside a publisher that already sent batches (an idle engine, warm)
/// delivers what the replay buffer holds as soon as it connects; live batches it already
/// delivered are dropped. After a reset, the first batch is preceded by what the buffer holds
/// before it, when that runs unbroken up to it; otherwise only the batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_sequence_catches_up_from_the_replay_buffer() {
    let topic = "kv";
    let mut publisher = Publisher::start_with_topic_in_replay(topic).await;
    for seq in 0..3 {
        publisher.run(&format!("lose {seq}")).await;
    }
    let mut sub = Running::start(publisher.config(topic, true));
    assert_eq!(sub.next().await, Update::Connected);
    for seq in 0..3 {
        sub.batch(seq).await;
    }
    publisher.subscribed_and_caught_up().await;
    // A live batch the catch-up delivered already, then the next one.
    publisher.run("pub 2").await;
    publisher.run("pub 3").await;
    sub.batch(3).await;
    assert_eq!(count(&sub.stats.replays), 1);
    assert_eq!(count(&sub.stats.replayed_batches), 3);
    assert_eq!(count(&sub.stats.gaps), 0);
    assert_eq!(count(&sub.stats.resets), 0);

    // The publisher restarts and sends before the subscriber is back: its new life is caught up.
    publisher.run("restart").await;
    assert_eq!(sub.next().await, Update::Disconnected);
    assert_eq!(sub.next().await, Update::Connected);
    publisher.subscribed().await;
    publisher.run("lose 0").await;
    publisher.run("lose 1").await;
    publisher.run("pub 2").await;
    assert_eq!(
        sub.next().await,
        Update::Reset {
            reason: ResetReason::PublisherRestarted {
                last: 3,
                received: 2
            }
        }
    );
    for seq in 0..3 {
        sub.batch(seq).await;
    }

    // Its buffer no longer holds the start of its life: the run from the oldest batch it holds.
    publisher.run("restart").await;
    assert_eq!(sub.next().await, Update::Disconnected);
    assert_eq!(sub.next().await, Update::Connected);
    publisher.subscribed().await;
    for seq in 0..4 {
        publisher.run(&format!("lose {seq}")).await;
    }
    publisher.run("forget").await;
    publisher.run("pub 4").await;
    assert_eq!(
        sub.next().await,
        Update::Reset {
            reason: ResetReason::Reconnected {
                expected: 3,
                received: 4
            }
        }
    );
    for seq in 1..5 {
        sub.batch(seq).await;
    }

    // A hole in what it holds: nothing before the batch is delivered.
    publisher.run("restart").await;
    assert_eq!(sub.next().await, Update::Disconnected);
    assert_eq!(sub.next().await, Update::Connected);
    publisher.subscribed().await;
    publisher.run("lose 0").await;
    publisher.run("lose 2").await;
    publisher.run("pub 3").await;
    assert_eq!(
        sub.next().await,
        Update::Reset {
            reason: ResetReason::PublisherRestarted {
                last: 4,
                received: 3
            }
        }
    );
    sub.batch(3).await;
    publisher.run("pub 4").await;
    sub.batch(4).await;
    assert_eq!(count(&sub.stats.replays), 4);
    assert_eq!(count(&sub.stats.replayed_batches), 3 + 2 + 3);
    assert_eq!(count(&sub.stats.resets), 3);

    sub.stop().await;
}

/// A first batch with nothing before it to continue (the buffer held nothing at connect, then
/// batches were lost in transit) is preceded by what the buffer holds before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_batch_is_preceded_by_what_the_buffer_holds() {
    let topic = "";
    let mut publisher = Publisher::start(topic).await;
    let mut sub = Running::start(publisher.config(topic, true));
    assert_eq!(sub.next().await, Update::Connected);
    publisher.subscribed_and_caught_up().await;
    publisher.run("lose 0").await;
    publisher.run("lose 1").await;
    publisher.run("pub 2").await;
    for seq in 0..3 {
        sub.batch(seq).await;
    }
    assert_eq!(count(&sub.stats.replays), 2);
    assert_eq!(count(&sub.stats.replayed_batches), 2);
    assert_eq!(count(&sub.stats.gaps), 0);
    sub.stop().await;
}

/// A replay that brings more bytes than the limit is abandoned: nothing is caught up, the view
/// starts at the next batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_over_the_byte_limit_is_abandoned() {
    let topic = "";
    let mut publisher = Publisher::start(topic).await;
    for seq in 0..4 {
        publisher.run(&format!("lose {seq}")).await;
    }
    let mut config = publisher.config(topic, true);
    // A batch is about 150 bytes: two fit, four do not.
    config.limits.max_replay_bytes = 400;
    let mut sub = Running::start(config);
    assert_eq!(sub.next().await, Update::Connected);
    publisher.subscribed_and_caught_up().await;
    publisher.run("pub 4").await;
    sub.batch(4).await;
    assert_eq!(count(&sub.stats.replays), 2);
    assert_eq!(count(&sub.stats.replayed_batches), 0);
    sub.stop().await;
}

/// A subscriber with no topic configured (vLLM's default) reads the one topic its publisher
/// sends on, in the catch-up's replies and live; one configured with another topic delivers
/// nothing and counts each message it drops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_topic_reads_the_publishers_and_another_topic_delivers_nothing() {
    let topic = "kv-events";
    let mut publisher = Publisher::start_with_topic_in_replay(topic).await;
    publisher.run("lose 0").await;
    let mut sub = Running::start(publisher.config("", true));
    assert_eq!(sub.next().await, Update::Connected);
    sub.batch(0).await;
    publisher.subscribed_and_caught_up().await;
    publisher.run("pub 1").await;
    sub.batch(1).await;
    assert!(sub.stats.adopted_topic.load(Relaxed));
    assert_eq!(count(&sub.stats.wrong_topic), 0);
    sub.stop().await;

    let mut other = Running::start(publisher.config("kv", true));
    assert_eq!(other.next().await, Update::Connected);
    publisher.subscribed().await;
    publisher.run("pub 2").await;
    publisher.run("pub 3").await;
    tokio::time::timeout(DEADLINE, async {
        while count(&other.stats.wrong_topic) < 2 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("both messages counted as on another topic");
    assert!(other.updates.try_recv().is_err(), "nothing delivered");
    assert!(!other.stats.adopted_topic.load(Relaxed));
    other.stop().await;
}

/// A topic prefix (an `EndpointPickerConfig`'s `kvEventsConfig.topicFilter`, ZeroMQ's
/// subscription filter): a publisher whose topic starts with it is read (without the warning an
/// empty topic's adoption gives), one on another topic or on the empty topic delivers nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_prefix_reads_the_publishers_that_start_with_it() {
    let prefixed = |p: &Publisher| SubscriberConfig {
        topic: String::new(),
        topic_prefix: "kv@".into(),
        ..p.config("", false)
    };
    let mut publisher = Publisher::start("kv@pod-a@m").await;
    let mut sub = Running::start(prefixed(&publisher));
    assert_eq!(sub.next().await, Update::Connected);
    publisher.subscribed().await;
    publisher.run("pub 0").await;
    publisher.run("pub 1").await;
    sub.batch(0).await;
    sub.batch(1).await;
    assert!(
        !sub.stats.adopted_topic.load(Relaxed),
        "no warning: asked for"
    );
    assert_eq!(count(&sub.stats.wrong_topic), 0);
    sub.stop().await;

    for topic in ["", "kv-events"] {
        let mut publisher = Publisher::start(topic).await;
        let mut other = Running::start(prefixed(&publisher));
        assert_eq!(other.next().await, Update::Connected);
        publisher.subscribed().await;
        publisher.run("pub 0").await;
        publisher.run("pub 1").await;
        tokio::time::timeout(DEADLINE, async {
            while count(&other.stats.wrong_topic) < 2 {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{topic:?}: both messages counted as on another topic"));
        assert!(
            other.updates.try_recv().is_err(),
            "{topic:?}: nothing delivered"
        );
        other.stop().await;
    }
}
