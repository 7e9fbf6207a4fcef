//! libFuzzer target: any bytes as a request body through parsing, rendering and hashing, checking
//! the invariants of `prefix_picker::invariants` (the regression test replays `fuzz/seeds/` and
//! `fuzz/regressions/` through the same function). Run with `scripts/fuzz`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|body: &[u8]| {
    prefix_picker::invariants::check_request_body(body);
});
