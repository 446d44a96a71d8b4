//! The agent's module graph (from `crate::` paths in `agent/src`, comments
//! aside): which top-level module uses which. It must have no cycle, and
//! every module sits in one layer of [`LAYERS`] and imports only from its
//! own layer or those below (a new module fails here until it is placed).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The layers, bottom first (the order `agent/src/lib.rs` describes).
const LAYERS: &[(&str, &[&str])] = &[
    // A job's limits and account (the sandbox crate's cgroups).
    ("limits", &["limits"]),
    // Frames out: replies, errors, notifications.
    ("outbound", &["outbound"]),
    // The session's state tables (jobs, file handles, HTTP streams).
    ("tables", &["tables"]),
    // What the session and the handlers use beside the tables:
    // configuration, the audit log, the destination policy, the HTTP
    // client, the sandbox gate, forced commands, the login environment,
    // the egress proxy of jobs.
    (
        "support",
        &[
            "config",
            "destinations",
            "audit",
            "http_client",
            "sandbox_gate",
            "forced",
            "login_env",
            "egress",
        ],
    ),
    ("session", &["session"]),
    // One module per method family.
    ("handlers", &["process", "exec", "fs", "http", "tools"]),
    ("dispatch", &["dispatch"]),
    ("conn", &["conn"]),
    ("host", &["host"]),
    ("codex", &["codex"]),
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|(_, ms)| ms.contains(&module))
}

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

fn reaches(g: &BTreeMap<String, BTreeSet<String>>, from: &str, to: &str) -> bool {
    let mut seen = BTreeSet::new();
    let mut todo = vec![from.to_string()];
    while let Some(m) = todo.pop() {
        for n in g.get(&m).into_iter().flatten() {
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
fn the_agent_modules_form_no_cycle() {
    let g = graph();
    assert!(
        g.get("conn").is_some_and(|d| d.contains("dispatch")),
        "the graph is read: {g:?}"
    );
    for m in g.keys() {
        assert!(!reaches(&g, m, m), "{m} is in an import cycle: {g:?}");
    }
}

#[test]
fn every_module_imports_only_its_layer_or_below() {
    let g = graph();
    for (from, deps) in &g {
        let Some(low) = layer_of(from) else {
            panic!("module {from} is in no layer of LAYERS: place it");
        };
        for to in deps {
            let Some(high) = layer_of(to) else {
                panic!("module {to} is in no layer of LAYERS: place it");
            };
            assert!(
                high <= low,
                "{from} ({}) imports {to} ({}), a higher layer",
                LAYERS[low].0,
                LAYERS[high].0
            );
        }
    }
    // Beside the support modules, which a layer above may use, every
    // layer but the bottom one builds on the one right below it.
    for (upper, lower) in [
        ("tables", "outbound"),
        ("session", "tables"),
        ("process", "session"),
        ("dispatch", "process"),
        ("conn", "dispatch"),
        ("host", "conn"),
    ] {
        assert!(
            g.get(upper).is_some_and(|d| d.contains(lower)),
            "{upper} no longer uses {lower}: is LAYERS still true? {g:?}"
        );
    }
}
