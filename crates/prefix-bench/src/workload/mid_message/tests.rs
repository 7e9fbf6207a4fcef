//! The shapes of the mid-message workloads: where the shared text sits, what two requests of
//! one group share, which API they use, how often groups repeat.

use std::collections::BTreeMap;

use serde_json::Value;

use super::*;
use crate::workload::{ceiling_hit_rate, engine_prompt};

fn messages(r: &BenchRequest) -> &Vec<Value> {
    r.body["messages"].as_array().unwrap()
}

fn content(m: &Value) -> &str {
    m["content"].as_str().unwrap()
}

/// The last message's content.
fn last(r: &BenchRequest) -> &str {
    content(messages(r).last().unwrap())
}

fn common_prefix(a: &str, b: &str) -> usize {
    a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count()
}

/// Requests per group.
fn per_group(w: &[BenchRequest]) -> BTreeMap<u32, usize> {
    let mut out = BTreeMap::new();
    for r in w {
        *out.entry(r.group.unwrap()).or_default() += 1;
    }
    out
}

/// Two requests of one group and one of another (the first found).
fn same_and_other(w: &[BenchRequest]) -> (&BenchRequest, &BenchRequest, &BenchRequest) {
    let a = &w[0];
    let b = w[1..].iter().find(|r| r.group == a.group).unwrap();
    let c = w.iter().find(|r| r.group != a.group).unwrap();
    (a, b, c)
}

/// Zipf popularity: the first group the most frequent, most groups drawn at least once.
fn assert_zipf(w: &[BenchRequest], groups: usize) {
    let n = per_group(w);
    let first = n.get(&0).copied().unwrap_or(0);
    assert!(n.values().all(|c| *c <= first), "{n:?}");
    assert!(first > w.len() / (2 * groups) * 4, "{n:?}");
    assert!(n.len() * 4 >= groups * 3, "{n:?}");
    assert!(n.keys().all(|g| (*g as usize) < groups));
}

#[test]
fn retrieval_puts_the_document_inside_the_user_message_after_a_shared_instruction_block() {
    let w = retrieval(32, 320, 256, 1536, 64, 32, 1.0, 1, "m");
    assert_eq!(w.len(), 320);
    let again = retrieval(32, 320, 256, 1536, 64, 32, 1.0, 1, "m");
    assert!(
        w.iter()
            .zip(&again)
            .all(|(a, b)| a.body == b.body && a.group == b.group)
    );
    let instruction = content(&messages(&w[0])[0]);
    assert!(instruction.len() >= 1024);
    for r in &w {
        assert_eq!(r.path, "/v1/chat/completions");
        let m = messages(r);
        assert_eq!(
            (m.len(), m[0]["role"].as_str(), m[1]["role"].as_str()),
            (2, Some("system"), Some("user"))
        );
        assert_eq!(content(&m[0]), instruction);
        // The document (~6 KB) opens the user message, the question closes it.
        let user = content(&m[1]);
        let (doc, question) = user.split_once("\n\nQuestion: ").unwrap();
        assert!(doc.starts_with(&format!("Document {}:\n", r.group.unwrap())));
        assert!(
            doc.len() > 6 * 1024 && question.len() == 256,
            "{} {}",
            doc.len(),
            question.len()
        );
        assert!(r.conversation.is_none());
    }
    // Same document: identical up to the question, then different; another document: only the
    // instruction block (and the word "Document ") in common.
    let (a, b, c) = same_and_other(&w);
    let (ua, ub) = (last(a), last(b));
    let question_at = ua.find("\n\nQuestion: ").unwrap() + "\n\nQuestion: ".len();
    assert_eq!(
        common_prefix(ua, ub),
        question_at + common_prefix(&ua[question_at..], &ub[question_at..])
    );
    assert!(common_prefix(&ua[question_at..], &ub[question_at..]) < 16);
    assert!(common_prefix(ua, last(c)) < 16);
    // As the engine sees them: the shared part ends inside the last message.
    let (pa, pb) = (engine_prompt(a).unwrap().1, engine_prompt(b).unwrap().1);
    let shared = common_prefix(&pa, &pb);
    let user_at = pa.find(&ua[..64]).unwrap();
    assert!(
        shared >= user_at + question_at && shared < user_at + ua.len(),
        "{shared}"
    );
    assert_zipf(&w, 32);
    // Every repeat of a document reuses it: the ceiling is well above the first-time misses.
    let ceiling = ceiling_hit_rate(&w, 16);
    assert!(ceiling > 0.75 && ceiling < 0.95, "{ceiling}");
}

