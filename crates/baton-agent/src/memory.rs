//! What the reference agent says and remembers: a pure function from
//! (state, input) to (reply, new state, files to write). Deterministic and
//! offline: it is not a language model and does not pretend to be.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The agent's memory: everything it knows lives here, in the session state
/// Baton stores, never in the process.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Memory {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Turns this session has had, this one included.
    #[serde(default)]
    pub turns: u64,
    /// Hash chain over every input, in turn order: `chain(previous, input)`.
    /// Constant-size proof of exactly which turns the state holds, so a
    /// load test can check that no acknowledged turn was lost, repeated or
    /// reordered.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub history: String,
}

/// The next link of [`Memory::history`]: SHA-256 of the previous link, a
/// newline and the input, as hex.
pub fn chain(previous: &str, input: &str) -> String {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    hasher.update(previous.as_bytes());
    hasher.update(b"\n");
    hasher.update(input.as_bytes());
    format!("{:x}", hasher.finalize())
}

/// What one turn produces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub reply: String,
    pub memory: Memory,
    /// Files to write in the workspace (relative path, content); `notes.md`
    /// gets the turn appended separately.
    pub files: Vec<(String, String)>,
    /// How long this turn takes (`/sleep <ms>`).
    pub delay: Duration,
    /// `/fail`: the agent answers with an error, for tests of aborted turns.
    pub fail: bool,
    /// `/stream <chunks> <ms> [text]`: how this reply is streamed (to a
    /// caller that accepts a stream), whatever the agent's configuration.
    pub stream: Option<Streaming>,
}

/// How a reply is streamed: in `chunks` pieces, `interval` apart; `cut`
/// ends the stream before its final event (`/stream-cut`), for tests of a
/// stream that breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Streaming {
    pub chunks: usize,
    pub interval: Duration,
    pub cut: bool,
}

/// Most chunks a reply is streamed in, and longest pause between two.
const MAX_CHUNKS: usize = 1000;
const MAX_CHUNK_INTERVAL_MS: u64 = 10_000;

/// `<chunks> <ms> [text]` of a `/stream` command.
fn streaming(rest: &str, cut: bool) -> (Streaming, &str) {
    let mut words = rest.trim().splitn(3, ' ');
    let chunks = words.next().and_then(|w| w.parse().ok()).unwrap_or(4);
    let ms: u64 = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
    let text = words.next().unwrap_or("").trim();
    let plan = Streaming {
        chunks: chunks.clamp(1, MAX_CHUNKS),
        interval: Duration::from_millis(ms.min(MAX_CHUNK_INTERVAL_MS)),
        cut,
    };
    (plan, text)
}

/// Largest `/fill` (the workspace's limit per file is 64 MiB).
const MAX_FILL_MIB: usize = 64;

/// `bytes` of text that differ from file to file, so each is its own blob.
fn filler(file: &str, bytes: usize) -> String {
    let mut text = String::with_capacity(bytes + 64);
    let mut line = 0u64;
    while text.len() < bytes {
        text.push_str(&format!("{file} line {line:012}\n"));
        line += 1;
    }
    let mut end = bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text
}

/// Longest name remembered.
const MAX_NAME_CHARS: usize = 64;

/// Where a name ends: the first punctuation mark, ASCII or CJK ("我叫小林，
/// 帮我记住" names 小林, "I'm Lin, hi" names Lin). Spaces do not end it:
/// "my name is Lin Xiaoming".
const NAME_ENDS: [char; 20] = [
    ',', '.', '!', '?', ';', ':', '，', '。', '！', '？', '；', '：', '、', '(', '（', ')', '）',
    '"', '“', '\n',
];

/// The name at the start of `rest`, up to the first punctuation mark.
fn name_in(rest: &str) -> Option<&str> {
    let end = rest.find(NAME_ENDS).unwrap_or(rest.len());
    let name = rest[..end].trim();
    (!name.is_empty()).then_some(name)
}

/// The name after one of the `prefixes` (ASCII ones compared ignoring case).
fn name_after<'a>(input: &'a str, prefixes: &[&str]) -> Option<&'a str> {
    prefixes.iter().find_map(|p| {
        let head = input.get(..p.len())?;
        if !head.eq_ignore_ascii_case(p) {
            return None;
        }
        name_in(input.get(p.len()..)?)
    })
}

