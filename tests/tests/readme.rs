//! The README's quickstart, run as written: the commands of its steps 1
//! and 3 against a live `baton dev` (only the port swapped), their output
//! compared with what the README shows: the same answers in step 1 (the
//! replica aside, which round-robin picks), the same shape in step 3 (how
//! many answers are BUSY depends on timing; that the turn ran once does
//! not).

use baton_e2e::support;

use std::collections::BTreeMap;

use serde_json::Value;
use support::*;

const README: &str = include_str!("../../README.md");

/// The commands (`$ ` lines) of the first text block after the line that
/// starts with `step`, each with the output lines the README shows for it.
fn commands_of(step: &str) -> Vec<(String, Vec<String>)> {
    let mut lines = README
        .lines()
        .skip_while(|l| !l.starts_with(step))
        .skip_while(|l| *l != "```text")
        .skip(1)
        .take_while(|l| *l != "```");
    let mut commands: Vec<(String, Vec<String>)> = Vec::new();
    for line in lines.by_ref() {
        match line.strip_prefix("$ ") {
            Some(command) => commands.push((command.to_owned(), Vec::new())),
            None => commands
                .last_mut()
                .expect("a block starts with a command")
                .1
                .push(line.to_owned()),
        }
    }
    assert!(!commands.is_empty(), "no commands under {step:?}");
    commands
}

/// Runs `command` with bash in `dir`, `localhost:8080` being `front`.
fn run(command: &str, front: &str, dir: &std::path::Path) -> Vec<String> {
    let command = command.replace("localhost:8080", front);
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(&command)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{command}: {out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// `     42 "status":"BUSY"` → ("BUSY", 42).
fn counts(lines: &[String]) -> BTreeMap<String, u64> {
    lines
        .iter()
        .map(|l| {
            let (n, status) = l
                .trim()
                .split_once(' ')
                .unwrap_or_else(|| panic!("not a count: {l:?}"));
            let status = status
                .strip_prefix("\"status\":\"")
                .and_then(|s| s.strip_suffix('"'))
                .unwrap_or_else(|| panic!("not a status: {l:?}"));
            (status.to_owned(), n.parse().unwrap())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quickstart_commands_answer_what_the_readme_shows() {
    let _serial = serial().await;
    let dev = Cluster::start(Stores::Embedded).await;
    let front = dev.url.trim_start_matches("http://").to_owned();
    let dir = tempfile::tempdir().unwrap();

    // Step 1: the same answers, whichever replica gives them.
    for (command, shown) in commands_of("**1. Any replica continues") {
        let got = run(&command, &front, dir.path());
        assert_eq!(got.len(), shown.len(), "{command}: {got:?}");
        for (got, shown) in got.iter().zip(&shown) {
            let mut got: Value = serde_json::from_str(got).unwrap();
            let mut shown: Value = serde_json::from_str(shown).unwrap();
            for answer in [&mut got, &mut shown] {
                answer["replica"] = Value::Null;
            }
            assert_eq!(got, shown, "{command}");
        }
    }

    // Step 3: the same statuses (never another one), the same total, and
    // the turn ran once.
    for (command, shown) in commands_of("**3. Concurrent requests") {
        let got = run(&command, &front, dir.path());
        if shown.is_empty() {
            continue;
        }
        let (got, shown) = (counts(&got), counts(&shown));
        assert!(
            got.keys().all(|status| shown.contains_key(status)),
            "{command}: {got:?}, the README shows {shown:?}"
        );
        assert_eq!(
            got.values().sum::<u64>(),
            shown.values().sum::<u64>(),
            "{command}"
        );
        if shown.contains_key("DUPLICATE") {
            assert_eq!(got.get("OK"), Some(&1), "{command}: {got:?}");
        } else {
            assert!(got.get("OK").is_some_and(|n| *n >= 1), "{command}: {got:?}");
        }
    }
}
