//! Issue 46, item 1: every command in the README, the book and the examples'
//! READMEs works as pasted. Each shell block's `kubectl`, `helm` and
//! `zkgate` lines are given to the real tools:
//!
//! - `zkgate ...` and `kubectl zkgate ...` (the same binary, installed as
//!   a plugin) to zkgate's own parser;
//! - `helm install` rendered by `helm template` with the same flags and
//!   values (the chart's schema checks them); `helm upgrade` and
//!   `helm uninstall` run with `--dry-run` against the test API server,
//!   where no release is installed (so "no such release" is the answer
//!   that says the command parsed);
//! - `kubectl ...` run against the test API server, every command that
//!   would change something with `--dry-run=server` (so the API server
//!   validates the manifests an example applies, against zkgate's, JobSet's
//!   and Kueue's CRDs; one on every namespace runs on an empty one), only
//!   `rollout status|history` of rollout's; a watch must start watching.
//!   An object not being there (NotFound) is the only error taken.
//!
//! A command the tools here cannot check (a krew install) is named in the
//! test's output and counted; none may be silently skipped.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::kube::{client, install_crds, install_upstream_crds, kubeconfig};
use support::tool;

/// A command of a doc: where it is and its words.
#[derive(Debug)]
struct Pasted {
    file: PathBuf,
    line: String,
    words: Vec<String>,
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The README, the book's pages and the examples' READMEs.
fn docs() -> Vec<PathBuf> {
    fn markdown(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                markdown(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut files = vec![root().join("README.md")];
    markdown(&root().join("docs/src"), &mut files);
    let mut examples = Vec::new();
    markdown(&root().join("examples"), &mut examples);
    files.extend(
        examples
            .into_iter()
            .filter(|p| p.file_name().is_some_and(|n| n == "README.md")),
    );
    files
}

/// What a shell variable in a doc's loop stands for, to check the command
/// it is in (a variable not named here fails the test: name it).
fn placeholder(name: &str) -> Option<&'static str> {
    match name {
        "namespace" => Some("default"),
        "kind" => Some("barrier"),
        "name" => Some("train"),
        _ => None,
    }
}

/// `word`, a URL of this release's downloads or tagged files, as the local
/// file a web server would give (support::release). A URL naming another
/// version than the chart's, or a file the release does not publish, fails:
/// the docs drifted from the release.
fn released(word: &str, file: &Path, line: &str) -> String {
    match support::release::local(word) {
        None => word.to_owned(),
        Some(Ok(path)) => path.to_string_lossy().into_owned(),
        Some(Err(why)) => panic!("{}: `{line}`: {why}", file.display()),
    }
}

/// `word` with its `$var` and `${var}` replaced by their placeholders.
fn substitute(word: &str, file: &Path, line: &str) -> String {
    let mut out = String::new();
    let mut rest = word;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, tail) = if let Some(braced) = after.strip_prefix('{') {
            let end = braced.find('}').expect("a closing brace");
            (&braced[..end], &braced[end + 1..])
        } else {
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..end], &after[end..])
        };
        let value = placeholder(name).unwrap_or_else(|| {
            panic!(
                "{}: `{line}`: no placeholder for ${name}: add one to placeholder()",
                file.display()
            )
        });
        out.push_str(value);
        rest = tail;
    }
    out.push_str(rest);
    out
}

/// The `kubectl`, `helm` and `zkgate` commands of the shell blocks of
/// `file` (fenced as sh, bash, shell, console or untagged), one per
/// command of a pipe or list.
fn pasted(file: &Path) -> Vec<Pasted> {
    let text = std::fs::read_to_string(file).unwrap();
    let mut found = Vec::new();
    let mut block: Option<String> = None;
    let mut lines: Vec<String> = Vec::new();
    for raw in text.lines() {
        let trimmed = raw.trim_start();
        if let Some(fence) = trimmed.strip_prefix("```") {
            match block.take() {
                Some(lang) => {
                    match lang.as_str() {
                        "sh" | "bash" | "shell" | "" => {
                            found.extend(commands(file, &lines.join("\n")));
                        }
                        // A session: its commands are the prompted lines
                        // (and the lines a `\` continues them on).
                        "console" => {
                            let mut prompted: Vec<&str> = Vec::new();
                            for l in &lines {
                                let l = l.trim_start();
                                let continued = prompted.last().is_some_and(|p| p.ends_with('\\'));
                                if let Some(command) = l.strip_prefix("$ ") {
                                    prompted.push(command);
                                } else if continued {
                                    prompted.push(l);
                                }
                            }
                            found.extend(commands(file, &prompted.join("\n")));
                        }
                        _ => {}
                    }
                    lines.clear();
                }
                None => block = Some(fence.trim().to_owned()),
            }
            continue;
        }
        if block.is_some() {
            lines.push(raw.to_owned());
        }
    }
    found
}

