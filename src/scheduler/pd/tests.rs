//! PD scheduling on plain candidates, against Kthena's `scheduler_impl.go` rules.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use super::*;
use crate::scheduler::affinity::{AffinityConfig, RecentPicks, rendezvous_key};
use crate::scheduler::config::{SchedulerConfig, ScorerKind};
use crate::scheduler::test_pod::{Lines, Pod, req};
use crate::scheduler::{EngineStats, PluginType};

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Kthena's usual shape: `groupKey: group`, `role=prefill` / `role=decode`.
fn group() -> PdGroup {
    PdGroup::try_new(
        "group".into(),
        labels(&[("role", "prefill")]),
        labels(&[("role", "decode")]),
    )
    .unwrap()
}

struct Cluster {
    s: Scheduler,
    pods: Vec<Arc<Pod>>,
}

/// `spec`: (name, role, group) per pod; `""` leaves the label out.
fn cluster(config: SchedulerConfig, spec: &[(&str, &str, &str)]) -> Cluster {
    let s = Scheduler::new(config, 5, 1);
    let pods = spec
        .iter()
        .enumerate()
        .map(|(i, (name, role, group))| {
            let mut l = BTreeMap::new();
            if !role.is_empty() {
                l.insert("role".to_string(), role.to_string());
            }
            if !group.is_empty() {
                l.insert("group".to_string(), group.to_string());
            }
            let address = SocketAddr::from(([10, 0, 0, i as u8 + 1], 8000));
            Arc::new(Pod {
                handle: s.prefix_cache().index().add_pod(),
                label: format!("default/{name}"),
                labels: l,
                stats: EngineStats::default(),
                recent: RecentPicks::default(),
                rendezvous: rendezvous_key(&address),
                engine: None,
            })
        })
        .collect();
    Cluster { s, pods }
}

fn names(pods: &[Arc<Pod>]) -> Vec<&str> {
    pods.iter().map(|p| p.label.as_str()).collect()
}

impl Cluster {
    fn pod(&self, name: &str) -> &Arc<Pod> {
        self.pods
            .iter()
            .find(|p| p.label == format!("default/{name}"))
            .unwrap()
    }

    fn record(&self, prompt: &str, name: &str) {
        let hashes = self.s.prefix_cache().hash("m", prompt.as_bytes());
        self.s.record("m", &hashes, &self.pod(name).handle);
    }

    fn schedule(&self, prompt: &str) -> Result<Decision<Arc<Pod>>, Unpaired> {
        self.s.schedule_pd(req(prompt), self.pods.clone(), &group())
    }
}

fn prefix_only() -> SchedulerConfig {
    SchedulerConfig {
        scorers: vec![(ScorerKind::PrefixCache, 1)],
        ..SchedulerConfig::default()
    }
}

fn match_ratios(observations: &[Observation]) -> usize {
    observations
        .iter()
        .filter(|o| matches!(o, Observation::MatchRatio(_)))
        .count()
}

#[test]
fn pods_are_sorted_as_kthena_categorizes_them() {
    let g = group();
    let of = |pairs: &[(&str, &str)]| {
        let l = labels(pairs);
        g.classify(|k| l.get(k).map(String::as_str))
            .map(|(r, v)| (r, v.to_string()))
    };
    assert_eq!(
        of(&[("role", "decode"), ("group", "a")]),
        Some((PdRole::Decode, "a".into()))
    );
    assert_eq!(
        of(&[("role", "prefill"), ("group", "b")]),
        Some((PdRole::Prefill, "b".into()))
    );
    // No group value (absent or empty): in no group, whatever the role.
    assert_eq!(of(&[("role", "decode")]), None);
    assert_eq!(of(&[("role", "decode"), ("group", "")]), None);
    // Neither label set.
    assert_eq!(of(&[("role", "other"), ("group", "a")]), None);
    // Decode is checked first: a pod matching both sets is a decode pod.
    let both = PdGroup::try_new(
        "g".into(),
        labels(&[("x", "1")]),
        labels(&[("x", "1"), ("y", "1")]),
    )
    .unwrap();
    let l = labels(&[("g", "a"), ("x", "1"), ("y", "1")]);
    assert_eq!(
        both.classify(|k| l.get(k).map(String::as_str)),
        Some((PdRole::Decode, "a"))
    );
    // Go's map read: an absent label is "", so a required empty value matches it.
    let empty = PdGroup::try_new(
        "g".into(),
        labels(&[("kind", "")]),
        labels(&[("kind", "decode")]),
    )
    .unwrap();
    let l = labels(&[("g", "a")]);
    assert_eq!(
        empty.classify(|k| l.get(k).map(String::as_str)),
        Some((PdRole::Prefill, "a"))
    );
}

