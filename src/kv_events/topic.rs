//! The pod a message on the shared socket is for, named by its topic, as llm-d reads it: an
//! engine that connects to one socket with the others says who it is in its topic,
//! `kv@<pod-identifier>@<model-name>` (vLLM `--kv-events-config '{..., "endpoint":
//! "tcp://picker:5557", "topic": "kv@$(POD_IP):$(POD_PORT)@<model>"}'`).
//!
//! Source: llm-d/llm-d-router `pkg/kvevents/engineadapter/common.go` (`parseTopic`, read at
//! commit 0854a27dfafc990cc41b6c627ee681a089c0685c, not copied): the topic split on `@`; exactly
//! three parts give the pod identifier (the second) and the model (the third); any other topic
//! is the pod identifier whole, with no model. llm-d's guides put the pod's `IP:port` there
//! (earlier ones its IP alone); which pod an identifier names is the caller's
//! (`engine_events::shared`).

/// What a topic names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopicPod<'t> {
    /// The pod identifier: an `IP:port`, an IP or a pod name, as the engine was configured.
    pub pod: &'t str,
    /// The model, when the topic has llm-d's three parts; else empty.
    pub model: &'t str,
}

impl<'t> TopicPod<'t> {
    /// The pod and model `topic` names, as llm-d parses it.
    pub fn parse(topic: &'t str) -> TopicPod<'t> {
        let mut parts = topic.split('@');
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(_), Some(pod), Some(model), None) => TopicPod { pod, model },
            _ => TopicPod {
                pod: topic,
                model: "",
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::TopicPod;

    fn parsed(topic: &str) -> (&str, &str) {
        let t = TopicPod::parse(topic);
        (t.pod, t.model)
    }

    #[test]
    fn three_parts_name_the_pod_and_the_model() {
        assert_eq!(
            parsed("kv@10.0.0.5:8000@Qwen/Qwen3-32B"),
            ("10.0.0.5:8000", "Qwen/Qwen3-32B")
        );
        assert_eq!(parsed("kv@10.0.0.5@m"), ("10.0.0.5", "m"));
        assert_eq!(parsed("kv@vllm-0@m"), ("vllm-0", "m"));
        assert_eq!(parsed("kv@[fd00::1]:8000@m"), ("[fd00::1]:8000", "m"));
        // The first part is not checked (the subscription filter is).
        assert_eq!(parsed("events@vllm-0@m"), ("vllm-0", "m"));
        // Empty parts stay empty.
        assert_eq!(parsed("kv@@m"), ("", "m"));
        assert_eq!(parsed("kv@vllm-0@"), ("vllm-0", ""));
    }

    #[test]
    fn any_other_topic_is_the_pod_identifier_whole() {
        assert_eq!(parsed("vllm-0"), ("vllm-0", ""));
        assert_eq!(parsed(""), ("", ""));
        assert_eq!(parsed("kv@vllm-0"), ("kv@vllm-0", ""));
        // A model name with an `@` makes four parts: llm-d then reads the whole topic too.
        assert_eq!(parsed("kv@vllm-0@org@model"), ("kv@vllm-0@org@model", ""));
    }
}