fn commands(file: &Path, block: &str) -> Vec<Pasted> {
    let joined = block.replace("\\\n", " ");
    let mut found = Vec::new();
    let mut heredoc: Option<String> = None;
    for line in joined.lines() {
        let line = line.trim();
        if let Some(end) = &heredoc {
            if line == end {
                heredoc = None;
            }
            continue;
        }
        let line = line.strip_prefix("$ ").unwrap_or(line);
        // A heredoc's lines are its command's input, not commands.
        if let Some(at) = line.find("<<") {
            let end = line[at + 2..].trim_start_matches('-').trim();
            let end = end.split_whitespace().next().unwrap_or_default();
            heredoc = Some(end.trim_matches(|c| c == '\'' || c == '"').to_owned());
        }
        let tools = ["kubectl", "helm", "zkgate"];
        if !line.split_whitespace().any(|w| tools.contains(&w)) {
            continue;
        }
        let Some(words) = shlex::split(line) else {
            panic!("{}: cannot split `{line}`", file.display());
        };
        for segment in words.split(|w| matches!(w.as_str(), "|" | "||" | "&&" | ";")) {
            let Some(first) = segment.first() else {
                continue;
            };
            if tools.contains(&first.as_str()) {
                found.push(Pasted {
                    file: file.strip_prefix(root()).unwrap_or(file).to_owned(),
                    line: line.to_owned(),
                    words: segment
                        .iter()
                        .map(|w| released(&substitute(w, file, line), file, line))
                        .collect(),
                });
            }
        }
    }
    found
}

