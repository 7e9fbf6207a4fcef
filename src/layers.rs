//! The layer test: `src/` read as a graph of files, checked against the layer table in `lib.rs`.
//!
//! Each `.rs` file is a node (a module's submodule files are nodes of their own); an edge is a
//! path in the code that names another file's module: `crate::`, `super::`, `self::`, a child
//! module's name, a module brought in by `use`, and `prefix_picker::` in `main.rs`. A path is
//! resolved to the deepest file module it names (`crate::routing::Router` is `routing/mod.rs`,
//! `crate::routing::completion::Ending` is `routing/completion.rs`). Test code is not part of the
//! graph: modules and items under `#[cfg(test)]` (`cfg(all(test, ..))` too) and `tests.rs` files,
//! since tests may reach across layers. Two checks: no circle among the files, and no edge from a
//! module to a layer its row in the table does not list.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::path::{Path, PathBuf};

mod lex;

use lex::{Tok, lex};

/// One source file: its module path and its tokens with test code removed.
struct File {
    rel: String,
    module: Vec<String>,
    toks: Vec<Tok>,
    /// Declared child modules (not under `cfg(test)`).
    children: Vec<String>,
}

/// Whether the attribute tokens (between `#[` and `]`) are a `cfg` that holds only under test.
fn is_test_cfg(attr: &[Tok]) -> bool {
    let ident = |t: &Tok, s: &str| matches!(t, Tok::Ident(w) if w == s);
    attr.first().is_some_and(|t| ident(t, "cfg"))
        && attr.iter().any(|t| ident(t, "test"))
        && !attr.iter().any(|t| ident(t, "not") || ident(t, "any"))
}

/// The index of the token that ends the item starting at `i`: a `;` or `,` at depth 0, the `}`
/// of its first block, or the `}` closing the enclosing block.
fn item_end(toks: &[Tok], mut i: usize) -> usize {
    let mut depth = 0i32;
    while i < toks.len() {
        match toks[i] {
            Tok::Punct('(' | '[') => depth += 1,
            Tok::Punct(')' | ']') => depth -= 1,
            Tok::Punct('{') => {
                if depth == 0 {
                    return matching_brace(toks, i);
                }
                depth += 1;
            }
            Tok::Punct('}') => {
                if depth == 0 {
                    return i - 1;
                }
                depth -= 1;
            }
            Tok::Punct(';' | ',') if depth == 0 => return i,
            _ => {}
        }
        i += 1;
    }
    i
}

fn matching_brace(toks: &[Tok], open: usize) -> usize {
    let mut depth = 0;
    for (k, t) in toks.iter().enumerate().skip(open) {
        match t {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                depth -= 1;
                if depth == 0 {
                    return k;
                }
            }
            _ => {}
        }
    }
    toks.len()
}

