//! Reference pages of the book (`docs/src/reference/`) generated from the
//! code's own definitions: a test renders the page and compares it with
//! the checked-in file, so the docs cannot drift from what the binary,
//! the CRDs or the metrics say. `ZKGATE_BLESS_DOCS=1` writes the page
//! instead (then review the diff and commit it).

use std::path::PathBuf;

/// Fails (or, blessed, writes) when `docs/src/reference/<page>` is not
/// `rendered`.
pub fn check_generated(page: &str, rendered: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("docs/src/reference")
        .join(page);
    if std::env::var_os("ZKGATE_BLESS_DOCS").is_some_and(|v| v == "1") {
        std::fs::write(&path, rendered).unwrap();
        return;
    }
    let found = std::fs::read_to_string(&path).unwrap_or_default();
    if found != rendered {
        let first = found
            .lines()
            .zip(rendered.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| found.lines().count().min(rendered.lines().count()));
        panic!(
            "{} is not what the code says (first difference at line {}); regenerate it with ZKGATE_BLESS_DOCS=1 and review the diff:\n--- generated ---\n{rendered}",
            path.display(),
            first + 1
        );
    }
}
