//! The layering rule of `lib.rs`, checked on the source: a module may import only the modules
//! before it in [`crate::LAYERS`]; only test code may use the test kit, and the test kit may use
//! every stage but not the commands.
//!
//! A small lexer (comments, strings and char literals skipped) finds every `crate::` and
//! `super::` path, resolves `super` against the file's module path and its inline `mod`s, and
//! takes the first segment (or, for `crate::{a::X, b}`, each first-level segment) as the
//! module used. Code under `#[cfg(test)]` (an item, an inline module, or a file declared
//! `#[cfg(test)] mod x;`) is test code.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

use crate::LAYERS;

const TESTKIT: &str = "testkit";

/// Test code that may use a later stage, with the reason. Production code has no exceptions.
const TEST_EXCEPTIONS: &[(&str, &str, &str)] = &[(
    "correlate",
    "decide",
    "the decision-matrix rows check what the decider makes of the engine's figures",
)];

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    /// `::`
    Path,
    Punct(char),
}

/// Tokens with their 1-based line; comments, string, byte-string, raw-string and char literals
/// are dropped (a path mentioned in a doc comment or a message is not an import).
fn lex(src: &str) -> Vec<(Tok, usize)> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    let count_lines = |from: usize, to: usize| {
        b[from..to.min(b.len())]
            .iter()
            .filter(|&&c| c == b'\n')
            .count()
    };
    while i < b.len() {
        let c = b[i];
        match c {
            b'\n' => {
                line += 1;
                i += 1;
            }
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let (start, mut depth) = (i, 0);
                while i < b.len() {
                    if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                        depth += 1;
                        i += 2;
                    } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        i += 1;
                    }
                }
                line += count_lines(start, i);
            }
            b'r' | b'b' if raw_string_start(b, i).is_some() => {
                let (hashes, open) = raw_string_start(b, i).unwrap();
                let close: Vec<u8> = std::iter::once(b'"')
                    .chain(std::iter::repeat_n(b'#', hashes))
                    .collect();
                let start = i;
                i = open + 1;
                while i < b.len() && !b[i..].starts_with(&close) {
                    i += 1;
                }
                i += close.len();
                line += count_lines(start, i);
            }
            b'"' => {
                let start = i;
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
                line += count_lines(start, i);
            }
            b'\'' => {
                // A char literal ('x', '\n', '\u{1F600}', 'é') or a lifetime ('a).
                if b.get(i + 1) == Some(&b'\\') {
                    i += 2;
                    while i < b.len() && b[i] != b'\'' {
                        i += 1;
                    }
                    i += 1;
                } else {
                    let ch_len = src[i + 1..].chars().next().map_or(1, char::len_utf8);
                    if b.get(i + 1 + ch_len) == Some(&b'\'') {
                        i += 2 + ch_len;
                    } else {
                        i += 1; // lifetime: its name lexes as an identifier
                    }
                }
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let start = i;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                    i += 1;
                }
                out.push((Tok::Ident(src[start..i].to_string()), line));
            }
            b':' if b.get(i + 1) == Some(&b':') => {
                out.push((Tok::Path, line));
                i += 2;
            }
            c if c.is_ascii_whitespace() || c.is_ascii_digit() => i += 1,
            c if c.is_ascii() => {
                out.push((Tok::Punct(c as char), line));
                i += 1;
            }
            _ => i += 1,
        }
    }
    out
}

/// `r"`, `r#"`, `br"`, `br#"` at `i`: the number of `#`s and the index of the opening quote.
fn raw_string_start(b: &[u8], i: usize) -> Option<(usize, usize)> {
    if i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_') {
        return None; // inside an identifier
    }
    let mut j = i;
    if b[j] == b'b' {
        j += 1;
    }
    if b.get(j) != Some(&b'r') {
        return None;
    }
    j += 1;
    let hashes = b[j..].iter().take_while(|&&c| c == b'#').count();
    (b.get(j + hashes) == Some(&b'"')).then_some((hashes, j + hashes))
}