/// Drops attributes and everything under a test-only `cfg`; collects non-test `mod x;` names.
fn strip_tests(toks: Vec<Tok>) -> (Vec<Tok>, Vec<String>) {
    let mut out = Vec::new();
    let mut children = Vec::new();
    let mut i = 0;
    let mut test_item = false;
    while i < toks.len() {
        let is_attr = toks[i] == Tok::Punct('#')
            && (toks.get(i + 1) == Some(&Tok::Punct('['))
                || (toks.get(i + 1) == Some(&Tok::Punct('!'))
                    && toks.get(i + 2) == Some(&Tok::Punct('['))));
        if is_attr {
            let open = if toks[i + 1] == Tok::Punct('!') {
                i + 2
            } else {
                i + 1
            };
            let mut depth = 0;
            let mut close = open;
            for (k, t) in toks.iter().enumerate().skip(open) {
                match t {
                    Tok::Punct('[') => depth += 1,
                    Tok::Punct(']') => {
                        depth -= 1;
                        if depth == 0 {
                            close = k;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            test_item |= is_test_cfg(&toks[open + 1..close]);
            i = close + 1;
            continue;
        }
        if test_item {
            i = item_end(&toks, i) + 1;
            test_item = false;
            continue;
        }
        if toks[i] == Tok::Ident("mod".into())
            && let (Some(Tok::Ident(name)), Some(Tok::Punct(';'))) =
                (toks.get(i + 1), toks.get(i + 2))
        {
            children.push(name.clone());
        }
        out.push(toks[i].clone());
        i += 1;
    }
    (out, children)
}

/// Every non-test file of `src/`, from the crate roots down through `mod` declarations.
fn load(src: &Path) -> Vec<File> {
    let mut files = Vec::new();
    let mut queue: VecDeque<(PathBuf, Vec<String>)> = VecDeque::new();
    queue.push_back((src.join("lib.rs"), vec![]));
    queue.push_back((src.join("main.rs"), vec!["main".to_string()]));
    while let Some((path, module)) = queue.pop_front() {
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let (toks, children) = strip_tests(lex(&text));
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        // `lib.rs`, `main.rs` and `mod.rs` own the directory they sit in; `foo.rs` owns `foo/`.
        let owns_dir = if matches!(name.as_str(), "lib.rs" | "main.rs" | "mod.rs") {
            path.parent().unwrap().to_path_buf()
        } else {
            path.with_extension("")
        };
        for child in &children {
            if child == "tests" {
                continue;
            }
            let flat = owns_dir.join(format!("{child}.rs"));
            let nested = owns_dir.join(child).join("mod.rs");
            let file = if flat.exists() { flat } else { nested };
            let mut m = module.clone();
            m.push(child.clone());
            queue.push_back((file, m));
        }
        let rel = path
            .strip_prefix(src)
            .unwrap()
            .to_str()
            .unwrap()
            .to_string();
        files.push(File {
            rel,
            module,
            toks,
            children,
        });
    }
    files
}

/// The graph: for each file, the files it names (self-edges dropped).
fn graph(files: &[File]) -> BTreeMap<String, BTreeSet<String>> {
    // Module path -> file. `main.rs` is a crate of its own whose `prefix_picker::` is the root.
    let by_module: HashMap<&[String], &File> =
        files.iter().map(|f| (f.module.as_slice(), f)).collect();
    let mut edges = BTreeMap::new();
    for f in files {
        let mut reader = Reader {
            f,
            by_module: &by_module,
            in_main: f.module.first().is_some_and(|m| m == "main"),
            aliases: HashMap::new(),
            deps: BTreeSet::new(),
        };
        let mut i = 0;
        while i < f.toks.len() {
            i = reader.step(i);
        }
        let mut deps = reader.deps;
        deps.remove(&f.rel);
        edges.insert(f.rel.clone(), deps);
    }
    edges
}

/// One file's paths read into the files they name.
struct Reader<'a> {
    f: &'a File,
    by_module: &'a HashMap<&'a [String], &'a File>,
    in_main: bool,
    /// Local names bound by `use` to a module path.
    aliases: HashMap<String, Vec<String>>,
    deps: BTreeSet<String>,
}

impl<'a> Reader<'a> {
    /// Reads the path or `use` item at token `i`, if one starts there; returns where to go on.
    fn step(&mut self, i: usize) -> usize {
        let toks = &self.f.toks;
        let prev_joins = i > 0 && matches!(toks[i - 1], Tok::PathSep | Tok::Punct('$' | '.'));
        if toks[i] == Tok::Ident("use".into()) {
            return self.use_item(i);
        }
        if let Tok::Ident(seg) = &toks[i]
            && !prev_joins
            && toks.get(i + 1) == Some(&Tok::PathSep)
            && let Some(full) = self.resolve_start(seg)
        {
            return self.path(i + 2, full);
        }
        i + 1
    }

    /// The module a path's first segment names: the crate root, this module, its parent, a
    /// child, or a `use` alias.
    fn resolve_start(&self, seg: &str) -> Option<Vec<String>> {
        let module = &self.f.module;
        match seg {
            "crate" if !self.in_main => Some(vec![]),
            "prefix_picker" if self.in_main => Some(vec![]),
            "self" => Some(module.clone()),
            "super" => Some(module[..module.len().saturating_sub(1)].to_vec()),
            _ if self.f.children.iter().any(|c| c == seg) => {
                let mut m = module.clone();
                m.push(seg.to_string());
                Some(m)
            }
            _ => self.aliases.get(seg).cloned(),
        }
    }

    /// The deepest file module along `path`.
    fn file_of(&self, path: &[String]) -> Option<&'a File> {
        (0..=path.len())
            .rev()
            .find_map(|n| self.by_module.get(&path[..n]).copied())
    }

    /// Records an edge to the file of `path`; a submodule using its own ancestors (`super::`)
    /// is part of their implementation, no edge.
    fn name(&mut self, path: &[String]) {
        let Some(target) = self.file_of(path) else {
            return;
        };
        let ancestor = !self.in_main && self.f.module.starts_with(&target.module);
        if !ancestor {
            self.deps.insert(target.rel.clone());
        }
    }

    /// A `use` item at `i`: an edge per leaf, and its bound name when it is a module.
    fn use_item(&mut self, i: usize) -> usize {
        let mut leaves = Vec::new();
        let end = use_tree(&self.f.toks, i + 1, &mut vec![], &mut leaves);
        for (path, alias) in leaves {
            let Some(first) = path.first() else { continue };
            let Some(mut full) = self.resolve_start(first) else {
                continue;
            };
            for seg in &path[1..] {
                if seg == "super" {
                    full.pop();
                } else if seg != "self" {
                    full.push(seg.clone());
                }
            }
            self.name(&full);
            if self.by_module.contains_key(full.as_slice())
                && let Some(alias) = alias
            {
                self.aliases.insert(alias, full);
            }
        }
        end
    }

    /// A path's segments from token `k` on, after the first (resolved to `full`).
    fn path(&mut self, mut k: usize, mut full: Vec<String>) -> usize {
        let toks = &self.f.toks;
        while let Some(Tok::Ident(next)) = toks.get(k) {
            if next == "super" {
                full.pop();
            } else if next != "self" {
                full.push(next.clone());
            }
            if toks.get(k + 1) != Some(&Tok::PathSep) {
                break;
            }
            k += 2;
        }
        self.name(&full);
        k + 1
    }
}

/// Parses the use tree at `i` (after `use`, or inside braces); pushes (path, bound name) per
/// leaf; returns the index after it.
fn use_tree(
    toks: &[Tok],
    mut i: usize,
    prefix: &mut Vec<String>,
    leaves: &mut Vec<(Vec<String>, Option<String>)>,
) -> usize {
    let depth = prefix.len();
    if toks.get(i) == Some(&Tok::PathSep) {
        i += 1;
    }
    loop {
        match toks.get(i) {
            Some(Tok::Ident(seg)) => {
                prefix.push(seg.clone());
                i += 1;
                if toks.get(i) == Some(&Tok::PathSep) {
                    i += 1;
                    continue;
                }
                let mut bound = if seg == "self" {
                    prefix.get(prefix.len().wrapping_sub(2)).cloned()
                } else {
                    Some(seg.clone())
                };
                if toks.get(i) == Some(&Tok::Ident("as".into())) {
                    bound = match toks.get(i + 1) {
                        Some(Tok::Ident(a)) if a != "_" => Some(a.clone()),
                        _ => None,
                    };
                    i += 2;
                }
                leaves.push((prefix.clone(), bound));
                break;
            }
            Some(Tok::Punct('*')) => {
                leaves.push((prefix.clone(), None));
                i += 1;
                break;
            }
            Some(Tok::Punct('{')) => {
                i += 1;
                while toks.get(i).is_some_and(|t| *t != Tok::Punct('}')) {
                    i = use_tree(toks, i, prefix, leaves);
                    if toks.get(i) == Some(&Tok::Punct(',')) {
                        i += 1;
                    }
                }
                i += 1;
                break;
            }
            _ => break,
        }
    }
    prefix.truncate(depth);
    i
}

/// The shortest circle through `start` inside `scc`, as `a -> b -> a`.
fn circle(
    edges: &BTreeMap<String, BTreeSet<String>>,
    scc: &BTreeSet<String>,
    start: &str,
) -> String {
    let mut prev: HashMap<&str, &str> = HashMap::new();
    let mut queue = VecDeque::from([start]);
    while let Some(n) = queue.pop_front() {
        for m in &edges[n] {
            if !scc.contains(m) {
                continue;
            }
            if m == start {
                let mut path = vec![n.to_string()];
                let mut at = n;
                while at != start {
                    at = prev[at];
                    path.push(at.to_string());
                }
                path.reverse();
                path.push(start.to_string());
                return path.join(" -> ");
            }
            if !prev.contains_key(m.as_str()) && m != start {
                prev.insert(m, n);
                queue.push_back(m);
            }
        }
    }
    unreachable!("{start} is in a strongly connected component")
}

/// The strongly connected components with more than one file (Tarjan).
fn knots(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    struct Tarjan<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: HashMap<&'a str, usize>,
        low: HashMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<BTreeSet<String>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in &self.edges[v] {
                if !self.index.contains_key(w.as_str()) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w.as_str()]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w.as_str()) {
                    let low = self.low[v].min(self.index[w.as_str()]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut scc = BTreeSet::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    scc.insert(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if scc.len() > 1 {
                    self.out.push(scc);
                }
            }
        }
    }
    let mut t = Tarjan {
        edges,
        index: HashMap::new(),
        low: HashMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.visit(v);
        }
    }
    t.out
}

