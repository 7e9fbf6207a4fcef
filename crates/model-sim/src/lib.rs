//! `model-sim`: a GPU-free stand-in for a vLLM (or SGLang) server, with a real prefix KV cache
//! and a latency model, so routing quality can be measured. See [`engine`] for the model and
//! [`server`] for the HTTP surface.

pub mod engine;
pub mod kv_cache;
pub mod kv_events;
pub mod lora;
pub mod messages;
pub mod pd;
pub mod scheduler;
pub mod server;
pub mod template;
#[cfg(test)]
mod tests;
pub mod tokenizer;
pub mod tokenizer_json;