fn ident(t: Option<&(Tok, usize)>) -> Option<&str> {
    match t {
        Some((Tok::Ident(s), _)) => Some(s),
        _ => None,
    }
}

fn is(t: Option<&(Tok, usize)>, p: char) -> bool {
    matches!(t, Some((Tok::Punct(c), _)) if *c == p)
}

fn is_path(t: Option<&(Tok, usize)>) -> bool {
    matches!(t, Some((Tok::Path, _)))
}

/// One module named by a path in a file.
#[derive(Debug)]
struct Use {
    line: usize,
    module: String,
    in_test: bool,
}

/// What one file says: the top-level modules its paths reach (outside its own top module) and
/// the child modules it declares `#[cfg(test)] mod x;` (as module paths).
#[derive(Debug, Default)]
struct Scan {
    uses: Vec<Use>,
    test_mods: Vec<Vec<String>>,
}

/// Scan one file whose module path is `module` (e.g. `["recorder", "format"]`).
fn scan(module: &[String], src: &str) -> Scan {
    let toks = lex(src);
    let mut scan = Scan::default();
    let mut depth = 0usize;
    // Inline `mod x {`: name, brace depth inside it, whether it is test code.
    let mut inline: Vec<(String, usize)> = Vec::new();
    // A `#[cfg(test)]` item: the depth it sits at and whether its body's brace was opened.
    let mut test_item: Option<(usize, bool)> = None;
    let mut i = 0;
    while i < toks.len() {
        let t = &toks[i];
        match &t.0 {
            Tok::Punct('#')
                if is(toks.get(i + 1), '[') && ident(toks.get(i + 2)) == Some("cfg") =>
            {
                let test_only = is(toks.get(i + 3), '(')
                    && ident(toks.get(i + 4)) == Some("test")
                    && is(toks.get(i + 5), ')');
                if test_only && test_item.is_none() {
                    test_item = Some((depth, false));
                }
            }
            Tok::Punct('{') => {
                if let Some((d, opened @ false)) = &mut test_item
                    && *d == depth
                {
                    *opened = true;
                }
                depth += 1;
            }
            Tok::Punct('}') => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|(_, d)| *d == depth + 1) {
                    inline.pop();
                }
                if matches!(test_item, Some((d, true)) if d == depth) {
                    test_item = None;
                }
            }
            Tok::Punct(';') => {
                if matches!(test_item, Some((d, false)) if d == depth) {
                    test_item = None;
                }
            }
            Tok::Ident(kw) if kw == "mod" => {
                if let Some(name) = ident(toks.get(i + 1)) {
                    let mut path: Vec<String> = module.to_vec();
                    path.extend(inline.iter().map(|(n, _)| n.clone()));
                    path.push(name.to_string());
                    if is(toks.get(i + 2), '{') {
                        inline.push((name.to_string(), depth + 1));
                    } else if is(toks.get(i + 2), ';') && test_item.is_some() {
                        scan.test_mods.push(path);
                    }
                }
            }
            Tok::Ident(root)
                if (root == "crate" || root == "super") && is_path(toks.get(i + 1)) =>
            {
                let in_test = test_item.is_some();
                let mut here: Vec<String> = module.to_vec();
                here.extend(inline.iter().map(|(n, _)| n.clone()));
                let mut j = i;
                if root == "crate" {
                    here.clear();
                    j += 2;
                } else {
                    while ident(toks.get(j)) == Some("super") && is_path(toks.get(j + 1)) {
                        here.pop();
                        j += 2;
                    }
                }
                if here.is_empty() {
                    // At the crate root: the next segment, or each first-level one of a group.
                    if let Some(m) = ident(toks.get(j)) {
                        scan.uses.push(Use {
                            line: t.1,
                            module: m.to_string(),
                            in_test,
                        });
                    } else if is(toks.get(j), '{') {
                        let mut level = 0;
                        let mut k = j;
                        while k < toks.len() {
                            match &toks[k].0 {
                                Tok::Punct('{') => level += 1,
                                Tok::Punct('}') => {
                                    level -= 1;
                                    if level == 0 {
                                        break;
                                    }
                                }
                                Tok::Ident(m)
                                    if level == 1
                                        && (is(toks.get(k - 1), '{')
                                            || is(toks.get(k - 1), ',')) =>
                                {
                                    scan.uses.push(Use {
                                        line: toks[k].1,
                                        module: m.clone(),
                                        in_test,
                                    });
                                }
                                _ => {}
                            }
                            k += 1;
                        }
                    }
                }
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    scan
}

/// Module path of a file under `src/` (`a/b.rs` → a::b, `a/mod.rs` → a); None for the roots.
fn module_of(rel: &Path) -> Option<Vec<String>> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop()?;
    let stem = last.strip_suffix(".rs")?;
    if parts.is_empty() && matches!(stem, "lib" | "main" | "tests") {
        return None;
    }
    if stem != "mod" {
        parts.push(stem.to_string());
    }
    Some(parts)
}

