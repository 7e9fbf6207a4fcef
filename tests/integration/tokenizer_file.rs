//! The `file` tokenizer source against its references: the chat templates of
//! `tests/integration/fixtures/chat_templates` (and model-sim's) rendered by Python's jinja2 as `transformers` renders them
//! (`tests/wire/chat_template.py`, live: the fixtures' expected renderings still hold), and the
//! picker's ids equal to model-sim's when both run the sim's `tokenizer.json` (random chat and
//! text prompts).

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;

use model_sim::tokenizer_json;
use prefix_picker::tokenizer::TokenizeInput;
use prefix_picker::tokenizer::file::FileSource;
use proptest::prelude::*;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::harness::root;
use crate::kv_events::wire_python;

#[test]
fn pythons_jinja2_still_renders_the_fixtures_expected_text() {
    let dir = root().join("tests/integration/fixtures/chat_templates");
    // Each case's fields as written (the key order of messages and tools reaches `tojson`).
    type Case = std::collections::BTreeMap<String, Box<RawValue>>;
    let text = std::fs::read_to_string(dir.join("cases.json")).unwrap();
    let mut cases: Vec<Case> = serde_json::from_str(&text).unwrap();
    let expected: Value =
        serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap()).unwrap();
    let names: Vec<String> = cases
        .iter()
        .map(|c| serde_json::from_str(c["name"].get()).unwrap())
        .collect();
    for c in &mut cases {
        let template: String = serde_json::from_str(c["template"].get()).unwrap();
        let path = match template.as_str() {
            "model-sim.jinja" => root().join("crates/model-sim/src/chat_template.jinja"),
            other => dir.join(other),
        };
        let source = std::fs::read_to_string(path).unwrap();
        c.insert(
            "template".into(),
            RawValue::from_string(json!(source).to_string()).unwrap(),
        );
    }
    // Written, not made a `Value` (which would sort the raw fields' keys).
    let request = format!(r#"{{"cases": {}}}"#, serde_json::to_string(&cases).unwrap());
    let mut child = Command::new(wire_python())
        .arg(root().join("tests/wire/chat_template.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(request.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "tests/wire/chat_template.py (jinja2 from tests/wire/requirements.txt): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rendered: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rendered.len(), names.len());
    for (name, got) in names.iter().zip(&rendered) {
        assert_eq!(got, &expected[name], "{name}: jinja2 renders otherwise now");
    }
}

/// The sim's tokenizer.json and tokenizer_config.json, loaded as the picker loads them.
fn picker_source() -> (tempfile::TempDir, Arc<FileSource>) {
    let dir = tempfile::tempdir().unwrap();
    tokenizer_json::write(dir.path()).unwrap();
    let source = FileSource::load(&dir.path().join("tokenizer.json")).unwrap();
    assert!(source.template_error().is_none());
    (dir, Arc::new(source))
}

const WORDS: [&str; 12] = [
    "alpha",
    " bravo",
    " juniper",
    "Grüße",
    " 世界",
    "\n",
    "  ",
    "<|im_end|>",
    "x",
    "'",
    "\"",
    ".",
];

fn text() -> impl Strategy<Value = String> {
    proptest::collection::vec(0..WORDS.len(), 0..40)
        .prop_map(|w| w.into_iter().map(|i| WORDS[i]).collect())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// A chat request: the ids model-sim computes for it (its rendering, its tokenizer.json)
    /// are the ids the picker's `file` source computes (the template beside the
    /// tokenizer.json, then the same tokenizer), for the whole prompt and for every head.
    #[test]
    fn the_file_source_computes_the_sims_ids(
        turns in proptest::collection::vec(text(), 1..5),
        prompt in text(),
    ) {
        let (_dir, source) = picker_source();
        let sim = tokenizer_json::default_tokenizer();
        let roles = ["system", "user", "assistant", "user", "assistant"];
        let messages: Vec<Value> = turns
            .iter()
            .zip(roles)
            .map(|(t, role)| json!({"role": role, "content": t}))
            .collect();
        for head in 1..=messages.len() {
            let body = json!({"model": "m", "messages": &messages[..head]});
            let rendered = prefix_picker::request::InferenceRequest::parse(
                body.to_string().as_bytes(),
            )
            .unwrap()
            .prompt
            .unwrap();
            let raw = Value::from(messages[..head].to_vec()).to_string();
            let input = TokenizeInput::chat(&raw, None).with_generation_prompt(head == messages.len());
            let ids = source.tokenize(&input).unwrap();
            prop_assert_eq!(ids.to_vec(), sim.ids(rendered.as_bytes()));
        }
        let ids = source.tokenize(&TokenizeInput::text(&prompt)).unwrap();
        prop_assert_eq!(ids.to_vec(), sim.ids(prompt.as_bytes()));
    }
}
