//! The real Codex CLI (`codex exec`) with a scripted model, its tools run
//! in a remote environment: the reference `codex exec-server` and
//! `executor codex-exec-server`, each directly and through a real sshd.
//! Each scenario checks what Codex sent back to the model and what the
//! workspace holds afterwards.
//!
//! Tool-call shapes Codex 0.171.0 accepts (with `model = "gpt-5.5"`):
//! `exec_command {cmd, tty?, yield_time_ms?}` and `write_stdin
//! {session_id, chars, yield_time_ms?}` as function calls, `view_image
//! {path}` (a file read: `fs/readFile`), and `apply_patch` as a custom
//! (freeform) tool call whose `input` is the patch text.

use executor_tests::codex::{
    apply_patch, base64, function_call, items, run, session_id, Sandbox, Server, Turn, SERVER_MARK,
};
use serde_json::json;

/// `exec_command` with `args` (a JSON object).
fn exec(call_id: &str, args: serde_json::Value) -> serde_json::Value {
    function_call(call_id, "exec_command", args)
}

/// A turn that writes `chars` to the session the output of `after`
/// announced.
fn write_to_session(call_id: &'static str, after: &'static str, chars: &'static str) -> Turn {
    Box::new(move |req| {
        let out = executor_tests::codex::tool_output(req, after)
            .and_then(|o| o.as_str())
            .unwrap_or_default();
        let sid = session_id(out)
            .unwrap_or_else(|| panic!("no session id in the output of {after}: {out:?}"));
        vec![function_call(
            call_id,
            "write_stdin",
            json!({"session_id": sid, "chars": chars, "yield_time_ms": 3000}),
        )]
    })
}

/// The shell tool: output (with the server's environment) seen by the
/// model, in the workspace.
async fn shell(server: Server) {
    let Some(o) = run(
        "shell",
        server,
        Sandbox::WorkspaceWrite,
        vec![items(vec![exec(
            "call_shell",
            json!({"cmd": "echo MARK-$((6*7)) $EXECUTOR_CODEX_MARK; pwd"}),
        )])],
        |_| {},
    )
    .await
    else {
        return;
    };
    let out = o.text("call_shell");
    assert!(
        out.contains("Process exited with code 0"),
        "{out}\n{}",
        o.log()
    );
    assert!(out.contains(&format!("MARK-42 {SERVER_MARK}")), "{out}");
    let ws = o.dir.workspace.canonicalize().expect("canonical workspace");
    assert!(out.contains(&ws.display().to_string()), "{out}");
    assert!(o.status.success(), "{}", o.log());
}

/// A failing command: its exit code and stderr reach the model.
async fn failing_command(server: Server) {
    let Some(o) = run(
        "fail",
        server,
        Sandbox::WorkspaceWrite,
        vec![items(vec![exec(
            "call_fail",
            json!({"cmd": "echo oops-on-stderr >&2; exit 3"}),
        )])],
        |_| {},
    )
    .await
    else {
        return;
    };
    let out = o.text("call_fail");
    assert!(
        out.contains("Process exited with code 3"),
        "{out}\n{}",
        o.log()
    );
    assert!(out.contains("oops-on-stderr"), "{out}");
}

/// stdin to a running command on a tty: the model's `write_stdin` reaches
/// it, and its answer and exit come back.
async fn stdin_tty(server: Server) {
    let Some(o) = run(
        "tty",
        server,
        Sandbox::WorkspaceWrite,
        vec![
            items(vec![exec(
                "call_tty",
                json!({"cmd": "read x; echo got-$x", "tty": true, "yield_time_ms": 500}),
            )]),
            write_to_session("call_write", "call_tty", "ping\n"),
        ],
        |_| {},
    )
    .await
    else {
        return;
    };
    let started = o.text("call_tty");
    assert!(
        started.contains("Process running with session ID"),
        "{started}\n{}",
        o.log()
    );
    let out = o.text("call_write");
    assert!(out.contains("got-ping"), "{out}\n{}", o.log());
    assert!(out.contains("Process exited with code 0"), "{out}");
}

