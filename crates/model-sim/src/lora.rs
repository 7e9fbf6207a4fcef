//! vLLM's `vllm:lora_requests_info` gauge for a sim serving LoRA adapters (`--lora-adapter`):
//! labels `max_lora` (`--max-loras`), `running_lora_adapters` and `waiting_lora_adapters`
//! (comma-separated adapter names), value the Unix time the label set was set. As vLLM, a new
//! label set is written at every change (the old ones stay; readers take the latest by value)
//! and nothing is exported before the first adapter request. Every adapter request in flight
//! counts as running here (the sim does not batch adapters, so none waits for a slot):
//! `waiting_lora_adapters` is always empty.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use prometheus::{GaugeVec, Opts, Registry};

/// The gauge and the adapters in flight.
#[derive(Debug)]
pub struct LoraInfo {
    gauge: GaugeVec,
    max_lora: usize,
    running: Mutex<BTreeMap<String, usize>>,
}

impl LoraInfo {
    pub fn register(registry: &Registry, max_lora: usize) -> Arc<LoraInfo> {
        let gauge = GaugeVec::new(
            Opts::new("vllm:lora_requests_info", "Running stats on lora requests."),
            &["max_lora", "running_lora_adapters", "waiting_lora_adapters"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(gauge.clone()))
            .expect("unique metric");
        Arc::new(LoraInfo {
            gauge,
            max_lora,
            running: Mutex::new(BTreeMap::new()),
        })
    }

    /// A request for `adapter` starts; it counts as running until the guard drops.
    pub fn start(self: &Arc<LoraInfo>, adapter: &str) -> LoraGuard {
        let mut running = self.running.lock();
        *running.entry(adapter.to_string()).or_default() += 1;
        self.publish(&running);
        LoraGuard {
            info: self.clone(),
            adapter: adapter.to_string(),
        }
    }

    fn publish(&self, running: &BTreeMap<String, usize>) {
        let names: Vec<&str> = running.keys().map(String::as_str).collect();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        self.gauge
            .with_label_values(&[&self.max_lora.to_string(), &names.join(","), ""])
            .set(now);
    }
}

/// One adapter request in flight.
#[derive(Debug)]
pub struct LoraGuard {
    info: Arc<LoraInfo>,
    adapter: String,
}

impl Drop for LoraGuard {
    fn drop(&mut self) {
        let mut running = self.info.running.lock();
        if let Some(n) = running.get_mut(&self.adapter) {
            *n -= 1;
            if *n == 0 {
                running.remove(&self.adapter);
            }
        }
        self.info.publish(&running);
    }
}
