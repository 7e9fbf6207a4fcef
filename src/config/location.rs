//! Where in a config document an error is: the line and the field, for errors read from a file
//! (`serve --config`, `--config-file`, `--config-text`, `validate`), as
//! `<file>:<line>: <field>: <error>` ([`ConfigErrors::in_file`](super::ConfigErrors::in_file)).
//! Kthena's own messages stay verbatim after that prefix (the golden tests compare them).
//!
//! Two ways to find a place: a section read by serde (`endpoints`, `picker`, `pdGroup`) is read
//! again from the text, whose parser reports the failing field's path and line; the others
//! (Kthena's hand-read `scheduler`, checks after parsing) are found by their key path in the
//! block-style YAML (`key:` lines by indentation), then by a value the error names in that
//! block. A place not found names the section's key and its line, or no line.

use serde::de::{DeserializeOwned, DeserializeSeed, IgnoredAny, MapAccess, Visitor};

/// A field and its line (1-based) in the document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    pub line: Option<usize>,
    pub field: String,
}

/// The line of the key at `path` (block style), or of its deepest ancestor found.
pub fn key_line(text: &str, path: &[&str]) -> Option<usize> {
    let lines: Vec<&str> = text.lines().collect();
    let (mut from, mut to, mut parent_indent) = (0usize, lines.len(), None::<usize>);
    let mut found = None;
    for key in path {
        let mut hit = None;
        for (i, line) in lines.iter().enumerate().take(to).skip(from) {
            let body = line.trim_start_matches([' ', '-']);
            let indent = line.len() - body.len();
            if body.is_empty() || body.starts_with('#') {
                continue;
            }
            if parent_indent.is_some_and(|p| indent <= p) && i > from {
                break;
            }
            let is_key = body
                .strip_prefix(key)
                .is_some_and(|rest| rest.starts_with(':'));
            if is_key {
                hit = Some((i, indent));
                break;
            }
        }
        let Some((i, indent)) = hit else { break };
        found = Some(i + 1);
        // The key's block: the lines after it, until one indented no deeper.
        let end = lines
            .iter()
            .enumerate()
            .skip(i + 1)
            .find(|(_, l)| {
                let b = l.trim_start();
                !b.is_empty()
                    && !b.starts_with('#')
                    && l.len() - b.len() <= indent
                    && !b.starts_with('-')
            })
            .map_or(lines.len(), |(j, _)| j);
        (from, to, parent_indent) = (i, end, Some(indent));
    }
    found
}

/// The first line at or after `start` (1-based) and in `key_line(path)`'s block holding
/// `needle`; else the key's line.
pub fn line_with(text: &str, path: &[&str], needle: &str) -> Option<usize> {
    let start = key_line(text, path)?;
    let lines: Vec<&str> = text.lines().collect();
    let indent = |l: &str| l.len() - l.trim_start_matches([' ', '-']).len();
    let own = indent(lines[start - 1]);
    let hit = lines
        .iter()
        .enumerate()
        .skip(start - 1)
        .take_while(|(i, l)| *i == start - 1 || l.trim().is_empty() || indent(l) > own)
        .find(|(_, l)| l.contains(needle))
        .map(|(i, _)| i + 1);
    Some(hit.unwrap_or(start))
}

/// Reads the top-level `key` of `text` as `T` (every other key skipped); its error's field
/// path (`key.sub[0].field`) and line, when it fails.
pub fn serde_error<T: DeserializeOwned>(text: &str, key: &'static str) -> Option<Location> {
    let de = serde_yaml_ng::Deserializer::from_str(text);
    let err = Only::<T>(key, std::marker::PhantomData)
        .deserialize(de)
        .err()?;
    let line = err.location().map(|l| l.line());
    // serde_yaml_ng's message: "<path>: <what> at line L column C".
    let message = err.to_string();
    let mut field = message
        .split_once(": ")
        .map(|(path, _)| path)
        .filter(|p| p.starts_with(key) && !p.contains(' '))
        .unwrap_or(key)
        .to_string();
    // An unknown or missing field is named by the message, not by the path.
    let named = ["unknown field `", "missing field `"].iter().find_map(|m| {
        message
            .split_once(m)
            .and_then(|(_, rest)| rest.split_once('`'))
            .map(|(name, _)| name)
    });
    if let Some(name) = named {
        field = format!("{field}.{name}");
    }
    Some(Location { line, field })
}

/// A seed that reads one top-level key as `T`.
struct Only<T>(&'static str, std::marker::PhantomData<T>);

impl<'de, T: DeserializeOwned> DeserializeSeed<'de> for Only<T> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, T: DeserializeOwned> Visitor<'de> for Only<T> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a mapping with {}", self.0)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(k) = map.next_key::<String>()? {
            if k == self.0 {
                map.next_value::<T>()?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "\
scheduler:
  plugins:
    Score:
      enabled:
      - name: least-request
        weight: 1
      - name: prefix-cache
        weight: 0
picker:
  seed: 7
";

    #[test]
    fn keys_are_found_by_their_path_in_block_style() {
        assert_eq!(key_line(DOC, &["scheduler"]), Some(1));
        assert_eq!(
            key_line(DOC, &["scheduler", "plugins", "Score", "enabled"]),
            Some(4)
        );
        assert_eq!(key_line(DOC, &["picker", "seed"]), Some(10));
        // Not there: the deepest ancestor found.
        assert_eq!(key_line(DOC, &["picker", "affinity"]), Some(9));
        assert_eq!(key_line(DOC, &["sync"]), None);
        assert_eq!(
            line_with(
                DOC,
                &["scheduler", "plugins", "Score", "enabled"],
                "prefix-cache"
            ),
            Some(7)
        );
        // `seed` is not under `scheduler`.
        assert_eq!(key_line(DOC, &["scheduler", "seed"]), Some(1));
    }

    #[test]
    fn a_serde_section_names_the_failing_field_and_its_line() {
        #[derive(Debug, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Picker {
            seed: u64,
        }
        let doc = "endpoints: []\npicker:\n  seed: 7\n  sede: 8\n";
        let at = serde_error::<Picker>(doc, "picker").unwrap();
        assert_eq!(at.line, Some(4));
        assert_eq!(at.field, "picker.sede");
        let bad = "picker:\n  seed: many\n";
        let at = serde_error::<Picker>(bad, "picker").unwrap();
        assert_eq!((at.line, at.field.as_str()), (Some(2), "picker.seed"));
        assert_eq!(serde_error::<Picker>("picker: {seed: 1}\n", "picker"), None);
    }
}
