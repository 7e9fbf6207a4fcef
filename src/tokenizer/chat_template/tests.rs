use super::*;
use serde_json::json;

/// tests/integration/fixtures/chat_templates (and model-sim's template): the templates, the
/// cases and what Python's jinja2 renders for them through tests/wire/chat_template.py
/// (`tests/integration/tokenizer_file.rs` checks that again, live).
const CASES: &str = include_str!("../../../tests/integration/fixtures/chat_templates/cases.json");
const EXPECTED: &str =
    include_str!("../../../tests/integration/fixtures/chat_templates/expected.json");

fn fixture(name: &str) -> &'static str {
    match name {
        "qwen2.5.jinja" => {
            include_str!("../../../tests/integration/fixtures/chat_templates/qwen2.5.jinja")
        }
        "llama3.1.jinja" => {
            include_str!("../../../tests/integration/fixtures/chat_templates/llama3.1.jinja")
        }
        "model-sim.jinja" => {
            include_str!("../../../crates/model-sim/src/chat_template.jinja")
        }
        other => panic!("no fixture {other}"),
    }
}

/// The cases, each field's JSON text as written (key order matters to `tojson`).
fn cases() -> Vec<std::collections::HashMap<String, Box<serde_json::value::RawValue>>> {
    serde_json::from_str(CASES).unwrap()
}

fn field(
    case: &std::collections::HashMap<String, Box<serde_json::value::RawValue>>,
    key: &str,
) -> Json {
    serde_json::from_str(case[key].get()).unwrap()
}

