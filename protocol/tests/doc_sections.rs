//! `docs/PROTOCOL.md` documents every request method, every limit and
//! every error code this crate defines, and keeps the section numbers the
//! code comments cite ("docs/PROTOCOL.md §n").

use executor_protocol::limits::Limits;
use executor_protocol::{methods, ErrorCode};

fn doc() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/PROTOCOL.md");
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"))
}

/// The field names of `Limits`, as serialized (named MessagePack map).
fn limit_names() -> Vec<String> {
    let bytes = rmp_serde::to_vec_named(&Limits::default()).expect("Limits serializes");
    let value = rmpv::decode::read_value(&mut &bytes[..]).expect("valid MessagePack");
    let rmpv::Value::Map(entries) = value else {
        panic!("Limits did not serialize as a map: {value:?}");
    };
    entries
        .into_iter()
        .map(|(k, _)| {
            k.as_str()
                .unwrap_or_else(|| panic!("non-string key {k:?}"))
                .to_string()
        })
        .collect()
}

#[test]
fn every_method_has_a_heading() {
    let doc = doc();
    let headings: Vec<&str> = doc
        .lines()
        .map(str::trim_end)
        .filter(|l| l.starts_with("### "))
        .collect();
    let mut missing = Vec::new();
    for name in std::iter::once(&methods::INITIALIZE).chain(methods::ALL_REQUESTS) {
        let want = format!("### `{name}`");
        if !headings.contains(&want.as_str()) {
            missing.push(want);
        }
    }
    assert!(
        missing.is_empty(),
        "docs/PROTOCOL.md lacks these method headings: {missing:#?}"
    );
}

#[test]
fn every_limit_is_documented() {
    let doc = doc();
    let names = limit_names();
    assert!(names.len() >= 15, "expected every limit, got {names:?}");
    let missing: Vec<&String> = names
        .iter()
        .filter(|n| !doc.contains(&format!("`{n}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/PROTOCOL.md does not name these limits in backticks: {missing:?}"
    );
}

#[test]
fn every_error_code_is_documented() {
    let doc = doc();
    let missing: Vec<&str> = ErrorCode::ALL
        .iter()
        .map(|c| c.as_str())
        .filter(|c| !doc.contains(&format!("| `{c}` |")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/PROTOCOL.md has no error-table row for: {missing:?}"
    );
}

#[test]
fn cited_sections_exist() {
    let doc = doc();
    // The sections code comments cite as "docs/PROTOCOL.md §n", with their meaning.
    for (n, title) in [
        (1, "Transport and framing"),
        (2, "Session"),
        (3, "Processes"),
        (4, "Unified exec"),
        (5, "Filesystem"),
        (6, "HTTP"),
        (7, "SandboxIntent"),
        (8, "Egress by name"),
    ] {
        let prefix = format!("## {n}. {title}");
        assert!(
            doc.lines().any(|l| l.starts_with(&prefix)),
            "docs/PROTOCOL.md lacks the section heading {prefix:?}"
        );
    }
}
