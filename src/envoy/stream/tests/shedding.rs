//! Load shedding (`picker.loadShedding`): 429 with `retry-after` and an OpenAI error when every
//! pod is saturated; nothing routed, held or recorded.

use super::*;
use crate::endpoints::{EngineStats, InflightGuard};

/// How a pod is loaded before the request arrives.
#[derive(Debug, Clone, Copy)]
enum Load {
    /// Never scraped, nothing in flight.
    Idle,
    /// A fresh scrape with this engine queue and KV usage.
    Engine(f64, f64),
    /// This many requests in flight through the router.
    InFlight(usize),
}

struct Case {
    name: &'static str,
    picker: &'static str,
    loads: [Load; 3],
    path: &'static str,
    mode: i32,
    /// `Some(retry-after)`: shed; `None`: routed.
    shed: Option<&'static str>,
}

const ON: &str = "picker: {loadShedding: {maxInFlightPerPod: 2}}\n";
const BUSY: Load = Load::Engine(6.0, 0.0);

const CASES: &[Case] = &[
    Case {
        name: "every engine queue over queueDepth",
        picker: ON,
        loads: [BUSY; 3],
        path: "/v1/completions",
        mode: BUFFERED,
        shed: Some("1"),
    },
    Case {
        name: "queue, KV cache and in-flight limits, full duplex, retryAfterSeconds",
        picker: "picker: {loadShedding: {maxInFlightPerPod: 2, retryAfterSeconds: 5}}\n",
        loads: [BUSY, Load::Engine(0.0, 0.9), Load::InFlight(2)],
        path: "/v1/chat/completions",
        mode: FULL_DUPLEX,
        shed: Some("5"),
    },
    Case {
        name: "one pod with headroom",
        picker: ON,
        loads: [BUSY, Load::Engine(5.0, 0.8), Load::InFlight(2)],
        path: "/v1/completions",
        mode: BUFFERED,
        shed: None,
    },
    Case {
        name: "a pod never scraped is not saturated by its engine",
        picker: ON,
        loads: [BUSY, BUSY, Load::Idle],
        path: "/v1/completions",
        mode: FULL_DUPLEX,
        shed: None,
    },
    Case {
        name: "no in-flight limit unless set",
        picker: "picker: {loadShedding: {}}\n",
        loads: [Load::InFlight(3); 3],
        path: "/v1/completions",
        mode: BUFFERED,
        shed: None,
    },
    Case {
        name: "off by default",
        picker: "",
        loads: [BUSY; 3],
        path: "/v1/completions",
        mode: BUFFERED,
        shed: None,
    },
    Case {
        name: "enabled: false",
        picker: "picker: {loadShedding: {enabled: false, maxInFlightPerPod: 1}}\n",
        loads: [BUSY, Load::InFlight(1), BUSY],
        path: "/v1/completions",
        mode: BUFFERED,
        shed: None,
    },
    Case {
        name: "not an inference API (/v1/models)",
        picker: ON,
        loads: [BUSY; 3],
        path: "/v1/models",
        mode: BUFFERED,
        shed: None,
    },
];

fn request_body(path: &str) -> Vec<u8> {
    if path.ends_with("chat/completions") {
        serde_json::to_vec(
            &json!({"model": "m", "messages": [{"role": "user", "content": long_prompt("shed")}]}),
        )
        .unwrap()
    } else {
        completion("m", &long_prompt("shed"))
    }
}

#[test]
fn every_pod_saturated_is_429_with_retry_after_and_nothing_held() {
    for case in CASES {
        let registry = prometheus::Registry::new();
        let router = Arc::new(router_from_config(case.picker, three(), &registry));
        let mut held: Vec<InflightGuard> = Vec::new();
        for (load, port) in case.loads.iter().zip(PORTS) {
            let e = endpoint(&router, addr(port));
            match *load {
                Load::Idle => {}
                Load::Engine(waiting, kv_usage) => e.set_stats(EngineStats {
                    waiting,
                    kv_usage,
                    ..EngineStats::default()
                }),
                Load::InFlight(n) => {
                    held.extend((0..n).map(|_| InflightGuard::new(e.clone(), &router.metrics)))
                }
            }
        }
        let before = inflight(&router);
        let mut s = StreamState::new(router.clone());
        let r = s.handle(modes(
            headers(case.path, false, &[("x-request-id", "shed-1")]),
            case.mode,
            STREAMED,
        ));
        let b = request_body(case.path);
        let r = if case.mode == BUFFERED {
            assert_continue_headers(&r[0]);
            s.handle(body(&b, true))
        } else {
            assert!(r.is_empty(), "{}: FULL_DUPLEX holds the headers", case.name);
            let (first, rest) = b.split_at(b.len() / 2);
            assert!(s.handle(body(first, false)).is_empty());
            s.handle(body(rest, true))
        };
        let shed_total = router.metrics.shed.get();
        let answered_429 = router
            .metrics
            .immediate_responses
            .with_label_values(&["429"])
            .get();
        let Some(retry_after) = case.shed else {
            assert!(
                !r.is_empty() && !pick_of(&r[0]).is_empty(),
                "{}: routed: {r:?}",
                case.name
            );
            assert_eq!((shed_total, answered_429), (0, 0), "{}", case.name);
            continue;
        };
        let message = assert_error(&r, 429);
        let (_, json, headers) = immediate_of(&r[0]);
        assert_eq!(
            json["error"]["type"], "rate_limit_exceeded",
            "{}",
            case.name
        );
        assert!(
            message.starts_with("system saturated, request shed: all 3 endpoints"),
            "{}: {message}",
            case.name
        );
        assert_eq!(headers["retry-after"], retry_after, "{}", case.name);
        assert_eq!(headers["x-request-id"], "shed-1");
        assert_eq!((shed_total, answered_429), (1, 1), "{}", case.name);
        // The stream answers nothing more of the request; the response phase records nothing.
        assert!(s.handle(body(b"", true)).is_empty(), "{}", case.name);
        s.handle(response_headers(200, None));
        s.handle(response_body(b"{}", true));
        s.finish();
        assert_eq!(inflight(&router), before, "{}: no count taken", case.name);
        assert!(router.pending.is_empty(), "{}", case.name);
        assert_eq!(total_entries(&router), 0, "{}: nothing recorded", case.name);
        for outcome in ["recorded", "failed", "aborted", "unscored"] {
            assert_eq!(records(&router, outcome), 0, "{}: {outcome}", case.name);
        }
        // /debug/explain says the same, changing nothing.
        let explained = router.explain(case.path, Some(&b), None).unwrap_err();
        assert_eq!(
            (explained.status, &explained.message, explained.retry_after),
            (429, &message, retry_after.parse().ok()),
            "{}",
            case.name
        );
        assert_eq!(
            router.metrics.shed.get(),
            1,
            "{}: explain counts nothing",
            case.name
        );
        assert_eq!(inflight(&router), before);
        drop(held);
        assert_eq!(inflight(&router), [0, 0, 0], "{}", case.name);
    }
}