#[test]
fn completion_doc_sends_a_prompt_string_to_the_completions_api() {
    let w = completion_doc(32, 320, 1536, 64, 32, 1.0, 1, "m");
    assert_eq!(w.len(), 320);
    for r in &w {
        assert_eq!(r.path, "/v1/completions");
        assert!(r.body.get("messages").is_none());
        let prompt = r.body["prompt"].as_str().unwrap();
        assert!(prompt.ends_with("\nAnswer:"));
        let (doc, _) = prompt.split_once("\n\nQuestion: ").unwrap();
        assert!(doc.len() >= 6 * 1024, "{}", doc.len());
        assert_eq!(r.body["model"], "m");
        assert_eq!(r.body["stream"], true);
        // The router parses it as a completion: its prompt is the string itself.
        assert_eq!(engine_prompt(r).unwrap().1, prompt);
    }
    let (a, b, c) = same_and_other(&w);
    let prompt = |r: &BenchRequest| r.body["prompt"].as_str().unwrap().to_string();
    let (pa, pb) = (prompt(a), prompt(b));
    let head = pa.find("\n\nQuestion: ").unwrap() + "\n\nQuestion: ".len();
    assert_eq!(pa[..head], pb[..head]);
    assert!(common_prefix(&pa, &pb) < head + 16);
    assert!(common_prefix(&pa, &prompt(c)) < 16);
    assert_zipf(&w, 32);
    // Not the retrieval workload's documents.
    let chat = retrieval(32, 8, 256, 1536, 64, 32, 1.0, 1, "m");
    assert!(!last(&chat[0]).contains(&pa[..256]));
}

#[test]
fn few_shot_examples_and_the_query_share_the_last_user_message() {
    let w = few_shot(12, 320, 1024, 64, 32, 1.0, 1, "m");
    assert_eq!(w.len(), 320);
    for r in &w {
        let m = messages(r);
        assert_eq!(m.len(), 2);
        assert_eq!(content(&m[0]), FEW_SHOT_SYSTEM);
        assert_eq!(m[1]["role"], "user");
        let (examples, query) = last(r).split_once("\n\nQuery: ").unwrap();
        assert!(examples.starts_with("Examples:\n") && examples.len() >= 4 * 1024);
        assert_eq!(query.len(), 256);
    }
    let (a, b, c) = same_and_other(&w);
    let head = last(a).find("\n\nQuery: ").unwrap() + "\n\nQuery: ".len();
    assert_eq!(last(a)[..head], last(b)[..head]);
    assert!(common_prefix(last(a), last(b)) < head + 16);
    assert!(common_prefix(last(a), last(c)) < "Examples:\n".len() + 16);
    assert_zipf(&w, 12);
}

#[test]
fn tool_result_sessions_resend_one_long_result_inside_their_last_message() {
    let w = tool_result(8, 5, 2048, 64, 2048, 64, 48, 1, "m");
    assert_eq!(w.len(), 40);
    let preamble = content(&messages(&w[0])[0]);
    assert!(preamble.len() > 2048);
    let mut sessions: BTreeMap<u32, Vec<&BenchRequest>> = BTreeMap::new();
    for r in &w {
        assert_eq!(content(&messages(r)[0]), preamble);
        assert_eq!(r.conversation, r.group);
        sessions.entry(r.conversation.unwrap()).or_default().push(r);
    }
    assert_eq!(sessions.len(), 8);
    for turns in sessions.values() {
        assert_eq!(turns.len(), 5);
        for (t, pair) in turns.windows(2).enumerate() {
            let (a, b) = (messages(pair[0]), messages(pair[1]));
            // The preamble, then one user message that re-sends the task and the result.
            assert_eq!((a.len(), b.len()), (2, 2));
            assert_eq!(a[1]["role"], "user");
            let (ra, sa) = last(pair[0]).split_once("\n\nStep ").unwrap();
            let (rb, sb) = last(pair[1]).split_once("\n\nStep ").unwrap();
            assert_eq!(ra, rb);
            let (task, result) = ra.split_once("\n\nTool result:\n").unwrap();
            assert!(task.starts_with("Task: ") && result.len() >= 8 * 1024);
            assert!(sa.starts_with(&format!("{t}: ")) && sb.starts_with(&format!("{}: ", t + 1)));
            assert_ne!(sa[3..], sb[3..]);
        }
    }
    // Sessions share the preamble (and the word "Task: ") only.
    let (a, c) = (sessions[&0][0], sessions[&1][0]);
    assert!(common_prefix(last(a), last(c)) < "Task: ".len() + 16);
    let ceiling = ceiling_hit_rate(&w, 16);
    assert!(ceiling > 0.7 && ceiling < 0.95, "{ceiling}");
}