fn asks_for_name(input: &str) -> bool {
    let lower = input.to_lowercase();
    let lower = lower.trim().trim_end_matches(['?', '？']);
    matches!(
        lower,
        "what is my name" | "what's my name" | "who am i" | "我叫什么" | "我叫什么名字" | "我是谁"
    )
}

/// One turn of the reference agent.
pub fn respond(memory: &Memory, input: &str) -> Outcome {
    let mut memory = memory.clone();
    memory.turns += 1;
    memory.history = chain(&memory.history, input);
    let input = input.trim();
    let mut outcome = Outcome {
        reply: String::new(),
        memory: Memory::default(),
        files: Vec::new(),
        delay: Duration::ZERO,
        fail: false,
        stream: None,
    };

    if let Some(rest) = input.strip_prefix("/sleep ") {
        // `/sleep <ms> [text]`: the reply (the text, or what it did) after
        // that long, at once: a streamed turn's twin for benchmarks.
        let (ms, text) = rest.trim().split_once(' ').unwrap_or((rest.trim(), ""));
        let ms: u64 = ms.parse().unwrap_or(0).min(600_000);
        outcome.delay = Duration::from_millis(ms);
        outcome.reply = match text.trim() {
            "" => format!("slept {ms} ms"),
            text => text.to_owned(),
        };
    } else if let Some((rest, cut)) = input
        .strip_prefix("/stream-cut")
        .map(|r| (r, true))
        .or_else(|| input.strip_prefix("/stream").map(|r| (r, false)))
        .filter(|(r, _)| r.is_empty() || r.starts_with(' '))
    {
        // `/stream <chunks> <ms> [text]`: the reply (the text, or the
        // echo) streamed in `chunks` pieces `ms` apart.
        let (plan, text) = streaming(rest, cut);
        outcome.stream = Some(plan);
        outcome.reply = if text.is_empty() {
            format!("You said: {input} (turn {})", memory.turns)
        } else {
            text.to_owned()
        };
    } else if input == "/fail" {
        outcome.fail = true;
        outcome.reply = "failing on purpose".into();
    } else if let Some(rest) = input.strip_prefix("/fill ") {
        // `/fill <file> <MiB>`: a large file, for tests of big workspaces.
        let (file, mib) = rest.trim().split_once(' ').unwrap_or((rest.trim(), "1"));
        let mib: usize = mib.trim().parse().unwrap_or(1).min(MAX_FILL_MIB);
        outcome
            .files
            .push((file.to_owned(), filler(file, mib << 20)));
        outcome.reply = format!("filled {file} with {mib} MiB");
    } else if let Some(rest) = input.strip_prefix("/write ") {
        let (file, content) = rest.trim().split_once(' ').unwrap_or((rest.trim(), ""));
        outcome
            .files
            .push((file.to_owned(), format!("{content}\n")));
        outcome.reply = format!("wrote {file}");
    } else if asks_for_name(input) {
        let chinese = !input.is_ascii();
        outcome.reply = match (&memory.name, chinese) {
            (Some(name), false) => format!("Your name is {name}."),
            (Some(name), true) => format!("你叫{name}。"),
            (None, false) => "I don't know your name yet.".into(),
            (None, true) => "我还不知道你的名字。".into(),
        };
    } else if let Some(name) = name_after(input, &["my name is ", "i am ", "i'm ", "call me "]) {
        let name: String = name.chars().take(MAX_NAME_CHARS).collect();
        outcome.reply = format!("Nice to meet you, {name}.");
        memory.name = Some(name);
    } else if let Some(name) = name_after(input, &["我叫", "我是", "叫我"]) {
        let name: String = name.chars().take(MAX_NAME_CHARS).collect();
        outcome.reply = format!("你好，{name}！");
        memory.name = Some(name);
    } else {
        outcome.reply = format!("You said: {input} (turn {})", memory.turns);
    }
    outcome.memory = memory;
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(turns: &[&str]) -> Vec<String> {
        let mut memory = Memory::default();
        turns
            .iter()
            .map(|input| {
                let out = respond(&memory, input);
                memory = out.memory;
                out.reply
            })
            .collect()
    }

    #[test]
    fn remembers_a_name_across_turns() {
        assert_eq!(
            chat(&["my name is Lin", "what is my name?"]),
            ["Nice to meet you, Lin.", "Your name is Lin."]
        );
    }

    #[test]
    fn remembers_a_chinese_name() {
        assert_eq!(
            chat(&["我叫小林", "我叫什么"]),
            ["你好，小林！", "你叫小林。"]
        );
    }

    #[test]
    fn a_name_ends_at_punctuation_and_more_phrasings_are_understood() {
        for (said, name) in [
            ("我叫小林，帮我记住", "小林"),
            ("我叫小林。", "小林"),
            ("我是小林", "小林"),
            ("叫我小林！", "小林"),
            ("I'm Lin", "Lin"),
            ("i'm Lin, nice to meet you", "Lin"),
            ("Call me Lin.", "Lin"),
            ("my name is Lin Xiaoming; remember it", "Lin Xiaoming"),
            ("My name is Lin!", "Lin"),
        ] {
            let out = respond(&Memory::default(), said);
            assert_eq!(out.memory.name.as_deref(), Some(name), "{said:?}");
        }
        assert_eq!(
            chat(&["我叫小林，帮我记住", "我叫什么？"]),
            ["你好，小林！", "你叫小林。"]
        );
        // Questions about the name are not names; nor is a bare prefix.
        for said in ["我是谁", "我叫什么名字", "my name is ", "我叫，"] {
            assert_eq!(
                respond(&Memory::default(), said).memory.name,
                None,
                "{said:?}"
            );
        }
    }

    #[test]
    fn does_not_invent_a_name() {
        assert_eq!(chat(&["what's my name"]), ["I don't know your name yet."]);
        assert_eq!(chat(&["我叫什么？"]), ["我还不知道你的名字。"]);
    }

    #[test]
    fn counts_turns_and_echoes() {
        assert_eq!(
            chat(&["hello", "again"]),
            ["You said: hello (turn 1)", "You said: again (turn 2)"]
        );
    }

    #[test]
    fn commands_for_tests() {
        let out = respond(&Memory::default(), "/sleep 250");
        assert_eq!(out.delay, Duration::from_millis(250));
        assert_eq!(out.reply, "slept 250 ms");
        let out = respond(&Memory::default(), "/sleep 40 the same words, at once");
        assert_eq!(out.delay, Duration::from_millis(40));
        assert_eq!(out.reply, "the same words, at once");
        assert!(respond(&Memory::default(), "/fail").fail);
        let out = respond(&Memory::default(), "/write report.txt 42 apples");
        assert_eq!(
            out.files,
            [("report.txt".to_owned(), "42 apples\n".to_owned())]
        );
        let out = respond(&Memory::default(), "/fill big.bin 2");
        assert_eq!(out.files[0].0, "big.bin");
        assert_eq!(out.files[0].1.len(), 2 << 20);
        assert_ne!(
            respond(&Memory::default(), "/fill other.bin 2").files[0].1,
            out.files[0].1
        );
        assert_eq!(
            respond(&Memory::default(), "/sleep 99999999").delay,
            Duration::from_secs(600)
        );
        let out = respond(&Memory::default(), "/stream 5 20 hello streaming world");
        assert_eq!(out.reply, "hello streaming world");
        let plan = out.stream.unwrap();
        assert_eq!(
            (plan.chunks, plan.interval, plan.cut),
            (5, Duration::from_millis(20), false)
        );
        let out = respond(&Memory::default(), "/stream-cut 3 0");
        assert!(out.stream.unwrap().cut);
        assert_eq!(out.reply, "You said: /stream-cut 3 0 (turn 1)");
        let plan = respond(&Memory::default(), "/stream 0 999999")
            .stream
            .unwrap();
        assert_eq!((plan.chunks, plan.interval), (1, Duration::from_secs(10)));
        assert!(respond(&Memory::default(), "/streams").stream.is_none());
    }

    #[test]
    fn long_names_are_cut() {
        let long = "x".repeat(500);
        let out = respond(&Memory::default(), &format!("my name is {long}"));
        assert_eq!(out.memory.name.unwrap().chars().count(), MAX_NAME_CHARS);
    }
}