/// A row of `lib.rs`'s layer table.
struct Layer {
    name: String,
    modules: Vec<String>,
    may_import: Vec<String>,
}

/// The layer table in `lib.rs`'s header: `//! | layer | modules | may import |` rows, the modules
/// and the imported layers as lists of words (backticks and brackets ignored).
fn layer_table(lib_rs: &str) -> Vec<Layer> {
    let words = |cell: &str| -> Vec<String> {
        cell.split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .filter(|w| !w.is_empty())
            .map(str::to_string)
            .collect()
    };
    lib_rs
        .lines()
        .filter_map(|line| line.strip_prefix("//! |"))
        .map(|row| row.split('|').map(str::trim).collect::<Vec<_>>())
        .filter(|cells| cells.len() >= 3 && cells[0] != "layer" && !cells[0].starts_with('-'))
        .map(|cells| Layer {
            name: cells[0].to_string(),
            modules: words(cells[1]),
            may_import: words(cells[2]),
        })
        .collect()
}

/// The top-level module a file belongs to (`main` for the binary); `None` for `lib.rs`.
fn top_module(file: &str) -> Option<&str> {
    if file == "lib.rs" {
        return None;
    }
    let first = file.split('/').next().unwrap();
    Some(first.strip_suffix(".rs").unwrap_or(first))
}

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn every_import_goes_to_a_layer_its_row_lists() {
    let src = src_dir();
    let table = layer_table(&std::fs::read_to_string(src.join("lib.rs")).unwrap());
    assert!(
        table.len() > 3,
        "no layer table found in src/lib.rs's header"
    );
    let mut layer_of: HashMap<&str, &Layer> = HashMap::new();
    let mut errors = Vec::new();
    for layer in &table {
        for m in &layer.modules {
            if layer_of.insert(m, layer).is_some() {
                errors.push(format!("`{m}` is in two layers of lib.rs's table"));
            }
        }
        for l in &layer.may_import {
            if !table.iter().any(|t| t.name == *l) {
                errors.push(format!(
                    "layer `{}` may import `{l}`, which is no layer",
                    layer.name
                ));
            }
        }
    }
    let files = load(&src);
    for m in layer_of.keys() {
        if !files.iter().any(|f| top_module(&f.rel) == Some(m)) {
            errors.push(format!("`{m}` is in lib.rs's table but no file of src/"));
        }
    }
    for (file, deps) in graph(&files) {
        let Some(from) = top_module(&file) else {
            continue;
        };
        let Some(layer) = layer_of.get(from) else {
            errors.push(format!(
                "{file}: module `{from}` is in no layer of lib.rs's table"
            ));
            continue;
        };
        for dep in deps {
            let Some(to) = top_module(&dep) else { continue };
            let Some(target) = layer_of.get(to) else {
                continue;
            };
            if from != to && !layer.may_import.contains(&target.name) {
                errors.push(format!(
                    "{file} ({}) imports {dep} ({}): not a layer it may import",
                    layer.name, target.name
                ));
            }
        }
    }
    assert!(
        errors.is_empty(),
        "src/ against lib.rs's layer table:\n{}",
        errors.join("\n")
    );
}
#[test]
fn no_circle_among_source_files() {
    let files = load(&src_dir());
    let edges = graph(&files);
    let knots = knots(&edges);
    let report: Vec<String> = knots
        .iter()
        .map(|scc| {
            let first = scc.iter().next().unwrap();
            format!(
                "{} files: {}\n  e.g. {}",
                scc.len(),
                scc.iter().cloned().collect::<Vec<_>>().join(", "),
                circle(&edges, scc, first)
            )
        })
        .collect();
    assert!(
        report.is_empty(),
        "import circles among src/ files:\n{}",
        report.join("\n")
    );
}

