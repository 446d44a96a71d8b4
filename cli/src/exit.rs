//! Exit statuses, as ssh sets them: the command's own status when it ran
//! (whatever it printed), 255 for anything that failed before or outside
//! it, 127/126 for a program not found / not executable, 2 for bad usage
//! ([`Usage`]), and [`SANDBOX`] when the sandbox could not be set up or
//! refused a request before anything ran. Every error is printed once, on
//! stderr, naming what it was about; ssh's own words are not repeated.

use executor_client::{Error, ErrorCode};

/// A request failed (a missing remote file, a local file that cannot be
/// written, an entry `walk` could not read).
pub const FAILED: i32 = 1;
/// Bad usage (an unknown flag, a missing argument).
pub const USAGE: i32 = 2;
/// `http`: the server answered with a status of 400 or more (curl's 22).
pub const HTTP_STATUS: i32 = 22;
/// `http`: the agent could not reach the server (DNS, connect, TLS,
/// timeout: curl's 7).
pub const HTTP_CONNECT: i32 = 7;
/// The sandbox could not be set up (`sandbox_unavailable`: nothing ran) or
/// refused the request (`sandbox_denied` of an fs or HTTP request, or of a
/// job's start). A job that ran exits with its own status, even when the
/// agent reports it `sandbox_denied` (a note on stderr says so).
pub const SANDBOX: i32 = 125;
/// The program exists but could not be executed.
pub const NOT_EXECUTABLE: i32 = 126;
/// The program was not found.
pub const NOT_FOUND: i32 = 127;
/// Connecting, the handshake, the transport or the connection failed, or
/// the client itself did (ssh's 255).
pub const CONNECTION: i32 = 255;

/// The EXIT STATUS summary of `--help`.
pub const SUMMARY: &str = "\
Exit status: the command's own (run, shell, attach; 128+N for signal N), \
0 on success, 1 when a request failed, 2 for bad usage, 7/22 for http \
connection failures / HTTP statuses >= 400, 125 when the sandbox could not \
be set up or refused the request before anything ran, 126/127 for a \
program not executable / not found, 130/143 when interrupted \
(SIGINT/SIGTERM; a second Ctrl-C too), 255 when connecting or the \
connection failed.";

/// A failure before or outside the command that is not the library's
/// (a target that does not parse, a session with no job to attach to):
/// status 255.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Outside(pub String);

/// Bad usage the parser could not see (a malformed `-o`, `--env` without
/// `=`, a `--sandbox` file that is not an intent): status 2, the message
/// naming the value.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Usage(pub String);

/// The status for an error (see the constants).
pub fn code_of(e: &anyhow::Error) -> i32 {
    for cause in e.chain() {
        if cause.downcast_ref::<Outside>().is_some() {
            return CONNECTION;
        }
        if cause.downcast_ref::<Usage>().is_some() {
            return USAGE;
        }
        if let Some(err) = cause.downcast_ref::<Error>() {
            return match err {
                Error::Remote(w) => remote_code(w.code),
                _ => CONNECTION,
            };
        }
    }
    FAILED
}

fn remote_code(code: ErrorCode) -> i32 {
    match code {
        ErrorCode::SandboxUnavailable | ErrorCode::SandboxDenied => SANDBOX,
        // The agent refused the conversation, not the request.
        ErrorCode::UnsupportedVersion
        | ErrorCode::NotInitialized
        | ErrorCode::SessionExpired
        | ErrorCode::SessionTakenOver
        | ErrorCode::SessionBusy
        | ErrorCode::Internal => CONNECTION,
        _ => FAILED,
    }
}

/// Print an error (with a hint where one helps) and return its status.
pub fn report(result: anyhow::Result<i32>) -> i32 {
    match result {
        Ok(code) => code,
        // Like ripgrep: a closed stdout (`| head`) is a clean exit.
        Err(e) if is_broken_pipe(&e) => 0,
        Err(e) => {
            let code = code_of(&e);
            say(&format!("executor-client: {}", message(&e)));
            if let Some(hint) = hint(&e) {
                eprintln!("executor-client: {hint}");
            }
            code
        }
    }
}

/// `msg` on stderr, its control characters (but newline and tab) escaped
/// as `\xNN` / `\u{NN}`: an error message, a file name or an agent's
/// text never moves the cursor, retitles the window or answers for the
/// terminal.
pub fn say(msg: &str) {
    eprintln!("{}", shown(msg));
}

/// `s` with its control characters (C0 but `\n` and `\t`, DEL, C1) and
/// every other character a terminal acts on or that hides or reorders
/// text ([`super::quote::unsafe_char`]: bidi overrides, U+2028…)
/// escaped.
pub fn shown(s: &str) -> std::borrow::Cow<'_, str> {
    let plain = |c: char| !super::quote::unsafe_char(c) || c == '\n' || c == '\t';
    if s.chars().all(plain) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            c if plain(c) => out.push(c),
            c if (c as u32) < 0x80 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// `e` and its causes, joined by `: ` (anyhow's `{:#}`), except that a
/// transport that ended before the agent answered is not quoted again: its
/// stderr was passed on to ours as it came (ssh's own message, once).
fn message(e: &anyhow::Error) -> String {
    let parts: Vec<String> = e
        .chain()
        .map(|cause| match cause.downcast_ref::<Error>() {
            Some(Error::Exited {
                program,
                code,
                status,
                stderr,
            }) if relayed(stderr) => format!(
                "{program} exited {} before the agent started (its message is above)",
                code.map_or_else(|| status.clone(), |c| c.to_string())
            ),
            _ => cause.to_string().replace("\r\n", "\n"),
        })
        .collect();
    parts.join(": ")
}

/// Whether an [`Error::Exited`]'s stderr is words the relay already
/// printed (not the library's own "nothing on stderr" / "see above").
fn relayed(stderr: &str) -> bool {
    !(stderr.starts_with("nothing on stderr") || stderr == "see above")
}

fn hint(e: &anyhow::Error) -> Option<&'static str> {
    e.chain().find_map(|c| match c.downcast_ref::<Error>()? {
        Error::Exited {
            code: Some(127), ..
        } => Some(
            "the remote shell did not find the agent: install it with \
             `executor-client bootstrap --from DIR`, or name it with --remote-command PATH",
        ),
        Error::Timeout { .. } => {
            Some("is an executor agent at the other end? (--connect-timeout SECS sets the bound)")
        }
        _ => None,
    })
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            || c.downcast_ref::<serde_json::Error>()
                .and_then(|j| j.io_error_kind())
                .is_some_and(|k| k == std::io::ErrorKind::BrokenPipe)
    })
}
