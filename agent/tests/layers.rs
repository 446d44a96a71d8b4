//! The agent's module graph (from `crate::` paths in `agent/src`): which
//! top-level module uses which. It must have no cycle but the ones listed
//! in `KNOWN`, the session and the handler modules whose tables it owns
//! (issue 15's remaining work); a new cycle fails here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Cycles still to break: the session holds tables defined next to their
/// handlers, which use the session.
const KNOWN: &[(&str, &str)] = &[
    ("session", "fs"),
    ("session", "http"),
    ("session", "process"),
];

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules: BTreeSet<String> = std::fs::read_dir(&root)
        .unwrap()
        .flatten()
        .map(|e| {
            e.file_name()
                .to_string_lossy()
                .trim_end_matches(".rs")
                .to_string()
        })
        .filter(|m| m != "lib" && m != "main")
        .collect();
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut files = vec![root.clone()];
    while let Some(p) = files.pop() {
        if p.is_dir() {
            files.extend(std::fs::read_dir(&p).unwrap().flatten().map(|e| e.path()));
            continue;
        }
        let rel = p.strip_prefix(&root).unwrap();
        let from = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let from = from.trim_end_matches(".rs").to_string();
        if !modules.contains(&from) {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap();
        for line in text.lines() {
            let code = line.split("//").next().unwrap_or("");
            let mut rest = code;
            while let Some(i) = rest.find("crate::") {
                rest = &rest[i + "crate::".len()..];
                let names: Vec<&str> = if let Some(group) = rest.strip_prefix('{') {
                    group.split('}').next().unwrap_or("").split(',').collect()
                } else {
                    vec![rest]
                };
                for n in names {
                    let n: String = n
                        .trim()
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if n != from && modules.contains(&n) {
                        g.entry(from.clone()).or_default().insert(n);
                    }
                }
            }
        }
    }
    g
}

fn reaches(
    g: &BTreeMap<String, BTreeSet<String>>,
    from: &str,
    to: &str,
    skip: &[(&str, &str)],
) -> bool {
    let mut seen = BTreeSet::new();
    let mut todo = vec![from.to_string()];
    while let Some(m) = todo.pop() {
        for n in g.get(&m).into_iter().flatten() {
            let known = skip
                .iter()
                .any(|(a, b)| (m == *a && n == b) || (m == *b && n == a));
            if known {
                continue;
            }
            if n == to {
                return true;
            }
            if seen.insert(n.clone()) {
                todo.push(n.clone());
            }
        }
    }
    false
}

#[test]
fn the_agent_modules_form_no_new_cycle() {
    let g = graph();
    assert!(
        g.get("conn").is_some_and(|d| d.contains("dispatch")),
        "the graph is read: {g:?}"
    );
    // Without the known session <-> handler edges, no module reaches itself.
    for m in g.keys() {
        assert!(
            !reaches(&g, m, m, KNOWN),
            "{m} is in an import cycle: {g:?}"
        );
    }
    // The layers named in lib.rs: nothing below imports what is above.
    for (low, high) in [
        ("outbound", "conn"),
        ("outbound", "session"),
        ("outbound", "dispatch"),
        ("session", "conn"),
        ("session", "dispatch"),
        ("dispatch", "conn"),
        ("config", "http"),
    ] {
        assert!(!reaches(&g, low, high, &[]), "{low} reaches {high}: {g:?}");
    }
}
