//! `generate man|bash|zsh|fish`: the man page (clap_mangen for NAME,
//! SYNOPSIS, DESCRIPTION and OPTIONS; every command's flags in COMMANDS;
//! EXIT STATUS, ENVIRONMENT, FILES and EXAMPLES written here) and the shell
//! completions, for packaging. The page names no other page of this
//! project: only this one is shipped per binary.

use std::io::Write;

const EXIT_STATUS: &str = r#".SH "EXIT STATUS"
.TP
\fB0\fR
Success (for \fBrun\fR, \fBshell\fR and \fBattach\fR: the command exited 0).
.TP
\fIN\fR
\fBrun\fR, \fBshell\fR, \fBattach\fR: the command's own exit status; 128+\fIn\fR when signal \fIn\fR killed it.
.TP
\fB1\fR
A request failed (a missing remote file, a local file that cannot be written); \fBwalk\fR: an entry could not be read.
.TP
\fB2\fR
Bad usage (an unknown flag, a malformed \fB\-o\fR, \fB\-\-env\fR without \fB=\fR, a \fB\-\-sandbox\fR file that is not an intent); the message names the value.
.TP
\fB7\fR, \fB28\fR
\fBhttp\fR: the agent could not reach the server (DNS, connect, TLS) / timed out.
.TP
\fB22\fR
\fBhttp\fR: the server answered with a status of 400 or more (\fBHTTP\fR \fINNN\fR on stderr).
.TP
\fB125\fR
The sandbox could not be set up on the host (sandbox_unavailable: nothing ran) or refused the request before anything ran (sandbox_denied of \fBcat\fR, \fBget\fR, \fBput\fR, \fBhttp\fR...). A job that ran exits with its own status even when the agent guesses the sandbox denied it something (a note on stderr says so).
.TP
\fB126\fR, \fB127\fR
\fBrun\fR: the program is not executable / was not found.
.TP
\fB130\fR, \fB143\fR, \fB129\fR
Interrupted by SIGINT, SIGTERM or SIGHUP (a transfer leaves no temp file behind); \fBrun\fR: a second Ctrl-C (the first one interrupts the job) disconnects with 130.
.TP
\fB255\fR
Connecting, the handshake or the connection failed (ssh's own failures included: its message is printed once, above the client's), or the client failed outside the command.
"#;

const ENVIRONMENT: &str = r#".SH ENVIRONMENT
.TP
\fBEXECUTOR_TARGET\fR
The default \fB\-\-target\fR.
.TP
\fBEXECUTOR_SSH\fR
The ssh program (default \fBssh\fR).
.TP
\fBEXECUTOR_BIN\fR
The local agent (default: \fBexecutor\fR next to this binary).
.TP
\fBRUST_LOG\fR
The log filter when neither \fB\-v\fR nor \fB\-q\fR is given (default warn). With \fB\-v\fR/\fB\-q\fR the level is also set for the agent (and \fB\-\-log\-json\fR its format, as \fBEXECUTOR_LOG_JSON=1\fR): through the environment locally, through ssh's SetEnv remotely (where sshd has AcceptEnv RUST_LOG EXECUTOR_LOG_JSON).
.TP
\fBNO_COLOR\fR
No colours in logs (there are none unless stderr is a terminal).
.TP
\fBXDG_RUNTIME_DIR\fR, \fBHOME\fR
Where \fBrun \-\-detach\fR keeps resume tokens.
"#;

