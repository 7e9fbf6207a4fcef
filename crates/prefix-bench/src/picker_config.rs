//! The config file a picker row of the suite runs with: a `scheduler:` section, one static
//! endpoint per sim, and a `picker:` mapping (the scrape interval, the row's `affinity`, and for
//! an engine-events row its `tokenizer`).
//!
//! An engine-events row gives every static endpoint its sim's `kvEventsEndpoint` and
//! `kvEventsReplayEndpoint` (vLLM's PUB and replay ROUTER sockets), so the picker matches a
//! candidate by what its engine holds, and sets `picker.tokenizer` (how the picker gets a
//! prompt's engine tokens: `{source: engine}` asks the pod's own `POST /tokenize`; `{source:
//! file}` runs model-sim's `tokenizer.json` in process, the sims running it too). A fault row
//! ([`super::event_faults`]) renders as its engine-events row: the topic mismatch leaves
//! `picker.kvEvents.topic` unset (`""`), the silent publisher's pods name other sockets.

use std::fmt::Write;
use std::net::SocketAddr;

use testkit::KvEventPorts;

use super::event_faults::EventFault;

/// What an engine-events row adds to its base row: the `picker.tokenizer` mapping (JSON, which
/// YAML reads as a flow mapping), every endpoint's event sockets implied; and for a fault row
/// how its event stream is wrong ([`EventFault`]).
#[derive(Debug, Clone, PartialEq)]
pub struct EngineEvents {
    pub tokenizer: serde_json::Value,
    pub fault: Option<EventFault>,
}

impl EngineEvents {
    /// `picker.tokenizer: {source: engine}`: the pod's own `/tokenize`, on its serving port.
    pub fn engine_tokenize() -> EngineEvents {
        EngineEvents {
            tokenizer: serde_json::json!({"source": "engine"}),
            fault: None,
        }
    }

    /// `picker.tokenizer: {source: file}`: model-sim's `tokenizer.json` in process; its path
    /// is set by [`EngineEvents::with_tokenizer_dir`], and the sims run it too
    /// (`--tokenizer-json`).
    pub fn file_tokenizer() -> EngineEvents {
        EngineEvents {
            tokenizer: serde_json::json!({"source": "file"}),
            fault: None,
        }
    }

    /// The same row with its event stream wrong as `fault` says.
    pub fn with_fault(self, fault: EventFault) -> EngineEvents {
        EngineEvents {
            fault: Some(fault),
            ..self
        }
    }

    /// Whether the row runs model-sim's `tokenizer.json` (in the picker and the sims).
    pub fn uses_tokenizer_json(&self) -> bool {
        self.tokenizer["source"] == "file"
    }

    /// Writes model-sim's `tokenizer.json` and `tokenizer_config.json` into `dir` and returns
    /// the row with `path` naming it (unchanged for another source) and the sims' extra
    /// arguments.
    pub fn with_tokenizer_dir(
        &self,
        dir: &std::path::Path,
    ) -> anyhow::Result<(EngineEvents, Vec<String>)> {
        if !self.uses_tokenizer_json() {
            return Ok((self.clone(), Vec::new()));
        }
        model_sim::tokenizer_json::write(dir)?;
        let path = dir.join("tokenizer.json").display().to_string();
        let mut row = self.clone();
        row.tokenizer["path"] = serde_json::json!(path);
        Ok((row, vec!["--tokenizer-json".to_string(), path]))
    }
}

/// One sim as a static endpoint.
#[derive(Debug, Clone)]
pub struct Pod {
    pub name: String,
    pub addr: SocketAddr,
    /// Its KV-event sockets, when it publishes events.
    pub kv_events: Option<KvEventPorts>,
}

/// The picker's config: `scheduler` (a `scheduler:` section, as YAML text), `pods` as static
/// endpoints, `affinity` (a `picker.affinity` mapping) and `events` when given. Fails when
/// `events` is given and a pod publishes none.
pub fn render(
    scheduler: &str,
    pods: &[Pod],
    affinity: Option<&serde_json::Value>,
    events: Option<&EngineEvents>,
) -> anyhow::Result<String> {
    render_with(scheduler, pods, affinity, events, None)
}