#[test]
fn a_group_that_cannot_sort_pods_is_refused_naming_the_key() {
    let ok = labels(&[("role", "x")]);
    let e = PdGroup::try_new(" ".into(), ok.clone(), labels(&[("role", "y")])).unwrap_err();
    assert_eq!(
        e.to_string(),
        "pdGroup.groupKey must be a non-empty label key, got \" \""
    );
    let e = PdGroup::try_new("g".into(), BTreeMap::new(), ok.clone()).unwrap_err();
    assert_eq!(e, PdGroupError::NoLabels("prefillLabels"));
    let e = PdGroup::try_new("g".into(), ok.clone(), BTreeMap::new()).unwrap_err();
    assert_eq!(e, PdGroupError::NoLabels("decodeLabels"));
    let e = PdGroup::try_new("g".into(), ok.clone(), ok).unwrap_err();
    assert!(e.to_string().contains("role=x"), "{e}");
}

#[test]
fn the_pair_is_the_best_prefill_pod_of_the_decode_pods_group() {
    let c = cluster(
        prefix_only(),
        &[
            ("d-a", "decode", "a"),
            ("d-b", "decode", "b"),
            ("p-a0", "prefill", "a"),
            ("p-a1", "prefill", "a"),
            ("p-b", "prefill", "b"),
            ("loner", "", "a"),
        ],
    );
    let prompt = "shared system prompt ".repeat(20);
    // d-b holds the prompt; of group b's prefill pods only p-b may pair with it, though p-a1
    // holds it too.
    c.record(&prompt, "d-b");
    c.record(&prompt, "p-a1");
    let d = c.schedule(&prompt).unwrap();
    assert_eq!(names(&d.ranked), ["default/d-b"]);
    assert_eq!(d.reason, DecisionReason::PrefixHit);
    let pd = d.pd.as_ref().unwrap();
    assert_eq!(pd.prefill.label, "default/p-b");
    // The decode pass scored decode pods only; the pod with no role is in no pass.
    assert_eq!(names(&d.candidates), ["default/d-a", "default/d-b"]);
    // Both decode pods were kept, each searched its own group.
    assert_eq!(pd.passes.len(), 2);
    for pass in &pd.passes {
        let PrefillPass::Scored { decode, decision } = pass else {
            panic!("both groups have prefill pods");
        };
        let want: &[&str] = if decode.label == "default/d-a" {
            &["default/p-a0", "default/p-a1"]
        } else {
            &["default/p-b"]
        };
        assert_eq!(names(&decision.candidates), want);
    }
    // And the group a pass picks the prefill pod holding the prompt.
    c.record(&prompt, "d-a");
    let d = c.schedule(&prompt).unwrap();
    let pd = d.pd.unwrap();
    let a = pd
        .passes
        .iter()
        .find_map(|p| match p {
            PrefillPass::Scored { decode, decision } if decode.label == "default/d-a" => {
                Some(decision.primary().label.clone())
            }
            _ => None,
        })
        .unwrap();
    assert_eq!(a, "default/p-a1");
}