#[test]
fn a_planted_circle_is_named() {
    let edges: BTreeMap<String, BTreeSet<String>> =
        [("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")]
            .into_iter()
            .fold(BTreeMap::new(), |mut m, (from, to)| {
                m.entry(from.to_string())
                    .or_default()
                    .insert(to.to_string());
                m.entry(to.to_string()).or_default();
                m
            });
    let knots = knots(&edges);
    assert_eq!(knots.len(), 1);
    assert_eq!(circle(&edges, &knots[0], "a"), "a -> b -> c -> a");
}

#[test]
fn use_trees_strings_and_test_items_are_read_as_rust_reads_them() {
    let src = r##"
        use crate::{a::{self, B}, c::d as e, f::*};
        const S: &str = "crate::g::H"; let r = r#"crate::i"#; // crate::j
        #[cfg(test)]
        fn t() { crate::k::L; }
        #[cfg(all(test, feature = "x"))]
        mod tests;
        mod m;
    "##;
    let (toks, children) = strip_tests(lex(src));
    assert_eq!(children, ["m"]);
    let mut leaves = Vec::new();
    use_tree(&toks, 1, &mut vec![], &mut leaves);
    let leaves: Vec<String> = leaves
        .iter()
        .map(|(p, b)| format!("{}={b:?}", p.join("::")))
        .collect();
    assert_eq!(
        leaves,
        [
            "crate::a::self=Some(\"a\")",
            "crate::a::B=Some(\"B\")",
            "crate::c::d=Some(\"e\")",
            "crate::f=None"
        ]
    );
    let idents: Vec<&Tok> = toks
        .iter()
        .filter(|t| matches!(t, Tok::Ident(w) if w.len() == 1))
        .collect();
    let named: String = idents
        .iter()
        .map(|t| match t {
            Tok::Ident(w) => w.as_str(),
            _ => "",
        })
        .collect();
    assert_eq!(
        named, "aBcdefSrm",
        "strings, comments and test items are not read"
    );
}
