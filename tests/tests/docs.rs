//! The documentation stands on its own: every relative link of the README,
//! BENCHMARKS.md and the Markdown of `docs/`, `charts/` and `web/` resolves
//! to a file of the repository (and its `#anchor` to a heading there), and
//! nothing points outside the repository's tree.

use std::path::{Path, PathBuf};

use baton_e2e::REPO;

fn markdown_files() -> Vec<PathBuf> {
    let mut files = vec![
        PathBuf::from(REPO).join("README.md"),
        PathBuf::from(REPO).join("BENCHMARKS.md"),
    ];
    let mut dirs = vec![
        PathBuf::from(REPO).join("docs"),
        PathBuf::from(REPO).join("charts"),
        PathBuf::from(REPO).join("web"),
    ];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.file_name().is_some_and(|n| n == "node_modules") {
                continue;
            }
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
    }
    files
}

/// `](target)` links of a Markdown text, outside code blocks.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let mut rest = line;
        while let Some(start) = rest.find("](") {
            let after = &rest[start + 2..];
            let Some(end) = after.find(')') else { break };
            out.push(after[..end].to_owned());
            rest = &after[end..];
        }
    }
    out
}

/// GitHub's anchor of a heading: lower case, spaces to dashes, most
/// punctuation dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|h| anchor(h.trim_start_matches('#')))
        .collect()
}

#[test]
fn every_relative_link_resolves_inside_the_repository() {
    let repo = std::fs::canonicalize(REPO).unwrap();
    let mut broken = Vec::new();
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for link in links(&text) {
            if link.starts_with("http://")
                || link.starts_with("https://")
                || link.starts_with("mailto:")
            {
                continue;
            }
            let (path, fragment) = match link.split_once('#') {
                Some((p, f)) => (p, Some(f)),
                None => (link.as_str(), None),
            };
            let target = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            let Ok(resolved) = std::fs::canonicalize(&target) else {
                broken.push(format!("{}: {link} (no such file)", file.display()));
                continue;
            };
            if !resolved.starts_with(&repo) {
                broken.push(format!(
                    "{}: {link} (outside the repository)",
                    file.display()
                ));
                continue;
            }
            if let Some(fragment) = fragment
                && resolved.extension().is_some_and(|e| e == "md")
                && !anchors(&resolved).iter().any(|a| a == fragment)
            {
                broken.push(format!("{}: {link} (no such heading)", file.display()));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn nothing_refers_to_files_outside_the_repository() {
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for needle in ["../shared", "DESIGN.md", "STYLE.md"] {
            assert!(
                !text.contains(needle),
                "{} mentions {needle}, which a clone does not have",
                file.display()
            );
        }
    }
}

/// The README's outcome table names every outcome the API answers
/// (`baton_sidecar::outcome::Outcome`), and nothing else.
#[test]
fn the_readme_outcome_table_is_the_outcome_list() {
    let readme = std::fs::read_to_string(Path::new(REPO).join("README.md")).unwrap();
    let table: Vec<&str> = readme
        .lines()
        .skip_while(|l| !l.starts_with("| outcome | HTTP |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .collect();
    assert!(!table.is_empty(), "no outcome table in README.md");
    let documented: std::collections::BTreeSet<String> = table
        .iter()
        .flat_map(|row| {
            let first = row.split('|').nth(1).unwrap_or_default();
            first
                .split('`')
                .skip(1)
                .step_by(2)
                .map(String::from)
                .collect::<Vec<_>>()
        })
        .collect();
    let answered: std::collections::BTreeSet<String> = baton_sidecar::outcome::Outcome::ALL
        .iter()
        .map(|o| o.as_str().to_owned())
        .collect();
    let missing: Vec<_> = answered.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&answered).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "README.md's outcome table: missing {missing:?}, not an outcome {unknown:?}"
    );
}
