//! The library's dependency tree holds no command-line crate (issue 33):
//! a program that links `executor-client` does not build clap, the progress
//! bars or the terminal handling of the `executor-client` binary (those are
//! the `executor-cli` crate's). Asks `cargo tree` itself (offline: every
//! crate of the lock file is already in cargo's cache once the workspace
//! builds), with every feature of the library on.

/// Crates only the command line uses.
const CLI_ONLY: &[&str] = &[
    "clap",
    "clap_builder",
    "clap_derive",
    "clap_complete",
    "clap_mangen",
    "roff",
    "indicatif",
    "console",
    "crossterm",
    "anstyle",
    "anstream",
    "tracing-subscriber",
    "hyper",
    "anyhow",
];

#[test]
fn the_library_tree_has_no_command_line_crates() {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = std::process::Command::new(&cargo)
        .args([
            "tree",
            "-p",
            "executor-client",
            "-e",
            "normal",
            "--all-features",
            "--prefix",
            "none",
            "--offline",
            "--locked",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo tree");
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && tree.contains("executor-client"),
        "{cargo:?} tree failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let mut crates: Vec<&str> = tree
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    crates.sort_unstable();
    crates.dedup();
    let found: Vec<&str> = crates
        .iter()
        .copied()
        .filter(|c| CLI_ONLY.contains(c))
        .collect();
    assert!(
        found.is_empty(),
        "executor-client's normal dependencies include command-line crates {found:?}: \
         they belong in cli/ (executor-cli)"
    );
}
