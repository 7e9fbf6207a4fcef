use super::*;

#[test]
fn chunks_are_bounded_and_last_ends_stream() {
    let body = vec![b'x'; BODY_CHUNK * 2 + 5];
    let chunks = body_chunks(&body);
    assert_eq!(chunks.len(), 3);
    assert_eq!(body_chunks(&[]).len(), 1);
}