#[test]
fn the_best_five_decode_pods_are_kept_and_fallbacks_stay_in_the_primarys_group() {
    let mut spec = vec![];
    let names_: Vec<String> = (0..7).map(|i| format!("d{i}")).collect();
    for (i, n) in names_.iter().enumerate() {
        spec.push((n.as_str(), "decode", if i < 4 { "a" } else { "b" }));
    }
    spec.push(("p-a", "prefill", "a"));
    spec.push(("p-b", "prefill", "b"));
    let c = cluster(prefix_only(), &spec);
    let prompt = "p ".repeat(100);
    // Longest matches: d4 (group b) best, then d0, d1, d5 with shorter ones.
    c.record(&prompt, "d4");
    let half = &prompt[..100];
    for n in ["d0", "d1", "d5"] {
        c.record(half, n);
    }
    let d = c.schedule(&prompt).unwrap();
    let pd = d.pd.as_ref().unwrap();
    // Kthena's topN: five decode pods tried, each with a prefill pass.
    assert_eq!(pd.passes.len(), TOP_DECODE);
    assert_eq!(d.candidates.len(), 7);
    assert_eq!(d.ranked[0].label, "default/d4");
    assert_eq!(pd.prefill.label, "default/p-b");
    for f in &d.ranked {
        assert_eq!(
            f.labels["group"], "b",
            "fallbacks share the primary's group"
        );
    }
    // One match ratio per pass: the decode pass and five prefill passes.
    assert_eq!(match_ratios(&d.observations), 1 + TOP_DECODE);
    assert_eq!(
        d.observations
            .iter()
            .filter(|o| matches!(
                o,
                Observation::PluginTime {
                    kind: PluginType::Filter,
                    ..
                }
            ))
            .count(),
        1 + TOP_DECODE,
        "the filters run on every pass"
    );
}

#[test]
fn decode_pods_without_a_pair_are_skipped() {
    let c = cluster(
        prefix_only(),
        &[
            ("d-lonely", "decode", "z"),
            ("d-a", "decode", "a"),
            ("p-a", "prefill", "a"),
        ],
    );
    let prompt = "q ".repeat(100);
    c.record(&prompt, "d-lonely");
    let d = c.schedule(&prompt).unwrap();
    let pd = d.pd.as_ref().unwrap();
    assert!(matches!(
        &pd.passes[0],
        PrefillPass::NoPrefillPods { decode } if decode.label == "default/d-lonely"
    ));
    assert_eq!(names(&d.ranked), ["default/d-a"]);
    assert_eq!(pd.prefill.label, "default/p-a");
    // d-lonely held the prefix, the pick does not.
    assert_eq!(d.reason, DecisionReason::PrefixOverruled);
}

#[test]
fn no_decode_pod_and_no_pair_are_kthenas_errors() {
    let c = cluster(
        prefix_only(),
        &[("p-a", "prefill", "a"), ("d-nogroup", "decode", "")],
    );
    let e = c.schedule("x").unwrap_err();
    assert_eq!(e.error, PickError::NoDecodePod);
    assert_eq!(e.error.to_string(), "no decode pod found");
    assert!(e.observations.is_empty());

    let c = cluster(
        prefix_only(),
        &[("d-a", "decode", "a"), ("p-b", "prefill", "b")],
    );
    let e = c.schedule("x").unwrap_err();
    assert_eq!(e.error, PickError::NoPdPair);
    assert_eq!(
        PickError::from(e.clone()).to_string(),
        "no valid prefill-decode pod pairs found"
    );
    // The decode pass was scored (and observed) before the pairs were searched.
    assert_eq!(match_ratios(&e.observations), 1);
}

#[test]
fn the_filters_apply_to_each_pass() {
    let backed_up = EngineStats {
        waiting: 10.0,
        ..EngineStats::default()
    };
    // The pods, `name` backed up (a copy with full queue).
    let with = |c: &Cluster, name: &str| -> Vec<Arc<Pod>> {
        c.pods
            .iter()
            .map(|p| {
                if p.label != format!("default/{name}") {
                    return p.clone();
                }
                Arc::new(Pod {
                    handle: c.s.prefix_cache().index().add_pod(),
                    label: p.label.clone(),
                    labels: p.labels.clone(),
                    stats: backed_up,
                    recent: RecentPicks::default(),
                    rendezvous: p.rendezvous,
                    engine: None,
                })
            })
            .collect()
    };
    let c = cluster(
        SchedulerConfig::default(),
        &[("d", "decode", "a"), ("p", "prefill", "a")],
    );
    // Every prefill pod backed up: the pair is filtered out (not an error of its own).
    let e =
        c.s.schedule_pd(req("x"), with(&c, "p"), &group())
            .unwrap_err();
    assert_eq!(e.error, PickError::NoPdPair);
    // Every decode pod backed up: the filter's error.
    let e =
        c.s.schedule_pd(req("x"), with(&c, "d"), &group())
            .unwrap_err();
    assert_eq!(e.error, PickError::Filtered("least-request"));
}