const FILES: &str = r#".SH FILES
.TP
\fI~/.ssh/config\fR
Read by ssh (unless \fB\-F\fR names another): Host aliases, ProxyJump, keys.
.TP
\fI$XDG_RUNTIME_DIR/executor\-client/SESSION\fR (else \fI~/.cache/executor\-client/SESSION\fR)
The resume token of a session started with \fBrun \-\-detach\fR and its TTL (mode 0600), read by \fBattach\fR; removed once the job's end was shown, when the agent says the session is gone, or when the TTL ran out since a client last left the session.
.TP
\fI.NAME.partPID\-N\fR
\fBget\fR's temp file beside the destination, renamed over it when complete, removed on any error or signal.
.TP
\fI.NAME.linkPID\fR
\fBget \-r\fR's and \fBput \-r\fR's new symlink (locally / on the agent's host), made beside \fINAME\fR after every file of the tree and renamed over it, so a copied link replaces what was there and nothing of the copy is written through one.
"#;

const EXAMPLES: &str = r#".SH EXAMPLES
.TP
\fBexecutor\-client run \-\- cargo \-\-version\fR
Run on this machine (the local agent), in the user's login environment.
.TP
\fBexecutor\-client \-\-target devbox run \-\-ro /usr \-\-rw /tmp/work \-\- make \-C /tmp/work\fR
Run on devbox (a Host of ~/.ssh/config), reading /usr, writing only /tmp/work (which must exist there), without network; it starts in /tmp/work, since the sandbox grants nothing at home.
.TP
\fBexecutor\-client \-\-target devbox run \-\-detach 600 \-\- make test\fR
The job outlives this client for 600 s: closing the terminal (SIGHUP), SIGTERM, a second Ctrl\-C or \fB~.\fR at the start of a line (then Enter, unless \fB\-t\fR) leaves it running; the client exits 0 and prints the \fBattach\fR command that resumes it, with the connection flags as given. \fBattach\fR of a job that already ended prints its output and exits with its status.
.TP
\fBexecutor\-client generate bash > ~/.local/share/bash\-completion/completions/executor\-client\fR
Install the bash completions (also \fBzsh\fR, \fBfish\fR; \fBman\fR prints this page).
.TP
\fBexecutor\-client \-i ~/.ssh/ci \-p 2222 \-o StrictHostKeyChecking=accept\-new \-\-target ci@build1 run \-t \-\- htop\fR
ssh flags as ssh takes them (also after the verb, as \fB\-\-target\fR, but for \fBhttp \-i\fR and \fBget\fR/\fBput\fR/\fBmkdir \-p\fR, which are theirs; \fB\-o "Key Value"\fR too); \fB\-t\fR gives the command a terminal; \fB\-v\fR shows the ssh command line run.
.TP
\fBexecutor\-client \-\-target devbox get \-r \-p logs .\fR
Copy ~/logs from devbox into ./logs, keeping modes (without \fB\-p\fR too, less the umask) and mtimes; a symlink inside stays a link with the same target (never followed).
.TP
\fBexecutor\-client \-\-target devbox put \-r \-p \-\-rw /srv/site site /srv/site/\fR
Copy ./site into /srv/site on devbox, keeping the files' modes and times and symlinks as links, writing nowhere outside /srv/site (exit 125 if asked to).
.TP
\fBtar c src | executor\-client \-\-target devbox run \-\- tar x \-C /tmp\fR
stdin is forwarded (\fB\-n\fR: /dev/null).
.TP
\fBexecutor\-client \-\-target devbox mcp stdio \-\-ro / \-\-net deny \-\- python3 server.py\fR
An MCP stdio server run on devbox, read-only and without network; name this command in an MCP client's configuration (JSON-RPC lines on stdin/stdout).
.TP
\fBexecutor\-client \-\-target devbox mcp http https://internal/mcp \-\-listen 127.0.0.1:8931 \-\-header\-env Authorization=MCP_TOKEN\fR
An MCP server only devbox reaches, served at http://127.0.0.1:8931/mcp (name that URL in an MCP client's configuration); Authorization is $MCP_TOKEN of the agent's environment on devbox, whose value never crosses the connection.
.TP
\fBexecutor\-client \-\-target devbox http \-d '{"a":1}' \-H 'Content\-Type: application/json' http://10.0.0.5/api\fR
POST from devbox's side of the network.
"#;

/// Print the man page or a completion script.
pub fn generate(kind: &str) -> anyhow::Result<()> {
    let (mut cmd, mut text) = (super::command(), Vec::new());
    match kind {
        "man" => page(cmd, &mut text)?,
        shell => {
            let shell: clap_complete::Shell = shell
                .parse()
                .map_err(|_| anyhow::anyhow!("{shell:?} is not man, bash, zsh or fish"))?;
            clap_complete::generate(shell, &mut cmd, "executor-client", &mut text);
        }
    }
    std::io::stdout().lock().write_all(&text)?;
    Ok(())
}

fn page(mut cmd: clap::Command, out: &mut Vec<u8>) -> std::io::Result<()> {
    cmd.build();
    let man = clap_mangen::Man::new(cmd.clone());
    man.render_title(out)?;
    man.render_name_section(out)?;
    man.render_synopsis_section(out)?;
    man.render_description_section(out)?;
    man.render_options_section(out)?;
    out.extend_from_slice(b".SH COMMANDS\n");
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let nested: Vec<_> = sub
            .get_subcommands()
            .filter(|n| !n.is_hide_set() && n.get_name() != "help")
            .collect();
        if nested.is_empty() {
            command(sub, sub.get_name(), out)?;
        }
        // A verb family (`mcp`): each of its verbs, named in full.
        for n in nested {
            command(n, &format!("{} {}", sub.get_name(), n.get_name()), out)?;
        }
    }
    for section in [EXIT_STATUS, ENVIRONMENT, FILES, EXAMPLES] {
        out.extend_from_slice(section.as_bytes());
    }
    man.render_version_section(out)
}

/// One command: its usage, what it does, its flags (headings as paragraphs).
fn command(sub: &clap::Command, name: &str, out: &mut Vec<u8>) -> std::io::Result<()> {
    let usage = sub
        .clone()
        .render_usage()
        .to_string()
        .trim_start_matches("Usage: ")
        .replace('-', "\\-");
    writeln!(out, ".SS \"{name}\"\n\\fB{usage}\\fR\n.PP")?;
    if let Some(about) = sub.get_long_about().or_else(|| sub.get_about()) {
        writeln!(out, "{}", about.to_string().replace('-', "\\-"))?;
    }
    // The global flags are described once, under OPTIONS.
    let mut own = sub.clone();
    let globals: Vec<String> = sub
        .get_arguments()
        .filter(|a| a.is_global_set() || a.get_id() == "help")
        .map(|a| a.get_id().to_string())
        .collect();
    for id in globals {
        own = own.mut_arg(id, |a| a.hide(true));
    }
    let mut flags = Vec::new();
    clap_mangen::Man::new(own).render_options_section(&mut flags)?;
    for line in String::from_utf8_lossy(&flags).lines() {
        match line.strip_prefix(".SH ") {
            Some("OPTIONS") => writeln!(out, ".PP")?,
            Some(heading) => writeln!(out, ".PP\n{}:", heading.trim_matches('"'))?,
            None => writeln!(out, "{line}")?,
        }
    }
    Ok(())
}