/// The rendering of a case of cases.json, or its error as Python's reference writes it.
fn render_case(case: &std::collections::HashMap<String, Box<serde_json::value::RawValue>>) -> Json {
    let mut config = field(case, "config");
    config["chat_template"] = json!(fixture(field(case, "template").as_str().unwrap()));
    let template = ChatTemplate::from_config(&config, "cases.json")
        .unwrap()
        .unwrap();
    let tools = (case["tools"].get() != "null").then(|| case["tools"].get());
    match template.render(
        case["messages"].get(),
        tools,
        field(case, "add_generation_prompt").as_bool().unwrap(),
    ) {
        Ok(text) => json!(text),
        Err(TemplateError::Render(message)) => json!({"error": message}),
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn templates_render_as_pythons_jinja2_renders_them() {
    let expected: Json = serde_json::from_str(EXPECTED).unwrap();
    for case in &cases() {
        let name = field(case, "name");
        let name = name.as_str().unwrap();
        let got = render_case(case);
        let want = &expected[name];
        match want.get("error") {
            // MiniJinja words the error its own way; the template's message is in it.
            Some(message) => {
                let got = got["error"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{name}: {got}"));
                assert!(got.contains(message.as_str().unwrap()), "{name}: {got}");
            }
            None => assert_eq!(&got, want, "{name}"),
        }
    }
}

#[test]
fn the_sims_template_renders_as_the_sim_does() {
    let cases = cases();
    let sim = cases
        .iter()
        .filter(|c| field(c, "template") == "model-sim.jinja");
    for case in sim {
        let body = json!({"messages": field(case, "messages")});
        let rendered =
            crate::prompt::render(body.as_object().unwrap(), crate::prompt::Rendering::Kthena)
                .unwrap();
        assert_eq!(
            render_case(case),
            json!(rendered),
            "{}",
            field(case, "name")
        );
    }
}

#[test]
fn the_template_comes_from_the_model_directory() {
    let dir = tempfile::tempdir().unwrap();
    assert!(ChatTemplate::from_dir(dir.path()).unwrap().is_none());
    let config = json!({"chat_template": [
        {"name": "default", "template": "plain{{ messages | length }}"},
        {"name": "tool_use", "template": "tools{{ tools | length }}"},
    ]});
    std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).unwrap();
    let t = ChatTemplate::from_dir(dir.path()).unwrap().unwrap();
    assert_eq!(t.render("[{}]", None, true).unwrap(), "plain1");
    assert_eq!(t.render("[{}]", Some("[1, 2]"), true).unwrap(), "tools2");
    // chat_template.jinja wins, as in transformers.
    std::fs::write(
        dir.path().join("chat_template.jinja"),
        "file {{ eos_token }}",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        r#"{"eos_token": {"content": "</s>"}}"#,
    )
    .unwrap();
    let t = ChatTemplate::from_dir(dir.path()).unwrap().unwrap();
    assert_eq!(t.render("[]", None, true).unwrap(), "file </s>");
    // Errors name the file.
    std::fs::write(dir.path().join("chat_template.jinja"), "{% if %}").unwrap();
    let e = ChatTemplate::from_dir(dir.path()).unwrap_err();
    assert!(e.to_string().contains("chat_template.jinja"), "{e}");
    std::fs::write(dir.path().join("tokenizer_config.json"), "{not json").unwrap();
    let e = ChatTemplate::from_dir(dir.path()).unwrap_err();
    assert!(e.to_string().contains("tokenizer_config.json"), "{e}");
}

#[test]
fn a_bad_request_or_template_is_an_error_not_a_panic() {
    let config = json!({"chat_template": "{{ messages[0].content.x.y }}{{ raise_exception('no') if messages | length > 1 }}"});
    let t = ChatTemplate::from_config(&config, "c").unwrap().unwrap();
    assert!(t.render("not json", None, true).is_err());
    assert!(t.render("[1]", None, true).is_err());
    assert!(
        t.render(r#"[{"content": {"x": 1}}, 2]"#, None, true)
            .is_err()
    );
    assert!(t.render("[]", None, true).is_err());
}

#[test]
fn strftime_formats_as_python() {
    // 2024-07-26 13:25:09 UTC, a Friday (Python: time.strftime(fmt, time.gmtime(1722000309))).
    let at = 1_722_000_309;
    assert_eq!(strftime("%d %b %Y", at).unwrap(), "26 Jul 2024");
    assert_eq!(
        strftime("%A %a %B %m %y %H:%M:%S %j %%", at).unwrap(),
        "Friday Fri July 07 24 13:25:09 208 %"
    );
    assert_eq!(strftime("%d %b %Y", 0).unwrap(), "01 Jan 1970");
    assert_eq!(strftime("%Y-%m-%d", 951_782_400).unwrap(), "2000-02-29");
    assert!(strftime("%Q", at).is_err());
}

#[test]
fn tojson_writes_as_pythons_json_dumps() {
    let v: Value = serde_json::from_str(
        r#"{"b": [1, 2.5, 1e-5, true, null], "a": "é\n\"", "e": {}, "f": []}"#,
    )
    .unwrap();
    let dumps = |indent: Option<&str>, sort: bool| {
        let mut d = Dumps {
            indent: indent.map(str::to_owned),
            item: ", ".into(),
            key: ": ".into(),
            sort_keys: sort,
            ensure_ascii: false,
        };
        if indent.is_some() {
            d.item = ",".into();
        }
        let mut out = String::new();
        d.value(&v, 0, &mut out).unwrap();
        out
    };
    // Python: json.dumps(v, ensure_ascii=False[, indent=2][, sort_keys=True]).
    assert_eq!(
        dumps(None, false),
        r#"{"b": [1, 2.5, 1e-05, true, null], "a": "é\n\"", "e": {}, "f": []}"#
    );
    assert_eq!(
        dumps(Some("  "), true),
        "{\n  \"a\": \"é\\n\\\"\",\n  \"b\": [\n    1,\n    2.5,\n    1e-05,\n    true,\n    null\n  ],\n  \"e\": {},\n  \"f\": []\n}"
    );
    assert_eq!(py_float(1.0), "1.0");
    assert_eq!(py_float(1.5e20), "1.5e+20");
    assert_eq!(py_float(0.0001), "0.0001");
    assert_eq!(py_float(-2.5e-7), "-2.5e-07");
}