#[test]
fn explain_changes_nothing_and_agrees_with_schedule() {
    let c = cluster(
        SchedulerConfig::default(),
        &[
            ("d0", "decode", "a"),
            ("d1", "decode", "a"),
            ("p0", "prefill", "a"),
            ("p1", "prefill", "a"),
        ],
    );
    let e = c.s.explain_pd(req("y"), c.pods.clone(), &group()).unwrap();
    let d = c.schedule("y").unwrap();
    assert_eq!(names(&e.ranked), names(&d.ranked));
    assert_eq!(e.pd.unwrap().prefill.label, d.pd.unwrap().prefill.label);
}

#[test]
fn affinity_commits_hold_the_prompt_for_both_pods() {
    let mut config = prefix_only();
    config.apply_affinity(Some(AffinityConfig {
        tentative: true,
        ..AffinityConfig::default()
    }));
    let c = cluster(config, &[("d", "decode", "a"), ("p", "prefill", "a")]);
    let prompt = "held ".repeat(40);
    let d = c.schedule(&prompt).unwrap();
    assert!(d.hashes.len() > 1);
    let decode_hold = c.s.commit("m", &d).expect("decode hold");
    let prefill_hold = c.s.commit_prefill("m", &d).expect("prefill hold");
    assert_eq!(decode_hold.pod(), c.pod("d").slot());
    assert_eq!(prefill_hold.pod(), c.pod("p").slot());
    assert_eq!(c.s.tentative().holds(), 2);
    // Each pod's recent writes count the prompt it did not hold (all of it, on either).
    let ln_keep = 0.5f64.ln();
    assert!(c.pod("d").recent.share_written_ln(1, ln_keep).1 > 0.0);
    assert!(c.pod("p").recent.share_written_ln(2, ln_keep).1 > 0.0);
    // The held prompt now matches on both pods (the next request sees it on each pass).
    let next = c.schedule(&prompt).unwrap();
    assert_eq!(next.reason, DecisionReason::AffinityHit);
    assert_eq!(
        next.pd.as_ref().unwrap().prefill_reason,
        DecisionReason::AffinityHit
    );
    drop(decode_hold);
    drop(prefill_hold);
    assert_eq!(c.s.tentative().holds(), 0);
    // Outside the affinity mode nothing is held.
    let plain = cluster(
        prefix_only(),
        &[("d", "decode", "a"), ("p", "prefill", "a")],
    );
    let d = plain.schedule(&prompt).unwrap();
    assert!(plain.s.commit_prefill("m", &d).is_none());
}

#[test]
fn verbose_lines_are_kthenas_phase_lines_then_each_passs_scores() {
    let c = cluster(
        prefix_only(),
        &[
            ("d-a", "decode", "a"),
            ("d-z", "decode", "z"),
            ("p-a", "prefill", "a"),
        ],
    );
    let prompt = "v ".repeat(40);
    c.record(&prompt, "d-a");
    let d = c.schedule(&prompt).unwrap();
    let lines = Lines::default();
    tracing::subscriber::with_default(lines.clone(), || d.log_scores());
    let got = lines.0.lock().unwrap().clone();
    assert_eq!(
        got,
        [
            "Using optimized PD disaggregated scheduling",
            "Running score plugins for decode pod",
            "ScorePlugin: prefix-cache",
            "Pod: default/d-a, Score: 100",
            "Pod: default/d-z, Score: 0",
            "Final Pod Scores:",
            "  Pod: default/d-a, Final Score: 100",
            "  Pod: default/d-z, Final Score: 0",
            "Running score plugins for prefill pod",
            "ScorePlugin: prefix-cache",
            "Pod: default/p-a, Score: 0",
            "Final Pod Scores:",
            "  Pod: default/p-a, Final Score: 0",
            "prefill pods for decode group not found",
        ]
    );
}
