//! `StreamState` driven message by message, as Envoy would, against a real [`Router`] with
//! static endpoints on 127.0.0.1; one file per concern.

mod body_modes;
mod decision;
mod epp;
mod failures;
mod flow;
mod metadata;
mod observer;
mod pd;
mod recording;
mod restriction;
mod shedding;

use std::collections::HashSet;
use std::net::SocketAddr;

use envoy_types::pb::envoy::config::core::v3::Metadata;
use envoy_types::pb::envoy::config::core::v3::header_value_option::HeaderAppendAction;
use envoy_types::pb::google::protobuf::Value;
use serde_json::json;

use super::*;
use crate::config::PickerConfig;
use crate::endpoints::EndpointSpec;
use crate::envoy::wire::*;
use crate::testing::envoy::*;
use crate::testing::*;

/// Routes `body` through a BUFFERED stream; returns the stream and the pick.
fn route_buffered(
    router: &Arc<Router>,
    request_id: &str,
    body_bytes: &[u8],
    response_mode: i32,
) -> (StreamState, Vec<SocketAddr>) {
    let mut s = StreamState::new(router.clone());
    let r = s.handle(modes(
        headers("/v1/completions", false, &[("x-request-id", request_id)]),
        BUFFERED,
        response_mode,
    ));
    assert_eq!(r.len(), 1);
    assert_continue_headers(&r[0]);
    let r = s.handle(body(body_bytes, true));
    assert_eq!(r.len(), 1, "{r:?}");
    assert!(is_request_body(&r[0]));
    let pick = pick_of(&r[0]);
    (s, pick)
}

fn route_with_hint(
    router: &Arc<Router>,
    hint: Option<Metadata>,
    extra: &[(&str, &str)],
) -> Vec<ProcessingResponse> {
    let mut req = modes(headers("/v1/completions", false, extra), BUFFERED, STREAMED);
    req.metadata_context = hint;
    let mut s = StreamState::new(router.clone());
    let r = s.handle(req);
    assert_continue_headers(&r[0]);
    s.handle(body(&completion("m", &long_prompt("hint")), true))
}

fn pick_set(r: &[ProcessingResponse]) -> HashSet<SocketAddr> {
    assert_eq!(r.len(), 1, "{r:?}");
    pick_of(&r[0]).into_iter().collect()
}