/// A command on pipes: Codex starts it with stdin closed (it reads EOF),
/// refuses `write_stdin` with characters to it, and a later empty
/// `write_stdin` (a poll) sees its remaining output and exit.
async fn stdin_pipe(server: Server) {
    let Some(o) = run(
        "pipe",
        server,
        Sandbox::WorkspaceWrite,
        vec![
            items(vec![exec(
                "call_pipe",
                json!({"cmd": "read x || echo eof-seen; sleep 1.5; echo late-line",
                       "yield_time_ms": 300}),
            )]),
            write_to_session("call_write", "call_pipe", "x\n"),
            write_to_session("call_poll", "call_pipe", ""),
        ],
        |_| {},
    )
    .await
    else {
        return;
    };
    let started = o.text("call_pipe");
    assert!(
        started.contains("Process running with session ID"),
        "{started}\n{}",
        o.log()
    );
    let refused = o.text("call_write");
    assert!(
        refused.contains("stdin is closed"),
        "{refused}\n{}",
        o.log()
    );
    let polled = o.text("call_poll");
    assert!(polled.contains("late-line"), "{polled}\n{}", o.log());
    assert!(polled.contains("Process exited with code 0"), "{polled}");
    assert!(
        started.contains("eof-seen") || polled.contains("eof-seen"),
        "{started}\n{polled}"
    );
}

/// `apply_patch` creating files in new nested folders, editing one and
/// deleting another, each seen as a success by the model and on disk.
async fn patch_create_edit_delete(server: Server) {
    let Some(o) = run(
        "patch",
        server,
        Sandbox::WorkspaceWrite,
        vec![
            items(vec![apply_patch(
                "call_add",
                "*** Begin Patch\n*** Add File: a/b/c/new.txt\n+line one\n+line two\n\
                 *** Add File: x/y/gone.txt\n+temporary\n*** End Patch\n",
            )]),
            items(vec![apply_patch(
                "call_edit",
                "*** Begin Patch\n*** Update File: a/b/c/new.txt\n@@\n line one\n-line two\n\
                 +line 2\n*** End Patch\n",
            )]),
            items(vec![apply_patch(
                "call_delete",
                "*** Begin Patch\n*** Delete File: x/y/gone.txt\n*** End Patch\n",
            )]),
        ],
        |_| {},
    )
    .await
    else {
        return;
    };
    for (call, change) in [
        ("call_add", "A a/b/c/new.txt"),
        ("call_edit", "M a/b/c/new.txt"),
        ("call_delete", "D x/y/gone.txt"),
    ] {
        let out = o.text(call);
        assert!(out.contains("Success"), "{call}: {out}\n{}", o.log());
        assert!(out.contains(change), "{call}: {out}");
    }
    let ws = &o.dir.workspace;
    assert_eq!(
        std::fs::read_to_string(ws.join("a/b/c/new.txt")).expect("the patched file"),
        "line one\nline 2\n"
    );
    assert!(
        !ws.join("x/y/gone.txt").exists(),
        "the deleted file is gone"
    );
    assert!(ws.join("x/y").is_dir(), "its folder stays");
}

