//! The documentation's relative links resolve: every `[text](target)` in the README,
//! CONTRIBUTING.md, `docs/*.md` and `benches/RESULTS.md` that is not a URL names a file or
//! directory that exists, and its `#anchor`, if any, names a heading of the Markdown file it
//! points at (GitHub's heading slugs). Links inside code blocks and code spans are not links.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Markdown files whose links are checked.
fn documents() -> Vec<PathBuf> {
    let mut files = vec![
        root().join("README.md"),
        root().join("CONTRIBUTING.md"),
        root().join("benches/RESULTS.md"),
    ];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// The lines of `text` outside fenced code blocks, with code spans blanked out.
fn prose_lines(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Blank out `code spans` (a span never crosses a line in these files).
        let mut kept = String::with_capacity(line.len());
        let mut in_code = false;
        for c in line.chars() {
            if c == '`' {
                in_code = !in_code;
                kept.push(' ');
            } else if in_code {
                kept.push(' ');
            } else {
                kept.push(c);
            }
        }
        out.push(kept);
    }
    out
}

/// Link targets of inline links and images: the text between `](` and the matching `)`.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    for line in prose_lines(text) {
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            // `(path "title")`: the target is the first word.
            let target = after[..end].split_whitespace().next().unwrap_or("");
            targets.push(target.to_string());
            rest = &after[end..];
        }
    }
    targets
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's headings (repeated headings get `-1`, `-2`, ...).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        if fenced {
            continue;
        }
        let base = slug(heading.trim_start_matches('#'));
        let mut anchor = base.clone();
        let mut n = 0;
        while seen.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        seen.insert(anchor);
    }
    seen
}

/// Every broken relative link of the Markdown `text` of `file`, as a message.
fn broken_links(file: &Path, text: &str) -> Vec<String> {
    let dir = file.parent().unwrap();
    let mut broken = Vec::new();
    for target in link_targets(text) {
        if target.is_empty()
            || target.contains("://")
            || target.starts_with("mailto:")
            || target.starts_with('<')
        {
            continue;
        }
        let (path, anchor) = match target.split_once('#') {
            Some((p, a)) => (p, Some(a)),
            None => (target.as_str(), None),
        };
        let resolved = if path.is_empty() {
            file.to_path_buf()
        } else {
            dir.join(path)
        };
        if !path.is_empty() && !resolved.exists() {
            broken.push(format!("{}: {target}: no such file", file.display()));
            continue;
        }
        let Some(anchor) = anchor else { continue };
        if resolved.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let target_text = if path.is_empty() {
            text.to_string()
        } else {
            std::fs::read_to_string(&resolved).unwrap()
        };
        if !anchors(&target_text).contains(anchor) {
            broken.push(format!(
                "{}: {target}: no heading with anchor #{anchor} in {}",
                file.display(),
                resolved.display()
            ));
        }
    }
    broken
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in documents() {
        let text = std::fs::read_to_string(&file).unwrap();
        checked += link_targets(&text).len();
        broken.extend(broken_links(&file, &text));
    }
    assert!(
        checked > 50,
        "only {checked} links found: is the parser broken?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_checker_finds_broken_files_and_anchors() {
    let file = root().join("docs/example.md");
    let text = "# Top heading\n\n## Keys (`picker.affinity`)\n\n\
        [ok](../README.md) [ok](#top-heading) [ok](#keys-pickeraffinity) [ok](cli.md#syntax)\n\
        [url](https://example.com/missing.md) `[code](missing.md)`\n\
        ```\n[fenced](missing.md)\n```\n\
        [gone](missing.md) [bad anchor](#nowhere) [bad anchor](cli.md#nowhere)\n";
    let broken = broken_links(&file, text);
    assert_eq!(broken.len(), 3, "{broken:#?}");
    assert!(
        broken[0].contains("missing.md: no such file"),
        "{broken:#?}"
    );
    assert!(broken[1].contains("#nowhere"), "{broken:#?}");
    assert!(broken[2].contains("cli.md#nowhere"), "{broken:#?}");
}

#[test]
fn slugs_follow_github() {
    assert_eq!(slug("Keys (`picker.affinity`)"), "keys-pickeraffinity");
    assert_eq!(
        slug("16-byte reverse slots (2026-12-03, 19:30-19:50 UTC, AMD EPYC guest)"),
        "16-byte-reverse-slots-2026-12-03-1930-1950-utc-amd-epyc-guest"
    );
    assert_eq!(
        slug("Using GIE's chart with the prefix-picker image"),
        "using-gies-chart-with-the-prefix-picker-image"
    );
}
