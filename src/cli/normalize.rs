//! Go flag syntax read as clap's: `-name value`, `-name=value`, `--name value` and
//! `--name=value` become `--name=value`; a boolean takes a value after `=` (Go's spellings `1`,
//! `t`, `FALSE`...) or a following `true`/`false`. GIE flags prefix-picker has no use for, and
//! unknown flags, are dropped with a warning each (the [`GIE_IGNORED`] list).

use super::ServeArgs;

/// GIE flags prefix-picker accepts and ignores, and whether each is a boolean (no separate value):
/// every flag of GIE v1.5.0's endpoint picker (`pkg/epp/server/options.go`, the last release with
/// the `inferencepool` chart) that prefix-picker has no use for, plus a few of earlier releases.
const GIE_IGNORED: &[(&str, bool)] = &[
    ("cache-info-metric", false),
    ("disable-endpoint-subset-filter", true),
    ("enable-cert-reload", true),
    ("enable-latency-predictor", true),
    ("enable-pprof", true),
    ("ha-enable-leader-election", true),
    ("health-checking", true),
    ("kubeconfig", false),
    ("log-level", false),
    ("lora-info-metric", false),
    ("metrics-endpoint-auth", true),
    ("metrics-staleness-threshold", false),
    ("model-server-metrics-https-insecure-skip-verify", true),
    ("model-server-metrics-path", false),
    ("model-server-metrics-port", false),
    ("model-server-metrics-scheme", false),
    ("refresh-metrics-interval", false),
    ("refresh-prometheus-metrics-interval", false),
    ("tracing", true),
    ("zap-devel", true),
    ("zap-log-level", false),
    ("zap-stacktrace-level", false),
    ("zap-time-encoding", false),
];

/// Flags clap parses itself anywhere.
const BUILT_IN: [&str; 4] = ["h", "help", "V", "version"];

/// A flag of [`ServeArgs`]: its long name and whether it needs a value.
#[derive(Debug, Clone)]
pub struct KnownFlag {
    pub name: String,
    pub takes_value: bool,
}

/// The flags of [`ServeArgs`], read from clap so a flag added there is known here.
pub fn serve_flags() -> Vec<KnownFlag> {
    use clap::Args;
    let command = ServeArgs::augment_args(clap::Command::new("serve"));
    command
        .get_arguments()
        .filter_map(|a| {
            let name = a.get_long()?.to_string();
            // A value after `=` only (`--secure-serving=false`): a boolean, as Go's. Unset
            // `num_args` (before clap builds the command) means one value.
            let takes_value = a.get_action().takes_values()
                && a.get_num_args().is_none_or(|n| n.min_values() > 0);
            Some(KnownFlag { name, takes_value })
        })
        .collect()
}

/// Rewrites Go-style flags (`-name`, `-name=value`) as clap's `--name[=value]` and drops the
/// flags prefix-picker does not know, returning the kept arguments and one warning per drop.
pub fn normalize(args: &[String], known: &[KnownFlag]) -> (Vec<String>, Vec<String>) {
    let (mut out, mut warnings) = (Vec::with_capacity(args.len()), Vec::new());
    let mut rest = Cursor { args, next: 0 };
    while let Some(arg) = rest.take() {
        if arg == "--" {
            out.extend(args[rest.next - 1..].iter().cloned());
            break;
        }
        let Some((name, inline)) = split_flag(arg) else {
            out.push(arg.to_string());
            continue;
        };
        if BUILT_IN.contains(&name) && inline.is_none() {
            out.push(arg.to_string());
            continue;
        }
        match known.iter().find(|f| f.name == name) {
            Some(flag) => out.push(kept_flag(flag, inline, &mut rest)),
            None => warnings.push(dropped_flag(name, inline, &mut rest)),
        }
    }
    (out, warnings)
}

/// The arguments not yet read.
struct Cursor<'a> {
    args: &'a [String],
    next: usize,
}

impl<'a> Cursor<'a> {
    /// The next argument, whatever it looks like.
    fn take(&mut self) -> Option<&'a str> {
        self.take_if(|_| true)
    }

    /// The next argument if `keep` accepts it.
    fn take_if(&mut self, keep: impl FnOnce(&str) -> bool) -> Option<&'a str> {
        let arg = self.args.get(self.next).filter(|a| keep(a))?;
        self.next += 1;
        Some(arg)
    }

    /// The next argument if it is a Go boolean, spelled as clap reads it.
    fn take_bool(&mut self) -> Option<&'static str> {
        let b = go_bool(self.args.get(self.next)?)?;
        self.next += 1;
        Some(b)
    }
}