/// [`render`], with the workload's `picker.flowControl` mapping (flow-style YAML) when given.
pub fn render_with(
    scheduler: &str,
    pods: &[Pod],
    affinity: Option<&serde_json::Value>,
    events: Option<&EngineEvents>,
    flow_control: Option<&str>,
) -> anyhow::Result<String> {
    let mut config = scheduler.to_string();
    config.push_str("endpoints:\n");
    for pod in pods {
        let _ = write!(
            config,
            "- {{name: {}, namespace: default, address: \"{}\"",
            pod.name, pod.addr
        );
        if events.is_some() {
            let ports = pod.kv_events.ok_or_else(|| {
                anyhow::anyhow!(
                    "{} publishes no KV events for an engine-events row",
                    pod.name
                )
            })?;
            let _ = write!(
                config,
                ", kvEventsEndpoint: \"{}\", kvEventsReplayEndpoint: \"{}\"",
                ports.endpoint(),
                ports.replay_endpoint()
            );
        }
        config.push_str("}\n");
    }
    config.push_str("picker: {scrapeIntervalSeconds: 0.1");
    if let Some(a) = affinity {
        let _ = write!(config, ", affinity: {a}");
    }
    if let Some(e) = events {
        let _ = write!(config, ", tokenizer: {}", e.tokenizer);
    }
    if let Some(f) = flow_control {
        let _ = write!(config, ", flowControl: {f}");
    }
    config.push_str("}\n");
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pods(events: bool) -> Vec<Pod> {
        (0..2)
            .map(|i| Pod {
                name: format!("sim-{i}"),
                addr: format!("127.0.0.1:{}", 8000 + i).parse().unwrap(),
                kv_events: events.then_some(KvEventPorts {
                    publish: 5557 + 2 * i,
                    replay: 5558 + 2 * i,
                }),
            })
            .collect()
    }

    const SCHEDULER: &str = "scheduler:\n  plugins: {}\n";

    fn parse(config: &str) -> serde_yaml_ng::Value {
        serde_yaml_ng::from_str(config).unwrap()
    }

    #[test]
    fn a_row_without_events_writes_the_config_the_suite_always_wrote() {
        let affinity = serde_json::json!({"tentative": true});
        let config = render(SCHEDULER, &pods(true), Some(&affinity), None).unwrap();
        let expected = format!(
            "{SCHEDULER}{}picker: {{scrapeIntervalSeconds: 0.1, affinity: {affinity}}}\n",
            testkit::endpoints_yaml(pods(false).iter().map(|p| (p.name.as_str(), p.addr)))
        );
        assert_eq!(config, expected);
        assert_eq!(
            render(SCHEDULER, &pods(false), None, None).unwrap(),
            format!(
                "{SCHEDULER}{}picker: {{scrapeIntervalSeconds: 0.1}}\n",
                testkit::endpoints_yaml(pods(false).iter().map(|p| (p.name.as_str(), p.addr)))
            )
        );
    }

    #[test]
    fn a_workloads_flow_control_mapping_is_the_pickers() {
        let affinity = serde_json::json!({});
        let config = render_with(
            SCHEDULER,
            &pods(false),
            Some(&affinity),
            None,
            Some(crate::catalogue::PRIORITIES),
        )
        .unwrap();
        let doc = parse(&config);
        let fc = &doc["picker"]["flowControl"];
        assert_eq!(fc["priorities"]["interactive"].as_i64(), Some(10));
        assert!(doc["picker"]["affinity"].is_mapping());
        // The picker reads it (its priorities as written).
        let parsed = prefix_picker::config::Config::parse(&config).unwrap();
        assert_eq!(
            parsed.picker.flow_control.priorities.get("interactive"),
            Some(&10)
        );
    }

    #[test]
    fn an_engine_events_row_names_every_pods_sockets_and_the_tokenizer() {
        let affinity =
            serde_json::json!({"tentative": true, "experimental": {"latencySignals": ["pace"]}});
        let events = EngineEvents::engine_tokenize();
        let config = render(SCHEDULER, &pods(true), Some(&affinity), Some(&events)).unwrap();
        let doc = parse(&config);
        let endpoints = doc["endpoints"].as_sequence().unwrap();
        assert_eq!(endpoints.len(), 2);
        for (i, e) in endpoints.iter().enumerate() {
            assert_eq!(e["name"].as_str(), Some(format!("sim-{i}").as_str()));
            assert_eq!(
                e["address"].as_str(),
                Some(format!("127.0.0.1:{}", 8000 + i).as_str())
            );
            assert_eq!(
                e["kvEventsEndpoint"].as_str(),
                Some(format!("tcp://127.0.0.1:{}", 5557 + 2 * i).as_str())
            );
            assert_eq!(
                e["kvEventsReplayEndpoint"].as_str(),
                Some(format!("tcp://127.0.0.1:{}", 5558 + 2 * i).as_str())
            );
        }
        assert_eq!(
            doc["picker"]["tokenizer"]["source"].as_str(),
            Some("engine")
        );
        assert_eq!(doc["picker"]["affinity"]["tentative"].as_bool(), Some(true));
        assert_eq!(
            doc["picker"]["affinity"]["experimental"]["latencySignals"][0].as_str(),
            Some("pace")
        );
        assert_eq!(doc["picker"]["scrapeIntervalSeconds"].as_f64(), Some(0.1));
        assert!(doc["scheduler"]["plugins"].is_mapping());
    }

    #[test]
    fn another_tokenizer_source_is_only_another_mapping() {
        let events = EngineEvents {
            tokenizer: serde_json::json!({"source": "file", "path": "/models/tokenizer.json"}),
            fault: None,
        };
        let doc = parse(&render(SCHEDULER, &pods(true), None, Some(&events)).unwrap());
        assert_eq!(doc["picker"]["tokenizer"]["source"].as_str(), Some("file"));
        assert_eq!(
            doc["picker"]["tokenizer"]["path"].as_str(),
            Some("/models/tokenizer.json")
        );
    }

    #[test]
    fn events_without_publishing_sims_are_refused() {
        let events = EngineEvents::engine_tokenize();
        let err = render(SCHEDULER, &pods(false), None, Some(&events)).unwrap_err();
        assert!(err.to_string().contains("sim-0"), "{err}");
    }
}
