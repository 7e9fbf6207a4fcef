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

// ---------------------------------------------------------------- the README's headline

/// The text of `markdown` from the heading line `heading` to the next heading of its level.
fn section<'a>(markdown: &'a str, heading: &str) -> Option<&'a str> {
    let start = markdown.find(&format!("\n{heading}\n"))? + 1;
    let level = heading.split(' ').next().unwrap();
    let body = &markdown[start + heading.len()..];
    let end = body
        .find(&format!("\n{level} "))
        .map_or(markdown.len(), |i| start + heading.len() + i + 1);
    Some(&markdown[start..end])
}

/// The numbers written in `text` (`79.7`, `40`, `1.64`), in order; digits inside a word (`p99`)
/// or a commit hash are not numbers.
fn numbers(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i].is_ascii_digit() && (i == 0 || !bytes[i - 1].is_ascii_alphanumeric()) {
            let start = i;
            while i < bytes.len()
                && (bytes[i].is_ascii_digit()
                    || (bytes[i] == b'.' && bytes.get(i + 1).is_some_and(u8::is_ascii_digit)))
            {
                i += 1;
            }
            // A factor (`1.64x`) is a number; the head of a word or a hash (`15dcf98`) is not.
            let factor = bytes.get(i) == Some(&b'x')
                && !bytes.get(i + 1).is_some_and(u8::is_ascii_alphanumeric);
            if factor || !bytes.get(i).is_some_and(u8::is_ascii_alphabetic) {
                out.push(&text[start..i]);
            }
        }
        i += 1;
    }
    out
}

/// Every way the README's headline fails to be one dated run of docs/benchmarks.md: its text
/// must name the run's date and commit as `(YYYY-MM-DD, commit HASH`, link to the section
/// `## Results (YYYY-MM-DD, commit HASH)` of the benchmarks page, and every number of its
/// table's result columns (all but the workload) must be written in that section.
fn headline_problems(readme: &str, benchmarks: &str) -> Vec<String> {
    let Some(headline) = section(readme, "## Headline result") else {
        return vec!["README.md: no `## Headline result` section".into()];
    };
    let (prose, table) = headline.split_at(headline.find("\n|").unwrap_or(headline.len()));
    let runs: Vec<(&str, &str)> = prose
        .match_indices(", commit ")
        .filter_map(|(at, sep)| {
            let date = prose.get(at.checked_sub(10)?..at)?;
            let hash = prose[at + sep.len()..]
                .split(|c: char| !c.is_ascii_hexdigit())
                .next()?;
            let is_date = date.len() == 10
                && date.bytes().enumerate().all(|(i, b)| {
                    if i == 4 || i == 7 {
                        b == b'-'
                    } else {
                        b.is_ascii_digit()
                    }
                });
            (is_date && hash.len() >= 7).then_some((date, hash))
        })
        .collect();
    let [(date, commit)] = runs.as_slice() else {
        return vec![format!(
            "README.md: the headline must name one run as `(YYYY-MM-DD, commit HASH`, found {runs:?}"
        )];
    };
    let heading = format!("## Results ({date}, commit {commit})");
    let Some(run) = section(benchmarks, &heading) else {
        return vec![format!(
            "README.md: the headline's run {date}, commit {commit}: no `{heading}` in docs/benchmarks.md"
        )];
    };
    let mut problems = Vec::new();
    let link = format!(
        "docs/benchmarks.md#{}",
        slug(heading.trim_start_matches('#'))
    );
    if !prose.contains(&link) {
        problems.push(format!("README.md: the headline does not link to {link}"));
    }
    let rows: Vec<&str> = table
        .lines()
        .filter(|l| l.starts_with('|'))
        .skip(2) // the header and the separator
        .collect();
    if rows.is_empty() {
        problems.push("README.md: the headline has no table".into());
    }
    let run_numbers: BTreeSet<&str> = numbers(run).into_iter().collect();
    for row in rows {
        let cells: Vec<&str> = row.split('|').collect();
        for cell in cells.iter().skip(2) {
            for n in numbers(cell) {
                if !run_numbers.contains(n) {
                    problems.push(format!(
                        "README.md: headline `{n}` ({}) is not in docs/benchmarks.md's `{heading}`",
                        cell.trim()
                    ));
                }
            }
        }
    }
    problems
}

#[test]
fn the_readme_headline_is_one_dated_run_of_the_benchmarks_page() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let benchmarks = std::fs::read_to_string(root().join("docs/benchmarks.md")).unwrap();
    let problems = headline_problems(&readme, &benchmarks);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_headline_checker_finds_numbers_of_another_run() {
    let benchmarks = "# B\n\n## Results (2026-01-02, commit abc1234)\n\n\
        | w | hit |\n|---|---|\n| a | 79.7%, 9 / 40 (1.64) |\n\n## Later (2026-01-03)\n\n| a | 81.0% |\n";
    let readme = |text: &str| {
        format!(
            "# R\n\n## Headline result\n\nA run (2026-01-02, commit abc1234: \
             [x](docs/benchmarks.md#results-2026-01-02-commit-abc1234)):\n\n\
             | workload p99 | hit |\n|---|---|\n| multi-tenant, 16 tenants | {text} |\n\n## Next\n"
        )
    };
    assert_eq!(
        headline_problems(&readme("79.7%, 40 ms (1.64x)"), benchmarks),
        Vec::<String>::new()
    );
    let problems = headline_problems(&readme("81.0%, 40 ms"), benchmarks);
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert!(problems[0].contains("`81.0`"), "{problems:#?}");
    let other =
        readme("79.7%").replace("2026-01-02, commit abc1234:", "2026-01-03, commit def5678:");
    let problems = headline_problems(&other, benchmarks);
    assert!(
        problems[0].contains("no `## Results (2026-01-03, commit def5678)`"),
        "{problems:#?}"
    );
    let unlinked = readme("79.7%").replace("results-2026-01-02", "results-2026-01-01");
    let problems = headline_problems(&unlinked, benchmarks);
    assert!(problems[0].contains("does not link"), "{problems:#?}");
    assert_eq!(
        numbers("p99 79.7%, 9 / 40 (1.64x) c71d738 15dcf98"),
        ["79.7", "9", "40", "1.64"]
    );
}

/// docs/benchmarks.md keeps the method and a summary; history goes to benches/RESULTS.md.
#[test]
fn the_benchmarks_page_stays_under_15_kib() {
    let len = std::fs::metadata(root().join("docs/benchmarks.md"))
        .unwrap()
        .len();
    assert!(
        len <= 15 * 1024,
        "docs/benchmarks.md is {len} bytes: move history to benches/RESULTS.md (CONTRIBUTING.md)"
    );
}
