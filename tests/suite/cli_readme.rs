//! The README's commands work as written (issue 33, item 7): its sandboxed
//! `run` examples are run here verbatim, through a shell, with
//! `executor-client` on the PATH as an installed one would be.

use executor_tests::cli::*;

/// The README's line that starts with `start`, without its `# …` comment.
fn readme_line(start: &str) -> String {
    let readme = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    let text = std::fs::read_to_string(&readme).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with(start))
        .unwrap_or_else(|| panic!("the README has no line starting {start:?}"));
    line.split(" # ").next().unwrap().trim().to_string()
}

fn run_in_shell(line: &str, cwd: &std::path::Path) -> std::process::Output {
    let bin = client_bin();
    let path = format!(
        "{}:{}",
        bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    std::process::Command::new("sh")
        .arg("-c")
        .arg(line)
        .current_dir(cwd)
        .env("PATH", path)
        .env_remove("EXECUTOR_TARGET")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn the_readmes_sandboxed_run_examples_work_as_written() {
    let dir = executor_tests::unique_tempdir("readme");
    // `mkdir -p /tmp/work && executor-client run --rw /tmp/work -- touch /etc/x`:
    // denied, touch's own status 1 and a note.
    let line = readme_line("mkdir -p /tmp/work && executor-client run --rw /tmp/work");
    let out = run_in_shell(&line, &dir);
    assert_eq!(out.status.code(), Some(1), "{line}: {}", text(&out));
    assert!(text(&out).contains("note:"), "{line}: {}", text(&out));
    assert!(!std::path::Path::new("/etc/x").exists());
    // `mkdir -p build && executor-client run --rw "$PWD/build" -- make -C "$PWD" OUT=build`,
    // in a folder with a Makefile that writes into OUT.
    std::fs::write(
        dir.join("Makefile"),
        "all:\n\techo built > $(OUT)/artifact\n",
    )
    .unwrap();
    let line = readme_line("mkdir -p build && executor-client run --rw \"$PWD/build\"");
    let out = run_in_shell(&line, &dir);
    if out.status.code() == Some(127) && text(&out).contains("make") {
        executor_tests::prerequisite_missing("make");
        return;
    }
    assert!(out.status.success(), "{line}: {}", text(&out));
    assert_eq!(
        std::fs::read_to_string(dir.join("build/artifact")).unwrap(),
        "built\n"
    );
}
