//! The gateway shapes the replica tests run: an Envoy bootstrap with the ext_proc filter as each
//! gateway's controller writes it (Istio's `BuildInferencePoolExtProcFilter`, Envoy AI Gateway's
//! `buildHTTPFilterForInferencePool`) or as the legacy examples patch it, the model-server
//! cluster it routes with, and how it reaches the picker replicas (EDS endpoints or one
//! Service address).

use std::net::SocketAddr;

use crate::harness::Backend;

/// A gateway shape as its controller configures the ext_proc filter to the picker (read from
/// the controllers' sources, docs/replicas.md), and how it reaches the picker replicas.
#[derive(Debug, Clone, Copy)]
pub(super) enum Shape {
    /// Istio's InferencePool filter (`BuildInferencePoolExtProcFilter`): FULL_DUPLEX_STREAMED
    /// both ways, trailers sent, `envoy.lb` metadata both ways, routed by an ORIGINAL_DST
    /// cluster on the header. The gateway reaches each picker pod through EDS: both replicas
    /// are endpoints, and a pod that reports not ready leaves (an active gRPC health check on
    /// `readiness` stands in for EDS here).
    IstioPool,
    /// Envoy AI Gateway's InferencePool filter (`buildHTTPFilterForInferencePool`): the same
    /// body mode both ways (`duplex`, the default, or `buffered` by annotation), no metadata,
    /// ORIGINAL_DST on the header; its cluster is the picker Service's DNS name, one address
    /// (kube-proxy spreads connections: `harness::service::Service`).
    AiGatewayPool { buffered: bool },
    /// The legacy `envoy/envoy-gateway/prefix-picker.yaml`: the EnvoyExtensionPolicy's filter
    /// (BUFFERED request, response headers and STREAMED body, `envoy.lb` metadata both ways)
    /// and the EnvoyPatchPolicy's `override_host` cluster, behind the Service.
    EnvoyGatewayLegacy,
    /// The legacy `envoy/istio/envoyfilter.yaml`: its one FULL_DUPLEX_STREAMED filter and the
    /// `override_host` cluster patch, the replicas as EDS endpoints (as [`Shape::IstioPool`]).
    IstioLegacy,
}

impl Shape {
    /// The ext_proc filter, as the controller writes it.
    fn filter(self) -> String {
        let modes = |request: &str, response: &str| {
            format!(
                "{{request_header_mode: SEND, request_body_mode: {request}, request_trailer_mode: SEND, \
                 response_header_mode: SEND, response_body_mode: {response}, response_trailer_mode: SEND}}"
            )
        };
        let (timeouts, mode, metadata) = match self {
            Shape::IstioPool => (
                "grpc_service: {envoy_grpc: {cluster_name: prefix-picker}, timeout: 10s}\n              message_timeout: 1000s",
                modes("FULL_DUPLEX_STREAMED", "FULL_DUPLEX_STREAMED"),
                "metadata_options:\n                receiving_namespaces: {untyped: [\"envoy.lb\"]}\n                forwarding_namespaces: {untyped: [\"envoy.lb\"]}",
            ),
            Shape::AiGatewayPool { buffered } => {
                let body = if buffered {
                    "BUFFERED"
                } else {
                    "FULL_DUPLEX_STREAMED"
                };
                (
                    "grpc_service: {envoy_grpc: {cluster_name: prefix-picker, authority: \"prefix-picker.llm.svc:9002\"}}\n              message_timeout: 300s",
                    modes(body, body),
                    "allow_mode_override: false",
                )
            }
            Shape::IstioLegacy => (
                "grpc_service: {envoy_grpc: {cluster_name: prefix-picker}, timeout: 5s}\n              message_timeout: 5s",
                modes("FULL_DUPLEX_STREAMED", "FULL_DUPLEX_STREAMED"),
                "response_attributes: [\"upstream.address\", \"response.code\"]\n              metadata_options:\n                receiving_namespaces: {untyped: [\"envoy.lb\"]}\n                forwarding_namespaces: {untyped: [\"envoy.lb\"]}",
            ),
            Shape::EnvoyGatewayLegacy => (
                "grpc_service: {envoy_grpc: {cluster_name: prefix-picker}}\n              message_timeout: 5s",
                "{request_header_mode: SEND, request_body_mode: BUFFERED, request_trailer_mode: SKIP, \
                 response_header_mode: SEND, response_body_mode: STREAMED, response_trailer_mode: SKIP}"
                    .to_string(),
                "response_attributes: [\"upstream.address\", \"response.code\"]\n              metadata_options:\n                receiving_namespaces: {untyped: [\"envoy.lb\"]}\n                forwarding_namespaces: {untyped: [\"envoy.lb\"]}",
            ),
        };
        format!(
            "          - name: envoy.filters.http.ext_proc
            typed_config:
              \"@type\": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor
              {timeouts}
              failure_mode_allow: false
              processing_mode: {mode}
              {metadata}
"
        )
    }

