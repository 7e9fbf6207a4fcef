use model_sim::messages::{Answer as SimAnswer, event, token_events, usage};
use serde_json::json;

use super::*;

/// Feeds `stream` in pieces of `piece` bytes; the index of the piece that held the first token.
fn read(shape: Shape, stream: &[u8], piece: usize) -> (AnswerReader, Option<usize>) {
    let mut r = AnswerReader::new(shape);
    let mut first = None;
    for (i, chunk) in stream.chunks(piece).enumerate() {
        if r.feed(chunk) {
            assert!(first.is_none(), "the first token is reported once");
            first = Some(i);
        }
    }
    (r, first)
}

/// model-sim's Messages stream of `n` tokens: 1,712 prompt tokens, 1,536 of them cached.
fn sim_stream(n: usize) -> String {
    let u = usage(1712, 1536, n);
    let message = json!({"id": "msg_1", "type": "message", "role": "assistant", "content": [],
        "usage": u});
    (0..n)
        .map(|i| token_events(&SimAnswer::Text, &message, &u, " word", i, n))
        .collect()
}

#[test]
fn usage_counts_come_from_the_last_usage_chunk_and_a_whole_stream_ends_with_done() {
    let tail = b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\": 1712,\"prompt_tokens_details\":{\"cached_tokens\":1536}}}\n\ndata: [DONE]";
    assert_eq!(usage_count(tail, b"\"prompt_tokens\":"), 1712);
    assert_eq!(usage_count(tail, b"\"cached_tokens\":"), 1536);
    assert_eq!(usage_count(b"data: [DONE]", b"\"cached_tokens\":"), 0);
    assert!(finished(tail));
    assert!(finished(b"data: [DONE]\n\n"));
    assert!(!finished(
        b"data: {\"choices\":[{\"delta\":{\"content\":\" the\"}}]}\n\n"
    ));
    assert!(!finished(b""));
}

#[test]
fn an_openai_stream_counts_its_tokens_and_needs_a_finish_reason_and_done() {
    let token = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" the\"},\"finish_reason\":null}]}\n\n";
    let last = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" end\"},\"finish_reason\":\"length\"}]}\n\n";
    let usage = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":900,\"prompt_tokens_details\":{\"cached_tokens\":512}}}\n\n";
    let whole = format!("{token}{token}{last}{usage}data: [DONE]\n\n");
    for piece in [1, 5, 64, 4096] {
        let (r, first) = read(Shape::OpenAi, whole.as_bytes(), piece);
        assert_eq!(first, Some(0), "the first bytes");
        let a = r.finish(true).unwrap();
        // Three tokens: every `data:` event but the usage chunk and `[DONE]`.
        assert_eq!(a.output_tokens, 3, "pieces of {piece}");
        assert_eq!((a.prompt_tokens, a.cached_tokens), (900, 512));
    }
    // A router that closed the stream after its engine died: `[DONE]`, no finish_reason.
    let cut = format!("{token}data: [DONE]\n\n");
    assert_eq!(read(Shape::OpenAi, cut.as_bytes(), 7).0.finish(true), None);
    // The Responses API ends its answer with `response.completed`.
    let responses = "data: {\"type\":\"response.completed\",\"response\":{}}\n\ndata: [DONE]\n\n";
    assert!(
        read(Shape::OpenAi, responses.as_bytes(), 3)
            .0
            .finish(true)
            .is_some()
    );
}

#[test]
fn an_anthropic_stream_counts_its_deltas_and_reads_anthropics_usage() {
    let whole = sim_stream(4);
    for piece in [1, 9, 100, 1 << 16] {
        let (r, first) = read(Shape::Anthropic, whole.as_bytes(), piece);
        // The first token is the first `content_block_delta`, not `message_start`.
        let delta_end = whole.find("event: content_block_delta").unwrap() + DELTA.len();
        assert_eq!(first, Some((delta_end - 1) / piece), "pieces of {piece}");
        let a = r.finish(true).unwrap();
        assert_eq!(a.output_tokens, 4);
        // input_tokens (176, not cached) + cache_read_input_tokens (1536).
        assert_eq!((a.prompt_tokens, a.cached_tokens), (1712, 1536));
    }
    // A JSON answer (not streamed) reads the same usage.
    let body = json!({"type": "message", "usage": usage(1000, 640, 8)}).to_string();
    let a = read(Shape::Anthropic, body.as_bytes(), 50)
        .0
        .finish(false)
        .unwrap();
    assert_eq!((a.prompt_tokens, a.cached_tokens), (1000, 640));
}

#[test]
fn anthropic_usage_missing_from_message_delta_is_read_from_message_start() {
    // vLLM-like: input tokens in message_start, output tokens alone in message_delta, and a
    // long answer between them.
    let start = json!({"type": "message_start", "message": {"usage": {"input_tokens": 300,
        "cache_read_input_tokens": 200, "output_tokens": 1}}});
    let mut stream = event("message_start", &start);
    for _ in 0..200 {
        stream.push_str(&event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": " word"}}),
        ));
    }
    stream.push_str(&event(
        "message_delta",
        &json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
            "usage": {"output_tokens": 200}}),
    ));
    stream.push_str(&event("message_stop", &json!({"type": "message_stop"})));
    let a = read(Shape::Anthropic, stream.as_bytes(), 333)
        .0
        .finish(true)
        .unwrap();
    assert_eq!(a.output_tokens, 200);
    assert_eq!((a.prompt_tokens, a.cached_tokens), (500, 200));
}

#[test]
fn an_anthropic_stream_with_an_error_or_cut_before_message_stop_is_not_an_answer() {
    let whole = sim_stream(3);
    let stop = whole.find("event: message_stop").unwrap();
    let delta = whole.find("event: message_delta").unwrap();
    let error = event(
        "error",
        &json!({"type": "error", "error": {"type": "overloaded_error", "message": "x"}}),
    );
    for (what, stream) in [
        ("cut before message_stop", whole[..stop].to_string()),
        ("cut inside message_stop", whole[..stop + 12].to_string()),
        (
            "message_stop without message_delta",
            format!("{}{}", &whole[..delta], &whole[stop..]),
        ),
        (
            "an error event",
            format!("{}{error}{}", &whole[..delta], &whole[delta..]),
        ),
        ("only an error", error.clone()),
        ("empty", String::new()),
    ] {
        let r = read(Shape::Anthropic, stream.as_bytes(), 11).0;
        assert_eq!(r.finish(true), None, "{what}");
    }
    assert!(
        read(Shape::Anthropic, whole.as_bytes(), 11)
            .0
            .finish(true)
            .is_some()
    );
}

#[test]
fn the_shape_follows_the_path() {
    assert_eq!(Shape::of("/v1/messages"), Shape::Anthropic);
    assert_eq!(Shape::of("/v1/chat/completions"), Shape::OpenAi);
    assert_eq!(Shape::of("/v1/completions"), Shape::OpenAi);
    assert_eq!(Shape::of("/v1/messages/count_tokens"), Shape::OpenAi);
}
