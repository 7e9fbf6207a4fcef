//! An `EndpointPickerConfig`'s request-time state through a stream: session-affinity-scorer's
//! `x-session-token` read from the request and set on the response, and the pick's in-flight
//! prompt tokens (token-load-scorer, prefix-cache-affinity-filter) until the first response
//! body chunk.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use super::*;
use crate::scheduler::Candidate;

const CONFIG: &str = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: session-affinity-scorer\n- type: token-load-scorer\n- type: queue-scorer\nschedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: session-affinity-scorer\n    weight: 10\n  - pluginRef: token-load-scorer\n  - pluginRef: queue-scorer\n";

fn epp_router() -> Arc<Router> {
    Arc::new(router_from_config(
        CONFIG,
        three(),
        &prometheus::Registry::new(),
    ))
}

/// Routes a completion of `prompt` with `extra` request headers; the stream and the pick.
fn route(router: &Arc<Router>, prompt: &str, extra: &[(&str, &str)]) -> (StreamState, SocketAddr) {
    let mut s = StreamState::new(router.clone());
    let r = s.handle(modes(
        headers("/v1/completions", false, extra),
        BUFFERED,
        STREAMED,
    ));
    assert_continue_headers(&r[0]);
    let r = s.handle(body(&completion("m", prompt), true));
    (s, pick_of(&r[0])[0])
}

#[test]
fn the_session_token_pins_the_pod_and_the_response_names_the_pick() {
    let router = epp_router();
    let token = STANDARD.encode("default/pod-2");
    for _ in 0..3 {
        let (mut s, pick) = route(&router, "hello", &[("x-session-token", &token)]);
        assert_eq!(pick, addr(PORTS[2]), "the session's pod (weight 10) wins");
        let r = s.handle(response_headers(200, Some(&pick.to_string())));
        assert_eq!(
            set_header_of(&r[0], "x-session-token").map(|(v, _)| v),
            Some(token.clone())
        );
    }
    // Without the header (or with a token naming no candidate) the scorer is 0 everywhere;
    // the response names whichever pod was picked, for the client's next request.
    for extra in [vec![], vec![("x-session-token", "bm8tc3VjaC9wb2Q=")]] {
        let (mut s, pick) = route(&router, "hello", &extra);
        let label = endpoint(&router, pick).label.clone();
        let r = s.handle(response_headers(200, Some(&pick.to_string())));
        assert_eq!(
            set_header_of(&r[0], "x-session-token").map(|(v, _)| v),
            Some(STANDARD.encode(label))
        );
    }
}

#[test]
fn a_picks_prompt_tokens_are_in_flight_until_the_first_body_chunk() {
    let router = epp_router();
    let prompt = "x".repeat(401);
    let (mut s, pick) = route(&router, &prompt, &[]);
    let pod = endpoint(&router, pick);
    // No prefix scorer: the whole prompt, ceil(401 / 4) = 101 tokens (the rendered prompt of
    // a completion is its text).
    assert_eq!(pod.inflight_tokens(), 101);
    s.handle(response_headers(200, Some(&pick.to_string())));
    assert_eq!(pod.inflight_tokens(), 101, "not before the body");
    s.handle(response_body(b"data: {}\n\n", false));
    assert_eq!(pod.inflight_tokens(), 0, "prefill done at the first chunk");
    assert_eq!(pod.inflight(), 1, "the request itself is still in flight");
    s.handle(response_body(b"data: [DONE]\n\n", true));
    assert_eq!(pod.inflight(), 0);

    // An aborted request releases them too.
    let (s, pick) = route(&router, &prompt, &[]);
    let pod = endpoint(&router, pick);
    assert_eq!(pod.inflight_tokens(), 101);
    drop(s);
    assert_eq!(pod.inflight_tokens(), 0);
}