/// A flag's name and its value after `=`, with one or two leading dashes; `None` for an
/// argument that is not a flag (no dash, or nothing after the dashes).
fn split_flag(arg: &str) -> Option<(&str, Option<&str>)> {
    let body = arg
        .strip_prefix("--")
        .or_else(|| arg.strip_prefix('-'))
        .filter(|b| !b.is_empty())?;
    Some(match body.split_once('=') {
        Some((n, v)) => (n, Some(v)),
        None => (body, None),
    })
}

/// A flag of [`ServeArgs`](super::ServeArgs) as clap reads it: `--name=value` or `--name`.
fn kept_flag(flag: &KnownFlag, inline: Option<&str>, rest: &mut Cursor<'_>) -> String {
    // Go takes the next argument as the value whatever it looks like; joined with `=` so clap
    // does too (`--config-text -x`). A boolean takes a separate `true`/`false` too: charts
    // render `--secure-serving false`, and no positional argument exists.
    let value = match inline {
        Some(v) if !flag.takes_value => Some(go_bool(v).unwrap_or(v)),
        Some(v) => Some(v),
        None if flag.takes_value => rest.take(),
        None => rest.take_bool(),
    };
    match value {
        Some(v) => format!("--{}={v}", flag.name),
        None => format!("--{}", flag.name),
    }
}

/// Reads past a flag prefix-picker does not use (and its value) and says why it was dropped.
fn dropped_flag(name: &str, inline: Option<&str>, rest: &mut Cursor<'_>) -> String {
    let gie = GIE_IGNORED.iter().find(|(n, _)| *n == name);
    let value = match (inline, gie) {
        (Some(v), _) => Some(v),
        (None, Some((_, true))) => rest.take_bool(),
        (None, Some((_, false))) => rest.take(),
        // Unknown: a value unless the next argument is a flag (no positional arguments exist).
        (None, None) => rest.take_if(|next| !next.starts_with('-')),
    };
    let shown = match value {
        Some(v) => format!("--{name}={v:?}"),
        None => format!("--{name}"),
    };
    match gie {
        Some(_) => format!("flag {shown} ignored: a GIE flag prefix-picker has no use for"),
        None => format!("flag {shown} ignored: unknown flag"),
    }
}

/// A boolean as Go's `strconv.ParseBool` reads it, spelled the way clap reads it.
fn go_bool(text: &str) -> Option<&'static str> {
    match text {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some("true"),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some("false"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn split_flag_takes_one_or_two_dashes_and_an_inline_value() {
        assert_eq!(split_flag("-v=4"), Some(("v", Some("4"))));
        assert_eq!(split_flag("--pool-name"), Some(("pool-name", None)));
        assert_eq!(split_flag("--a=b=c"), Some(("a", Some("b=c"))));
        assert_eq!(split_flag("-"), None);
        assert_eq!(split_flag("--"), None);
        assert_eq!(split_flag("value"), None);
    }

    #[test]
    fn a_kept_flag_takes_the_next_argument_only_when_it_needs_a_value() {
        let args = strings(&["-x", "false", "more"]);
        let valued = KnownFlag {
            name: "config-text".into(),
            takes_value: true,
        };
        let boolean = KnownFlag {
            name: "secure-serving".into(),
            takes_value: false,
        };
        let mut rest = Cursor {
            args: &args,
            next: 0,
        };
        assert_eq!(kept_flag(&valued, None, &mut rest), "--config-text=-x");
        assert_eq!(
            kept_flag(&boolean, None, &mut rest),
            "--secure-serving=false"
        );
        assert_eq!(kept_flag(&boolean, None, &mut rest), "--secure-serving");
        assert_eq!(rest.next, 2, "`more` is no boolean: left for the next flag");
        assert_eq!(
            kept_flag(&boolean, Some("F"), &mut rest),
            "--secure-serving=false"
        );
    }

    #[test]
    fn a_dropped_flag_takes_a_value_by_its_kind() {
        let args = strings(&["-next", "x"]);
        let mut rest = Cursor {
            args: &args,
            next: 0,
        };
        // Unknown: `-next` looks like a flag, so no value is taken.
        let w = dropped_flag("mystery", None, &mut rest);
        assert_eq!(w, "flag --mystery ignored: unknown flag");
        // A GIE flag with a value takes the next argument whatever it looks like.
        let w = dropped_flag("kubeconfig", None, &mut rest);
        assert_eq!(
            w,
            "flag --kubeconfig=\"-next\" ignored: a GIE flag prefix-picker has no use for"
        );
        // A GIE boolean takes only a boolean.
        let w = dropped_flag("tracing", None, &mut rest);
        assert_eq!(
            w,
            "flag --tracing ignored: a GIE flag prefix-picker has no use for"
        );
        assert_eq!(rest.next, 1);
    }
}