    /// The model-server cluster: ORIGINAL_DST on the header for the pools, the patched
    /// `override_host` cluster for the legacy policy.
    fn models(self, backends: &[Backend]) -> String {
        match self {
            Shape::IstioPool | Shape::AiGatewayPool { .. } => "  - name: models
    connect_timeout: 10s
    type: ORIGINAL_DST
    lb_policy: CLUSTER_PROVIDED
    original_dst_lb_config: {use_http_header: true, http_header_name: x-gateway-destination-endpoint}
"
            .to_string(),
            Shape::EnvoyGatewayLegacy | Shape::IstioLegacy => {
                let endpoints: String = backends
                    .iter()
                    .map(|b| {
                        format!(
                            "        - endpoint: {{address: {{socket_address: {{address: {}, port_value: {}}}}}}}\n",
                            b.addr.ip(),
                            b.addr.port()
                        )
                    })
                    .collect();
                format!(
                    "  - name: models
    connect_timeout: 1s
    type: STATIC
    load_assignment:
      cluster_name: models
      endpoints:
      - lb_endpoints:
{endpoints}    load_balancing_policy:
      policies:
      - typed_extension_config:
          name: envoy.load_balancing_policies.override_host
          typed_config:
            \"@type\": type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost
            override_host_sources:
            - metadata: {{key: envoy.lb, path: [{{key: x-gateway-destination-endpoint}}]}}
            selected_host_key: {{key: envoy.lb, path: [{{key: x-gateway-destination-endpoint-served}}]}}
            fallback_policy:
              policies:
              - typed_extension_config:
                  name: envoy.load_balancing_policies.round_robin
                  typed_config:
                    \"@type\": type.googleapis.com/envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin
"
                )
            }
        }
    }

    /// The picker cluster: TLS without verification (the chart's self-signed certificate),
    /// HTTP/2; the replicas as endpoints (Istio's EDS) or the one Service address.
    fn picker_cluster(self, replicas: &[SocketAddr], service: SocketAddr) -> String {
        let endpoint = |a: SocketAddr| {
            format!(
                "        - endpoint: {{address: {{socket_address: {{address: {}, port_value: {}}}}}}}\n",
                a.ip(),
                a.port()
            )
        };
        let (endpoints, extra) = match self {
            Shape::IstioPool | Shape::IstioLegacy => (
                replicas.iter().copied().map(endpoint).collect::<String>(),
                "    health_checks:
    - {timeout: 1s, interval: 1s, no_traffic_interval: 1s, unhealthy_threshold: 1, healthy_threshold: 1, grpc_health_check: {service_name: readiness}}
",
            ),
            // A connection carries a few streams, then Envoy opens the next one (through the
            // Service, to the next replica): what several gateway pods and workers do to one
            // long-lived connection each.
            Shape::AiGatewayPool { .. } | Shape::EnvoyGatewayLegacy => (endpoint(service), ""),
        };
        let common = match self {
            Shape::IstioPool | Shape::IstioLegacy => "",
            _ => "        common_http_protocol_options: {max_requests_per_connection: 3}\n",
        };
        format!(
            "  - name: prefix-picker
    connect_timeout: 1s
    type: STATIC
{extra}    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        sni: localhost
        common_tls_context: {{alpn_protocols: [\"h2\"]}}
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
{common}        explicit_http_config: {{http2_protocol_options: {{}}}}
    load_assignment:
      cluster_name: prefix-picker
      endpoints:
      - lb_endpoints:
{endpoints}"
        )
    }

    pub(super) fn bootstrap(
        self,
        backends: &[Backend],
        replicas: &[SocketAddr],
        service: SocketAddr,
    ) -> String {
        format!(
            "admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: 0}}}}
static_resources:
  listeners:
  - name: ingress
    address: {{socket_address: {{address: 127.0.0.1, port_value: 0}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          \"@type\": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          route_config:
            virtual_hosts:
            - name: models
              domains: [\"*\"]
              routes:
              - match: {{prefix: \"/\"}}
                route: {{cluster: models, timeout: 0s}}
          http_filters:
{}          - name: envoy.filters.http.router
            typed_config:
              \"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
{}{}",
            self.filter(),
            self.models(backends),
            self.picker_cluster(replicas, service)
        )
    }

    /// `maxEndpoints`: one address for an ORIGINAL_DST cluster (a list is a 503), as the
    /// chart's examples set it; primary + fallbacks for `override_host`.
    pub(super) fn max_endpoints(self) -> usize {
        match self {
            Shape::IstioPool | Shape::AiGatewayPool { .. } => 1,
            Shape::EnvoyGatewayLegacy | Shape::IstioLegacy => 3,
        }
    }
}