/// A 1x1 PNG.
const PIXEL_PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0\x1f\x15\xc4\x89\0\0\0\rIDATx\x9cc\xf8\xcf\xc0\xf0\x1f\0\x05\0\x01\xff\x89\x99=\x1d\0\0\0\0IEND\xaeB`\x82";

/// A file read (`view_image`, read through the server's `fs/readFile`):
/// the model gets the file's bytes as a data URL; a missing file is an
/// error it sees.
async fn file_read(server: Server) {
    let Some(o) = run(
        "read",
        server,
        Sandbox::ReadOnly,
        vec![
            items(vec![function_call(
                "call_view",
                "view_image",
                json!({"path": "pics/pixel.png"}),
            )]),
            items(vec![function_call(
                "call_missing",
                "view_image",
                json!({"path": "pics/missing.png"}),
            )]),
        ],
        |ws| {
            std::fs::create_dir_all(ws.join("pics")).expect("mkdir");
            std::fs::write(ws.join("pics/pixel.png"), PIXEL_PNG).expect("write the image");
        },
    )
    .await
    else {
        return;
    };
    let out = o.output("call_view");
    let url = out[0]["image_url"].as_str().unwrap_or_default();
    let want = format!("data:image/png;base64,{}", base64(PIXEL_PNG));
    assert_eq!(url, want, "{out}\n{}", o.log());
    let missing = o.text("call_missing");
    assert!(missing.contains("missing.png"), "{missing}\n{}", o.log());
}

/// `--sandbox read-only`: a read works, a write by a command is refused
/// (the model sees the failure), `apply_patch` is refused, and nothing is
/// written.
async fn sandbox_read_only(server: Server) {
    let Some(o) = run(
        "ro",
        server,
        Sandbox::ReadOnly,
        vec![
            items(vec![exec("call_read", json!({"cmd": "cat present.txt"}))]),
            items(vec![exec(
                "call_write",
                json!({"cmd": "echo x > written.txt; echo rc=$?"}),
            )]),
            items(vec![apply_patch(
                "call_patch",
                "*** Begin Patch\n*** Add File: patched.txt\n+no\n*** End Patch\n",
            )]),
        ],
        |ws| std::fs::write(ws.join("present.txt"), "readable-content\n").expect("write"),
    )
    .await
    else {
        return;
    };
    let read = o.text("call_read");
    assert!(read.contains("readable-content"), "{read}\n{}", o.log());
    let write = o.text("call_write");
    assert!(write.contains("rc=1"), "{write}\n{}", o.log());
    let patch = o.text("call_patch");
    assert!(patch.contains("rejected"), "{patch}\n{}", o.log());
    assert!(!o.dir.workspace.join("written.txt").exists());
    assert!(!o.dir.workspace.join("patched.txt").exists());
}

/// `--sandbox workspace-write`: writes inside the workspace succeed
/// (command and patch), a write beside it is refused visibly.
async fn sandbox_workspace_write(server: Server) {
    let Some(o) = run(
        "ww",
        server,
        Sandbox::WorkspaceWrite,
        vec![
            items(vec![exec(
                "call_inside",
                json!({"cmd": "echo inside > inside.txt; echo rc=$?"}),
            )]),
            items(vec![exec(
                "call_outside",
                json!({"cmd": "echo outside > ../outside.txt; echo rc=$?"}),
            )]),
            items(vec![apply_patch(
                "call_patch",
                "*** Begin Patch\n*** Add File: deep/er/patched.txt\n+yes\n*** End Patch\n",
            )]),
        ],
        |_| {},
    )
    .await
    else {
        return;
    };
    let inside = o.text("call_inside");
    assert!(inside.contains("rc=0"), "{inside}\n{}", o.log());
    let outside = o.text("call_outside");
    assert!(outside.contains("rc=1"), "{outside}\n{}", o.log());
    let patch = o.text("call_patch");
    assert!(patch.contains("Success"), "{patch}\n{}", o.log());
    let ws = &o.dir.workspace;
    assert_eq!(
        std::fs::read_to_string(ws.join("inside.txt")).unwrap(),
        "inside\n"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("deep/er/patched.txt")).unwrap(),
        "yes\n"
    );
    assert!(!o.dir.root.join("outside.txt").exists());
}

/// Registers every scenario as a test against `$server` in module `$m`.
macro_rules! scenarios_against {
    ($m:ident, $server:expr) => {
        mod $m {
            use super::*;
            #[tokio::test]
            async fn shell_output_reaches_the_model() {
                shell($server).await;
            }
            #[tokio::test]
            async fn a_failing_command_reports_its_exit_code() {
                failing_command($server).await;
            }
            #[tokio::test]
            async fn stdin_reaches_a_command_on_a_tty() {
                stdin_tty($server).await;
            }
            #[tokio::test]
            async fn a_command_on_pipes_has_stdin_closed_and_is_polled() {
                stdin_pipe($server).await;
            }
            #[tokio::test]
            async fn apply_patch_creates_edits_and_deletes_in_nested_folders() {
                patch_create_edit_delete($server).await;
            }
            #[tokio::test]
            async fn a_file_read_returns_its_bytes() {
                file_read($server).await;
            }
            #[tokio::test]
            async fn read_only_refuses_writes_visibly() {
                sandbox_read_only($server).await;
            }
            #[tokio::test]
            async fn workspace_write_allows_the_workspace_only() {
                sandbox_workspace_write($server).await;
            }
        }
    };
}

scenarios_against!(reference, Server::Reference { via_ssh: false });

/// Through sshd, the shell and a patch prove the ssh launch (the other
/// scenarios do not depend on the transport).
mod reference_over_ssh {
    use super::*;
    #[tokio::test]
    async fn shell_output_reaches_the_model() {
        shell(Server::Reference { via_ssh: true }).await;
    }
    #[tokio::test]
    async fn apply_patch_creates_edits_and_deletes_in_nested_folders() {
        patch_create_edit_delete(Server::Reference { via_ssh: true }).await;
    }
}

scenarios_against!(executor, Server::Executor { via_ssh: false });
scenarios_against!(executor_over_ssh, Server::Executor { via_ssh: true });