/// The output of `program` with `args`, run in the checkout against the
/// test API server; a watch (`forever`) still running after a while is
/// watching, and is stopped.
fn run(program: &Path, args: &[String], forever: bool) -> (Option<i32>, String) {
    let mut child = Command::new(program)
        .args(args)
        .current_dir(root())
        .env("KUBECONFIG", kubeconfig())
        .env(
            "HELM_CACHE_HOME",
            std::env::temp_dir().join("zkgate-docs-helm"),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let limit = if forever {
        Duration::from_secs(5)
    } else {
        Duration::from_secs(60)
    };
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            return (
                status.code(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            );
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            assert!(forever, "{args:?} ran past {limit:?}: {stderr}");
            return (None, stderr);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether `stderr` holds only errors of objects that are not there.
fn only_not_found(stderr: &str) -> bool {
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("Error") || l.starts_with("error"))
        .collect();
    !errors.is_empty() && errors.iter().all(|l| l.contains("NotFound"))
}

/// zkgate's parser on `args` (after the program's name).
fn zkgate_parses(args: &[String]) -> Result<(), String> {
    use clap::Parser;
    let all = std::iter::once("zkgate".to_owned()).chain(args.iter().cloned());
    match zkgate::cli::Cli::try_parse_from(all) {
        Ok(_) => Ok(()),
        // --help and --version are fine.
        Err(e) if !e.use_stderr() => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}

/// Where `kubectl`'s subcommand is in `words` (after its global flags).
fn subcommand(words: &[String]) -> Option<usize> {
    let mut i = 1;
    while i < words.len() {
        let w = &words[i];
        if matches!(
            w.as_str(),
            "-n" | "--namespace" | "--context" | "--kubeconfig"
        ) {
            i += 2;
        } else if w.starts_with('-') {
            i += 1;
        } else {
            return Some(i);
        }
    }
    None
}

/// Checks one command; `Err` says why it fails as pasted, `Ok(false)`
/// that the tools here cannot check it.
fn check(command: &Pasted) -> Result<bool, String> {
    let words = &command.words;
    match words[0].as_str() {
        "zkgate" => zkgate_parses(&words[1..]).map(|()| true),
        "helm" => {
            let mut args: Vec<String> = words[1..].to_vec();
            match args.first().map(String::as_str) {
                Some("install") => args[0] = "template".into(),
                Some("upgrade" | "uninstall") => args.push("--dry-run".into()),
                other => return Err(format!("no check for helm {other:?}: add one")),
            }
            let (code, stderr) = run(&tool("helm"), &args, false);
            let parsed = code == Some(0)
                || stderr.contains("has no deployed releases")
                || stderr.contains("release: not found");
            if parsed {
                Ok(true)
            } else {
                Err(stderr)
            }
        }
        "kubectl" => {
            let at = subcommand(words).ok_or("no subcommand")?;
            let mut args: Vec<String> = words[1..].to_vec();
            // Ours before a `--` (what follows it is a command's).
            let end = args.iter().position(|w| w == "--").unwrap_or(args.len());
            let mutating = |args: &mut Vec<String>| {
                args.insert(end, "--dry-run=server".into());
                // On everything: on an empty namespace instead (a dry run
                // of the shared server's every test object takes minutes
                // at kubectl's request rate; the flags are what is checked).
                if let Some(all) = args[..end]
                    .iter()
                    .position(|w| w == "--all-namespaces" || w == "-A")
                {
                    args[all] = "--namespace=zkgate-docs-empty".into();
                }
            };
            match words[at].as_str() {
                // kubectl refuses flags before a plugin's name.
                "zkgate" if at > 1 => {
                    return Err("kubectl takes no flags before a plugin's name".into())
                }
                "zkgate" => return zkgate_parses(&words[at + 1..]).map(|()| true),
                // A plugin manager not installed here: its own flags.
                "krew" => return Ok(false),
                "apply" | "create" | "delete" | "label" | "annotate" | "patch" | "replace" => {
                    mutating(&mut args);
                }
                "rollout"
                    if matches!(
                        words.get(at + 1).map(String::as_str),
                        Some("status" | "history")
                    ) => {}
                "get" | "describe" | "logs" | "explain" | "top" | "wait" => {}
                other => return Err(format!("no check for kubectl {other}: add one")),
            }
            let watch = words
                .iter()
                .any(|w| matches!(w.as_str(), "-w" | "--watch" | "--watch-only"));
            let (code, stderr) = run(&tool("kubectl"), &args, watch);
            match code {
                // Still watching.
                None => Ok(true),
                Some(0) => Ok(true),
                Some(_) if only_not_found(&stderr) => Ok(true),
                Some(code) => Err(format!("exit {code}: {stderr}")),
            }
        }
        other => Err(format!("not a checked tool: {other}")),
    }
}

/// Every command the docs show, checked by the real tools; the failures
/// all named at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_in_the_docs_works_as_pasted() {
    let client = client().await;
    install_crds(&client).await;
    install_upstream_crds(&client).await;
    let commands: Vec<Pasted> = docs().iter().flat_map(|f| pasted(f)).collect();
    assert!(
        commands.len() >= 40,
        "found only {} commands: is the block parsing broken?",
        commands.len()
    );
    let mut failures = Vec::new();
    let mut unchecked = Vec::new();
    for command in &commands {
        match tokio::task::block_in_place(|| check(command)) {
            Ok(true) => {}
            Ok(false) => unchecked.push(format!("{}: {}", command.file.display(), command.line)),
            Err(why) => failures.push(format!(
                "{}: `{}`: {why}",
                command.file.display(),
                command.line
            )),
        }
    }
    println!(
        "{} commands checked; not checkable here ({}): {unchecked:#?}",
        commands.len() - unchecked.len(),
        unchecked.len()
    );
    assert!(
        unchecked.len() <= 2,
        "more commands the tools here cannot check: {unchecked:#?}"
    );
    assert!(
        failures.is_empty(),
        "{} commands fail as pasted:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The checks themselves fail on what the issue found: a watch over two
/// resources, a flag kubectl does not have, a value the chart's schema
/// refuses, a zkgate flag that is not there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_refuses_what_fails_as_pasted() {
    let client = client().await;
    install_crds(&client).await;
    let block = "kubectl get barriers,pods -w\n\
                 kubectl get barriers --no-such-flag\n\
                 helm install zkgate charts/zkgate --set zookeeper.deploy=maybe\n\
                 zkgate status barrier train --no-such-flag\n\
                 kubectl zkgate status barrier train --all-of-them\n\
                 kubectl -n default zkgate status\n\
                 kubectl rollout restart deploy/zkgate\n";
    let commands = commands_of(block);
    assert_eq!(commands.len(), 7);
    for command in &commands {
        let checked = tokio::task::block_in_place(|| check(command));
        assert!(checked.is_err(), "{}: passed", command.line);
    }
    let good = commands_of("kubectl get barriers -A\nzkgate status barrier train -n default\n");
    for command in &good {
        let checked = tokio::task::block_in_place(|| check(command));
        assert_eq!(checked, Ok(true), "{}", command.line);
    }
}

fn commands_of(block: &str) -> Vec<Pasted> {
    commands(Path::new("inline.md"), block)
}
