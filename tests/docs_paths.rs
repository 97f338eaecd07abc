//! The documents name real files: every `src/`, `lua/`, `tests/`, `benches/` and
//! `examples/` path in `docs/*.md` and the README exists, every test they cite as
//! `file::test` is there, and every file under `src/` is named in `docs/design.md`'s
//! module tables (a file moved or added without its row is how the design page drifts
//! from the tree).

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn documents() -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.push(root().join("README.md"));
    docs.sort();
    docs
}

/// Every path written in `text` that starts with `src/`, `lua/`, `tests/`, `benches/` or
/// `examples/` right after a character that cannot be part of a path, and names a `.rs`
/// or `.lua` file or (ending in `/`) a folder.
fn paths_in(text: &str) -> Vec<String> {
    const ROOTS: [&str; 5] = ["src/", "lua/", "tests/", "benches/", "examples/"];
    let is_path_char = |c: char| c.is_ascii_alphanumeric() || "_/.-".contains(c);
    let mut found = Vec::new();
    for (at, _) in text.match_indices(['s', 'l', 't', 'b', 'e']) {
        let rest = &text[at..];
        if !ROOTS.iter().any(|r| rest.starts_with(r)) {
            continue;
        }
        if text[..at].chars().next_back().is_some_and(is_path_char) {
            continue;
        }
        let end = rest.find(|c: char| !is_path_char(c)).unwrap_or(rest.len());
        let path = rest[..end].trim_end_matches('.');
        let folder = path.ends_with('/') && !ROOTS.contains(&path);
        if path.ends_with(".rs") || path.ends_with(".lua") || folder {
            found.push(path.to_string());
        }
    }
    found
}

/// Every test the documents cite as `` `file::test_name` `` where `tests/file.rs` exists.
fn cited_tests(text: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for quoted in text.split('`').skip(1).step_by(2) {
        let Some((file, test)) = quoted.split_once("::") else {
            continue;
        };
        let word =
            |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if word(file) && word(test) && root().join(format!("tests/{file}.rs")).is_file() {
            found.push((file.to_string(), test.to_string()));
        }
    }
    found
}

/// The text of `tests/<file>.rs` and of the files under `tests/<file>/`.
fn test_sources(file: &str) -> String {
    let mut text = std::fs::read_to_string(root().join(format!("tests/{file}.rs"))).unwrap();
    let dir = root().join("tests").join(file);
    if dir.is_dir() {
        let mut files = Vec::new();
        files_under(&dir, &mut files);
        for f in files {
            text += &std::fs::read_to_string(root().join(f)).unwrap();
        }
    }
    text
}

fn files_under(dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files_under(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            let rel = path.strip_prefix(root()).unwrap();
            out.push(rel.to_string_lossy().replace('\\', "/"));
        }
    }
}

#[test]
fn the_path_finder_finds_paths_and_only_paths() {
    let text = "see `src/api/lock.rs`, lua/take.lua, tests/mc/. Not foo/src/x.rs, src/, x.rs";
    assert_eq!(
        paths_in(text),
        ["src/api/lock.rs", "lua/take.lua", "tests/mc/"]
    );
    let text = "`turns::a_test` and `turns::Foo::bar` and `nofile::x` and `redis::cmd`";
    assert_eq!(
        cited_tests(text),
        [("turns".to_string(), "a_test".to_string())]
    );
}

#[test]
fn every_source_path_the_documents_name_exists() {
    let mut missing = Vec::new();
    let mut seen = 0;
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        for path in paths_in(&text) {
            seen += 1;
            let there = if path.ends_with('/') {
                root().join(&path).is_dir()
            } else {
                root().join(&path).is_file()
            };
            if !there {
                missing.push(format!(
                    "{}: {path}",
                    doc.file_name().unwrap().to_string_lossy()
                ));
            }
        }
    }
    assert!(seen > 50, "only {seen} paths found: the finder broke");
    assert!(
        missing.is_empty(),
        "named but not in the tree: {missing:#?}"
    );
}

#[test]
fn every_file_under_src_has_a_row_in_the_design_tables() {
    let design = std::fs::read_to_string(root().join("docs/design.md")).unwrap();
    // Only the tables' rows: a file named in passing in the prose has no row of its own.
    let rows: String = design
        .lines()
        .filter(|l| l.starts_with('|'))
        .flat_map(|l| [l, "\n"])
        .collect();
    let named: Vec<String> = paths_in(&rows);
    let mut files = Vec::new();
    files_under(&root().join("src"), &mut files);
    assert!(files.len() > 50, "{} files", files.len());
    // A row may name a file's unit tests or parts inside its parent's row, without the
    // `src/` prefix (`state/table/tests.rs`); either way the file is named.
    let missing: Vec<&String> = files
        .iter()
        .filter(|f| !named.contains(f) && !rows.contains(&format!("`{}`", &f["src/".len()..])))
        .collect();
    assert!(
        missing.is_empty(),
        "in src/ but in no row of docs/design.md: {missing:#?}"
    );
}

#[test]
fn every_test_the_documents_cite_exists() {
    let mut missing = Vec::new();
    let mut seen = 0;
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        for (file, test) in cited_tests(&text) {
            seen += 1;
            if !test_sources(&file).contains(&format!("fn {test}(")) {
                let doc = doc.file_name().unwrap().to_string_lossy().into_owned();
                missing.push(format!("{doc}: {file}::{test}"));
            }
        }
    }
    assert!(seen > 10, "only {seen} cited tests found: the finder broke");
    assert!(missing.is_empty(), "cited but no such test: {missing:#?}");
}
