//! The sidecar's logs on stderr: `--log-format text|json` (GIE's `--zap-encoder console|json`
//! says the same) and `--v N`.
//!
//! - json: every line is one JSON object (`timestamp`, `level`, `message`, the event's fields,
//!   `target`). Nothing else writes to stderr: flag errors, start-up errors ([`fatal`]) and
//!   panics ([`init`] installs a panic hook) go through the same subscriber.
//! - text: human-readable lines (ANSI colours on a terminal only); panics keep Rust's own message.
//! - `--v` as klog: 0-1 warn, 2-3 info, 4 adds prefix-picker's debug lines and Kthena's per-pod
//!   score lines (target `scores`, Kthena's `klog.V(4)` text as the message, unchanged),
//!   5+ trace. `RUST_LOG` overrides.
//! - Prompts: no prefix-picker event carries a request body or prompt text, at any level. From
//!   `--v 5` the libraries underneath (h2, tonic, hyper) trace their frames, which can.

use tracing_subscriber::EnvFilter;

use crate::cli::LogFormat;

/// The default filter for a `--v` level.
pub fn filter(v: u8) -> &'static str {
    match v {
        0 | 1 => "warn",
        2 | 3 => "info",
        4 => "info,scores=debug,prefix_picker=debug",
        _ => "trace",
    }
}

/// Installs the process's subscriber on stderr and, for json, the panic hook.
pub fn init(v: u8, format: LogFormat) {
    use std::io::IsTerminal;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(filter(v)));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => logs.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => {
            logs.json().flatten_event(true).init();
            std::panic::set_hook(Box::new(log_panic));
        }
    }
}

/// A panic as one error event (target `panic`): the payload as the message, where it happened
/// and the thread; a backtrace when `RUST_BACKTRACE` asks for one.
fn log_panic(info: &std::panic::PanicHookInfo<'_>) {
    let payload = info.payload();
    let message = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("Box<dyn Any>");
    let location = info
        .location()
        .map_or_else(String::new, ToString::to_string);
    let thread = std::thread::current();
    let thread = thread.name().unwrap_or("<unnamed>");
    let backtrace = std::backtrace::Backtrace::capture();
    if backtrace.status() == std::backtrace::BacktraceStatus::Captured {
        tracing::error!(target: "panic", %location, thread, %backtrace, "panicked: {message}");
    } else {
        tracing::error!(target: "panic", %location, thread, "panicked: {message}");
    }
}

/// An error that stops the process: logged, and in text also printed as `error: ...` (the line
/// a terminal user reads, whatever `RUST_LOG` filters).
pub fn fatal(format: LogFormat, message: &str) {
    tracing::error!("{message}");
    if format == LogFormat::Text {
        eprintln!("error: {message}");
    }
}

/// The format the sidecar's arguments ask for (clap's `--name=value` form, [`crate::cli::normalize`]'s
/// output), for errors found before they are parsed: the last `--log-format` or `--zap-encoder`.
pub fn requested_format(args: &[String]) -> LogFormat {
    use clap::ValueEnum;
    args.iter()
        .filter_map(|a| {
            a.strip_prefix("--log-format=")
                .or_else(|| a.strip_prefix("--zap-encoder="))
        })
        .filter_map(|v| LogFormat::from_str(v, false).ok())
        .next_back()
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_format_flag_wins_and_bad_values_are_skipped() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(requested_format(&args(&[])), LogFormat::Text);
        assert_eq!(
            requested_format(&args(&["--v=2", "--zap-encoder=json"])),
            LogFormat::Json
        );
        assert_eq!(
            requested_format(&args(&["--log-format=json", "--zap-encoder=console"])),
            LogFormat::Text
        );
        assert_eq!(
            requested_format(&args(&["--log-format=json", "--log-format=yaml"])),
            LogFormat::Json
        );
    }

    /// The child half of `panics_are_one_json_line`: set up as the binary does, then panic.
    #[test]
    #[ignore = "run by panics_are_one_json_line in a process of its own"]
    fn panic_child() {
        init(2, LogFormat::Json);
        tracing::info!("before");
        panic!("boom \"quoted\"\nsecond line");
    }

    /// The panic hook is global, so the panic happens in a child process (this test binary
    /// running `panic_child` alone) whose stderr is read back.
    #[test]
    fn panics_are_one_json_line() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "logging::tests::panic_child", "--ignored"])
            .args(["--nocapture", "--test-threads=1"])
            .env_remove("RUST_LOG")
            .env_remove("RUST_BACKTRACE")
            .output()
            .unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8(out.stderr).unwrap();
        let lines: Vec<serde_json::Value> = stderr
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}\n{stderr}")))
            .collect();
        assert_eq!(lines.len(), 2, "{stderr}");
        assert_eq!(lines[0]["message"], "before");
        let panic = &lines[1];
        assert_eq!(
            (panic["level"].as_str(), panic["target"].as_str()),
            (Some("ERROR"), Some("panic"))
        );
        assert_eq!(panic["message"], "panicked: boom \"quoted\"\nsecond line");
        assert!(
            panic["location"]
                .as_str()
                .is_some_and(|l| l.starts_with("src/logging.rs:")),
            "{panic}"
        );
        assert_eq!(panic["thread"], "logging::tests::panic_child");
    }
}
