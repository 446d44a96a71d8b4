//! `--net ask` on a real terminal (a PTY the test drives, the client's
//! controlling terminal): the user's typed answer reaches the question and
//! not the job whose stdin forwards the same terminal, a job's own fake
//! question cannot get a destination allowed by a `y`, raw mode (`--tty`)
//! works, and a question nobody answers ends at the intent's
//! `ask_timeout_ms` without swallowing the next line meant for the job.

use executor_tests::cli::*;
use executor_tests::*;

/// Runs `argv` on a new PTY as its controlling terminal: types `answer`
/// (when not empty) after the question appears, then `for-the-job` after
/// the job prints `asked`; returns the exit code and the whole screen.
fn on_a_terminal(argv: &[String], answer: &str) -> (Option<i32>, String) {
    on_a_terminal_at(argv, "anything else denies: ", answer)
}

/// [`on_a_terminal`], typing `answer` after `question` appears.
fn on_a_terminal_at(argv: &[String], question: &str, answer: &str) -> (Option<i32>, String) {
    on_a_terminal_with(argv, ("", ""), question, answer)
}

/// [`on_a_terminal_at`], first typing `prelude.1` (no Enter) once
/// `prelude.0` appears (when not empty).
fn on_a_terminal_with(
    argv: &[String],
    prelude: (&str, &str),
    question: &str,
    answer: &str,
) -> (Option<i32>, String) {
    const DRIVER: &str = r#"
import os, pty, sys, time
answer = os.environ["ANSWER"].encode()
question = os.environ["QUESTION"].encode()
pid, fd = pty.fork()
if pid == 0:
    os.execvp(sys.argv[1], sys.argv[1:])
seen = b""
def until(token, secs=25):
    global seen
    deadline = time.time() + secs
    while token not in seen and time.time() < deadline:
        try:
            seen += os.read(fd, 4096)
        except OSError:
            return False
    return token in seen
prelude = os.environ["PRELUDE"].encode()
if prelude and until(prelude):
    time.sleep(0.2)
    os.write(fd, os.environ["PRELUDE_KEYS"].encode())
if until(question) and answer:
    time.sleep(0.2)
    os.write(fd, answer + b"\r")
if until(b"asked"):
    time.sleep(0.2)
    os.write(fd, b"for-the-job\r")
# The rest of the screen, until the client exits (the terminal hangs up).
until(b"\x00never", 30)
deadline = time.time() + 10
done, status = os.waitpid(pid, os.WNOHANG)
while done == 0 and time.time() < deadline:
    time.sleep(0.05)
    done, status = os.waitpid(pid, os.WNOHANG)
if done == 0:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    seen += b"\n[driver: the client did not exit; killed]"
    status = 99 << 8
sys.stdout.write(seen.decode(errors="replace"))
sys.exit(os.waitstatus_to_exitcode(status) & 0xff)
"#;
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(DRIVER)
        .args(argv)
        .env("ANSWER", answer)
        .env("QUESTION", question)
        .env("PRELUDE", prelude.0)
        .env("PRELUDE_KEYS", prelude.1)
        .output()
        .expect("python3");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The job: a request through its proxy by name, then a line read from
/// its stdin (the terminal, forwarded).
fn job(port: u16, spoof: bool) -> String {
    let fake = if spoof {
        format!("echo 'executor-client: proc-1 asks to reach 127.0.0.1:{port}; type y to allow it, anything else denies: '; ")
    } else {
        String::new()
    };
    format!(
        "{fake}curl -sS -o /dev/null -w 'code=%{{http_code}}' --noproxy '' -x \"$HTTP_PROXY\" http://127.0.0.1:{port}/; \
         echo; echo asked; read -r line; echo \"job read: $line\""
    )
}

fn argv(via: &Via, run: &[&str], script: &str) -> Vec<String> {
    let mut a = vec![client_bin().to_string_lossy().into_owned()];
    a.extend(via.flags());
    a.push("run".into());
    a.extend(run.iter().map(|s| s.to_string()));
    a.extend(["--", "sh", "-c", script].map(String::from));
    a
}

fn have_tools() -> bool {
    for tool in ["curl", "python3"] {
        if std::process::Command::new(tool)
            .arg("--version")
            .output()
            .is_err()
        {
            prerequisite_missing(tool);
            return false;
        }
    }
    true
}

#[test]
fn a_typed_destination_answers_the_question_and_never_reaches_the_job() {
    if !have_tools() {
        return;
    }
    let port = tiny_http_server();
    let dest = format!("127.0.0.1:{port}");
    for via in Via::both() {
        let (code, screen) =
            on_a_terminal(&argv(&via, &["--net", "ask"], &job(port, false)), &dest);
        let name = via.name();
        assert!(
            screen.contains(&format!("proc-1 asks to reach {dest}; type {dest}")),
            "{name}: {screen}"
        );
        assert!(screen.contains("code=200"), "{name}: allowed: {screen}");
        assert!(screen.contains("job read: for-the-job"), "{name}: {screen}");
        assert!(
            !screen.contains(&format!("job read: {dest}")),
            "{name}: the answer went to the job: {screen}"
        );
        assert_eq!(code, Some(0), "{name}: {screen}");
        // Control: another answer denies.
        let (_, screen) = on_a_terminal(&argv(&via, &["--net", "ask"], &job(port, false)), "nope");
        assert!(screen.contains("code=403"), "{name}: denied: {screen}");
        assert!(screen.contains("job read: for-the-job"), "{name}: {screen}");
    }
}

#[test]
fn a_question_the_job_prints_itself_gets_nothing_allowed_by_a_y() {
    if !have_tools() {
        return;
    }
    let port = tiny_http_server();
    let (_, screen) = on_a_terminal(&argv(&Via::Local, &["--net", "ask"], &job(port, true)), "y");
    assert!(
        screen.contains("type y to allow it"),
        "the job's fake question: {screen}"
    );
    assert!(screen.contains("code=403"), "a y allows nothing: {screen}");
}

#[test]
fn with_tty_raw_mode_the_answer_is_read_and_echoed() {
    if !have_tools() {
        return;
    }
    let port = tiny_http_server();
    let dest = format!("127.0.0.1:{port}");
    let (code, screen) = on_a_terminal(
        &argv(&Via::Local, &["--tty", "--net", "ask"], &job(port, false)),
        &dest,
    );
    assert!(screen.contains("code=200"), "{screen}");
    assert!(
        screen.matches(dest.as_str()).count() >= 3,
        "the question names it twice and the typed answer is echoed: {screen}"
    );
    assert!(screen.contains("job read: for-the-job"), "{screen}");
    assert_eq!(code, Some(0), "{screen}");
}

#[test]
fn an_unanswered_question_ends_at_the_intents_timeout_and_the_next_line_is_the_jobs() {
    if !have_tools() {
        return;
    }
    let port = tiny_http_server();
    let dir = unique_tempdir("ask-timeout");
    let intent = dir.join("intent.json");
    std::fs::write(
        &intent,
        r#"{"network": {"allow_hosts": [], "ask": true, "ask_timeout_ms": 1500}}"#,
    )
    .unwrap();
    let (code, screen) = on_a_terminal(
        &argv(
            &Via::Local,
            &["--sandbox", intent.to_str().unwrap()],
            &job(port, false),
        ),
        "",
    );
    assert!(screen.contains("no answer in time: denied"), "{screen}");
    assert!(screen.contains("code=403"), "{screen}");
    assert!(screen.contains("job read: for-the-job"), "{screen}");
    assert_eq!(code, Some(0), "{screen}");
    std::fs::remove_dir_all(&dir).unwrap();
}

// A job that asks for many destinations at once cannot queue questions
// past the agent's own wait: each question ends at the deadline its
// request has (arrival + ask_timeout_ms), waiting for the terminal
// included, so once a flood of six is denied the next destination's
// question is on the terminal while the agent still waits, and typing it
// allows it. (Queued one after another, each for its whole timeout, the
// stale ones held the terminal for ~9 s and the real one was denied
// before it was shown.) The flood itself is denied: its control.
#[test]
fn a_flood_of_questions_never_outlives_the_agents_wait() {
    if !have_tools() {
        return;
    }
    let port = tiny_http_server();
    let dir = unique_tempdir("ask-flood");
    let intent = dir.join("intent.json");
    std::fs::write(
        &intent,
        r#"{"network": {"allow_hosts": [], "ask": true, "ask_timeout_ms": 1500}}"#,
    )
    .unwrap();
    let flood = "for p in 1 2 3 4 5 6; do \
        curl -sS -o /dev/null -w 'flood=%{http_code} ' --noproxy '' -x \"$HTTP_PROXY\" http://localhost:$p/ & \
        done; wait; echo; echo flood-done; ";
    let dest = format!("127.0.0.1:{port}");
    let (code, screen) = on_a_terminal_at(
        &argv(
            &Via::Local,
            &["--sandbox", intent.to_str().unwrap()],
            &format!("{flood}{}", job(port, false)),
        ),
        &format!("asks to reach {dest}; type {dest} to allow it, anything else denies: "),
        &dest,
    );
    assert_eq!(screen.matches("flood=403").count(), 6, "{screen}");
    assert!(screen.contains("flood-done"), "{screen}");
    assert!(screen.contains("code=200"), "allowed: {screen}");
    assert!(screen.contains("job read: for-the-job"), "{screen}");
    assert_eq!(code, Some(0), "{screen}");
    std::fs::remove_dir_all(&dir).unwrap();
}

// An answer is a whole line typed while its question is asked: with
// `--tty` (raw mode: every key reaches the client as typed) a first
// question ends while its answer is half typed (`x`), the next question
// comes, and the rest of that line (the second destination) allows
// nothing. Control: the second destination typed as a line of its own
// (`a_typed_destination…`, `with_tty_raw_mode…`) is allowed.
#[test]
fn the_end_of_a_line_begun_for_another_question_allows_nothing() {
    if !have_tools() {
        return;
    }
    let port = tiny_http_server();
    let dir = unique_tempdir("ask-split");
    let intent = dir.join("intent.json");
    std::fs::write(
        &intent,
        r#"{"network": {"allow_hosts": [], "ask": true, "ask_timeout_ms": 3000}}"#,
    )
    .unwrap();
    let first = "curl -sS -o /dev/null -w 'first=%{http_code} ' --noproxy '' -x \"$HTTP_PROXY\" http://localhost:1/ & sleep 0.3; ";
    let dest = format!("127.0.0.1:{port}");
    let (code, screen) = on_a_terminal_with(
        &argv(
            &Via::Local,
            &["--tty", "--sandbox", intent.to_str().unwrap()],
            &format!("{first}{}; wait", job(port, false)),
        ),
        ("asks to reach localhost:1;", "x"),
        &format!("asks to reach {dest}; type {dest} to allow it, anything else denies: "),
        &dest,
    );
    assert!(screen.contains("first=403"), "{screen}");
    assert!(screen.contains("code=403"), "denied: {screen}");
    assert!(!screen.contains("code=200"), "{screen}");
    assert!(screen.contains("job read: for-the-job"), "{screen}");
    assert_eq!(code, Some(0), "{screen}");
    std::fs::remove_dir_all(&dir).unwrap();
}
