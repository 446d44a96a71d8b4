//! The `executor` and `executor-client` binaries as a user runs them.

use executor_tests::executor_bin;
use std::process::Command;

fn client_bin() -> std::path::PathBuf {
    executor_bin().with_file_name("executor-client")
}

#[test]
fn executor_version_and_help() {
    let out = Command::new(executor_bin())
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("executor {}", env!("CARGO_PKG_VERSION"))
    );
    let out = Command::new(executor_bin()).arg("--help").output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("Usage: executor"));
}

#[test]
fn run_streams_output_and_exits_with_the_remote_code() {
    let out = Command::new(client_bin())
        .args([
            "run",
            "--env",
            "GREETING=hi",
            "--",
            "sh",
            "-c",
            "echo $GREETING; echo oops >&2; exit 9",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(9));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hi\n");
    assert!(String::from_utf8_lossy(&out.stderr).contains("oops"));
    let out = Command::new(client_bin())
        .args(["run", "--", "sh", "-c", "kill -KILL $$"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(128 + 9));
    // stdin is forwarded.
    let mut child = Command::new(client_bin())
        .args(["run", "--", "tr", "a-z", "A-Z"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(b"shout\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "SHOUT\n");
}

#[test]
fn cat_get_put_walk_stat() {
    let d = executor_tests::unique_tempdir("cli-files");
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
    std::fs::write(d.join("src"), &data).unwrap();
    let out = Command::new(client_bin())
        .arg("cat")
        .arg(d.join("src"))
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(out.stdout, data);
    let st = Command::new(client_bin())
        .arg("get")
        .arg(d.join("src"))
        .arg(d.join("got"))
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(std::fs::read(d.join("got")).unwrap(), data);
    let st = Command::new(client_bin())
        .arg("put")
        .arg(d.join("got"))
        .arg(d.join("put"))
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(std::fs::read(d.join("put")).unwrap(), data);
    std::fs::create_dir(d.join("sub")).unwrap();
    std::fs::write(d.join("sub/x"), "x").unwrap();
    let out = Command::new(client_bin())
        .arg("walk")
        .arg(&d)
        .arg("--max-depth")
        .arg("1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("f 3000000 src\n"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("d ") && l.ends_with(" sub")),
        "{text}"
    );
    assert!(!text.contains("sub/x"), "{text}");
    let out = Command::new(client_bin())
        .arg("stat")
        .arg(d.join("src"))
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"size\": 3000000"));
    // A missing remote file: non-zero exit and the path in the message.
    let out = Command::new(client_bin())
        .arg("cat")
        .arg(d.join("missing"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing"));
}

#[test]
fn info_prints_json_without_the_resume_token() {
    let out = Command::new(client_bin()).arg("info").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("\"resume_token\": \"<redacted>\""), "{text}");
    assert!(text.contains("\"methods\""));
}

#[tokio::test]
async fn an_invalid_configuration_stops_the_agent_naming_file_line_and_key() {
    let dir = executor_tests::unique_tempdir("bad-config");
    let path = dir.join("config.toml");
    std::fs::write(&path, "[limits]\nmax_processes = 8\n\n[http]\nalow = []\n").unwrap();
    let out = tokio::process::Command::new(executor_tests::executor_bin())
        .arg("--config")
        .arg(&path)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(78), "EX_CONFIG");
    assert!(out.stdout.is_empty(), "nothing on the protocol stream");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("{}:5: alow:", path.display())),
        "{err}"
    );
    // A missing explicit file is an error too; a valid one serves.
    let out = tokio::process::Command::new(executor_tests::executor_bin())
        .args(["--config", "/nonexistent/executor.toml"])
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(78));
    let c = executor_tests::client_with_config("[limits]\nmax_processes = 8\n").await;
    assert_eq!(c.initialize_result().limits.max_processes, 8);
    c.close().await.unwrap();
}