/// Every breach of the rule in `files` (path under `src/`, contents), as readable lines.
fn violations(files: &[(PathBuf, String)]) -> Vec<String> {
    let scanned: Vec<(PathBuf, Vec<String>, Scan)> = files
        .iter()
        .filter_map(|(p, src)| module_of(p).map(|m| (p.clone(), m.clone(), scan(&m, src))))
        .collect();
    let test_mods: BTreeSet<Vec<String>> = scanned
        .iter()
        .flat_map(|(_, _, s)| s.test_mods.iter().cloned())
        .collect();
    let layer = |m: &str| LAYERS.iter().position(|l| *l == m);
    let mut out = Vec::new();
    for (path, module, scan) in &scanned {
        let Some(own) = module.first() else { continue };
        let test_file = (1..=module.len()).any(|n| test_mods.contains(&module[..n]));
        for u in &scan.uses {
            let in_test = test_file || u.in_test;
            let used = u.module.as_str();
            if used == own {
                continue;
            }
            let why = if used == TESTKIT {
                (!in_test).then_some("only test code may use the test kit")
            } else if own == TESTKIT {
                (used == "cmd").then_some("the test kit may not use the commands")
            } else {
                match (layer(own), layer(used)) {
                    (Some(a), Some(b)) if b > a => {
                        let excepted = in_test
                            && TEST_EXCEPTIONS
                                .iter()
                                .any(|(f, t, _)| f == own && *t == used);
                        (!excepted).then_some(
                            "a stage may import only the stages before it (lib.rs LAYERS)",
                        )
                    }
                    (None, _) => Some("a top-level module missing from lib.rs LAYERS"),
                    _ => None,
                }
            };
            if let Some(why) = why {
                out.push(format!(
                    "{}:{}: {own} uses {used}: {why}",
                    path.display(),
                    u.line
                ));
            }
        }
    }
    out
}

fn rust_files(dir: &Path, root: &Path, out: &mut Vec<(PathBuf, String)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("read src")
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, root, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            let src = std::fs::read_to_string(&p).expect("read source");
            out.push((p.strip_prefix(root).expect("under src").to_path_buf(), src));
        }
    }
}

#[test]
fn no_module_imports_a_later_stage() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&root, &root, &mut files);
    assert!(
        files.len() > 50,
        "found the sources ({} files)",
        files.len()
    );
    let v = violations(&files);
    assert!(v.is_empty(), "layering broken:\n  {}", v.join("\n  "));
}

#[test]
fn every_top_level_module_is_in_the_order() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(root.join("lib.rs")).expect("lib.rs");
    let declared: Vec<String> = lib
        .lines()
        .filter_map(|l| {
            l.trim()
                .strip_prefix("pub mod ")
                .and_then(|m| m.strip_suffix(';'))
                .map(str::to_string)
        })
        .collect();
    let mut want: Vec<String> = LAYERS.iter().map(|s| s.to_string()).collect();
    want.push(TESTKIT.into());
    assert_eq!(
        declared, want,
        "lib.rs declares the modules in LAYERS order, then the test kit"
    );
}

