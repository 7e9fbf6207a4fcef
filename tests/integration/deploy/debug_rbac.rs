//! The TokenReview ClusterRole is rendered only when the debug endpoints use TokenReview, and
//! the rendering passes schema validation.

use super::{deploy_check, documents, show};

fn render(values: &str) -> String {
    let out = deploy_check(&["render-values", values]);
    assert!(out.status.success(), "render failed:\n{}", show(&out));
    String::from_utf8(out.stdout).unwrap()
}

fn kinds(text: &str) -> Vec<String> {
    documents(text)
        .iter()
        .map(|d| d["kind"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[test]
fn the_token_review_cluster_role_is_granted_only_when_enabled() {
    let cluster_scoped = |text: &str| {
        kinds(text)
            .into_iter()
            .filter(|k| k.starts_with("ClusterRole"))
            .collect::<Vec<_>>()
    };
    assert!(cluster_scoped(&render("{}")).is_empty());
    let loopback = r#"{"picker": {"settings": {"debug": {"enabled": true}}}}"#;
    assert!(cluster_scoped(&render(loopback)).is_empty());
    let off = r#"{"picker": {"settings": {"debug": {"tokenReview": true}}}}"#;
    assert!(cluster_scoped(&render(off)).is_empty());
    let on = r#"{"picker": {"settings": {"debug": {"enabled": true, "tokenReview": true}}}}"#;
    let text = render(on);
    assert_eq!(cluster_scoped(&text), ["ClusterRole", "ClusterRoleBinding"]);
    let docs = documents(&text);
    let role = docs.iter().find(|d| d["kind"] == "ClusterRole").unwrap();
    assert_eq!(
        serde_json::to_value(&role["rules"]).unwrap(),
        serde_json::json!([{"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]}])
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("debug.yaml");
    std::fs::write(&file, &text).unwrap();
    let out = deploy_check(&["validate", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", show(&out));
    // The ServiceMonitor scrapes /metrics only, never a debug route.
    let full = r#"{"serviceMonitor": {"enabled": true}, "picker": {"settings": {"debug": {"enabled": true}}}}"#;
    let monitor = documents(&render(full))
        .into_iter()
        .find(|d| d["kind"] == "ServiceMonitor")
        .unwrap();
    let paths: Vec<&str> = monitor["spec"]["endpoints"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["/metrics"]);
}
