//! What a release publishes, as the docs name it by URL (a user without a
//! clone downloads it), read from the local files a web server would give:
//! the chart's package and manifest as scripts/release-chart builds them,
//! the tagged repository's files from this checkout.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Where a release's downloads are.
pub const RELEASES: &str = "https://github.com/zkgate/zkgate/releases/download/";
/// Where a release's tagged files are.
pub const TAGGED: &str = "https://raw.githubusercontent.com/zkgate/zkgate/";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The chart's version, which a release's tag names (`v<version>`).
pub fn chart_version() -> String {
    chart_field("version")
}

/// A top-level field of charts/zkgate/Chart.yaml (`version`, `appVersion`).
pub fn chart_field(name: &str) -> String {
    let chart = std::fs::read_to_string(root().join("charts/zkgate/Chart.yaml")).unwrap();
    chart
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("Chart.yaml has no {name}"))
        .trim()
        .trim_matches('"')
        .to_owned()
}

/// What scripts/release-chart publishes, built once per test process.
pub fn release_dir() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("zkgate-release")
            .tempdir()
            .expect("a temporary directory")
            .keep();
        let out = Command::new(root().join("scripts/release-chart"))
            .arg(&dir)
            .stderr(Stdio::inherit())
            .output()
            .expect("run scripts/release-chart");
        assert!(out.status.success(), "scripts/release-chart failed");
        dir
    })
}

/// `url`'s local file, if it is one of this release's downloads or tagged
/// files: `Err` when it names another version than the chart's or a file
/// the release does not publish (the docs drifted from the release).
pub fn local(url: &str) -> Option<Result<PathBuf, String>> {
    let (rest, base) = if let Some(rest) = url.strip_prefix(RELEASES) {
        (rest, release_dir())
    } else {
        (url.strip_prefix(TAGGED)?, root())
    };
    let version = chart_version();
    let Some(path) = rest.strip_prefix(&format!("v{version}/")) else {
        return Some(Err(format!(
            "{url}: a release URL of another version than the chart's {version}"
        )));
    };
    let local = base.join(path);
    Some(if local.exists() {
        Ok(local)
    } else {
        Err(format!("{url} is not something the release publishes"))
    })
}

/// `script` with each of this release's URLs in it replaced by its local
/// file (panics on one that is not published, see [`local`]).
pub fn localize(script: &str) -> String {
    script
        .split_inclusive(|c: char| c.is_whitespace() || c == '\'' || c == '"')
        .map(|piece| {
            let end = piece.trim_end_matches(|c: char| c.is_whitespace() || c == '\'' || c == '"');
            match local(end) {
                Some(Ok(path)) => format!("{}{}", path.display(), &piece[end.len()..]),
                Some(Err(why)) => panic!("{why}"),
                None => piece.to_owned(),
            }
        })
        .collect()
}