fn check(files: &[(&str, &str)]) -> Vec<String> {
    violations(
        &files
            .iter()
            .map(|(p, s)| (PathBuf::from(p), s.to_string()))
            .collect::<Vec<_>>(),
    )
}

#[test]
fn the_check_catches_later_imports_in_every_spelling() {
    assert_eq!(
        check(&[("capture/x.rs", "use crate::l7::Exchange;")]).len(),
        1,
        "a plain path"
    );
    assert_eq!(
        check(&[(
            "correlate/mod.rs",
            "use crate::{capture::Event, decide::Decision};"
        )])
        .len(),
        1,
        "a group"
    );
    let v = check(&[(
        "l7/conn/x.rs",
        "fn f() { super::super::super::pipeline::Pipeline::new(); }",
    )]);
    assert_eq!(v.len(), 1, "super past the crate root: {v:?}");
    assert!(
        v[0].starts_with("l7/conn/x.rs:1: l7 uses pipeline"),
        "{v:?}"
    );
    let v = check(&[(
        "recorder/mod.rs",
        "use crate::{\n    capture::Event,\n    forensics::{self, Options},\n};",
    )]);
    assert_eq!(
        v,
        vec![
            "recorder/mod.rs:3: recorder uses forensics: a stage may import only the stages before it (lib.rs LAYERS)"
        ]
    );
    assert_eq!(
        check(&[(
            "decide/x.rs",
            "#[cfg(test)]\nmod tests {\n    use crate::api::router;\n}"
        )])
        .len(),
        1,
        "test code too"
    );
    assert_eq!(
        check(&[("cmd/x.rs", "use crate::testkit::Sim;")]).len(),
        1,
        "the test kit from production code"
    );
    assert_eq!(
        check(&[("testkit/x.rs", "use crate::cmd::Cli;")]).len(),
        1,
        "the test kit above the commands"
    );
    assert_eq!(
        check(&[("extra/x.rs", "use crate::capture::Event;")]).len(),
        1,
        "a module outside the order"
    );
}

#[test]
fn the_check_allows_earlier_stages_test_kits_in_tests_and_mentions() {
    let ok = [
        (
            "decide/x.rs",
            "use crate::{correlate::Edge, l7::Claim};\nuse super::Decider;",
        ),
        (
            "l7/conn.rs",
            "mod inner { use super::super::http1; }\n#[cfg(test)]\nmod tests { use super::super::tests::data; }",
        ),
        ("recorder/mod.rs", "#[cfg(test)]\nmod tests;\nfn f() {}"),
        ("recorder/tests.rs", "use crate::testkit::synth;"),
        (
            "capture/x.rs",
            "#[cfg(test)]\nmod t {\n    use crate::testkit::StormScenario;\n}\nuse crate::capture::Event;",
        ),
        (
            "capture/y.rs",
            "/// See [`crate::cmd::trace`].\n// crate::api\nconst S: &str = \"crate::metrics::X\";\nconst R: &str = r#\"crate::api\"#;\nfn f<'a>(c: char) -> bool { c == '{' }",
        ),
        (
            "testkit/x.rs",
            "use crate::{forensics::Options, pipeline::Pipeline};",
        ),
        ("correlate/engine/tests.rs", "use crate::decide::Decider;"),
        ("correlate/engine.rs", "#[cfg(test)]\nmod tests;"),
    ];
    let v = check(&ok);
    assert!(v.is_empty(), "{v:?}");
    // The same decide import outside test code is a breach: the exception is for tests only.
    assert_eq!(
        check(&[("correlate/engine.rs", "use crate::decide::Decider;")]).len(),
        1
    );
}
