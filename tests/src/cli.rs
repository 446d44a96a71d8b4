//! The `executor-client` binary as a user runs it, locally or through a
//! real sshd ([`Via`]).

use crate::sshd::Sshd;
use std::process::{Command, Output, Stdio};

/// The `executor-client` built by this workspace.
pub fn client_bin() -> std::path::PathBuf {
    crate::executor_bin().with_file_name("executor-client")
}

/// How a test reaches the agent.
#[derive(Debug)]
pub enum Via {
    /// The local agent next to the client.
    Local,
    /// The test sshd on 127.0.0.1, with its key and options as flags.
    Ssh(Sshd),
}

impl Via {
    /// Both: locally, then over a fresh sshd.
    pub fn both() -> [Via; 2] {
        [Via::Local, Via::Ssh(Sshd::start("", ""))]
    }

    pub fn name(&self) -> &'static str {
        match self {
            Via::Local => "local",
            Via::Ssh(_) => "ssh",
        }
    }

    /// The connection flags (before the verb).
    pub fn flags(&self) -> Vec<String> {
        match self {
            Via::Local => vec!["--target".into(), "local".into()],
            Via::Ssh(sshd) => ssh_flags(sshd, &crate::executor_bin().to_string_lossy()),
        }
    }

    /// `executor-client FLAGS args…`, stdin from /dev/null.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(client_bin());
        c.args(self.flags()).args(args).stdin(Stdio::null());
        c.env("RUST_BACKTRACE", "0").env_remove("EXECUTOR_TARGET");
        c
    }

    /// Run to the end.
    pub fn output(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("run executor-client")
    }
}

/// `-i -p -l -o… --remote-command REMOTE --target 127.0.0.1` for `sshd`.
pub fn ssh_flags(sshd: &Sshd, remote: &str) -> Vec<String> {
    let mut f = vec![
        "-i".to_string(),
        sshd.client_key.to_string_lossy().into_owned(),
        "-p".into(),
        sshd.port.to_string(),
        "-l".into(),
        sshd.user.clone(),
    ];
    for o in sshd.ssh_o_options() {
        f.push("-o".into());
        f.push(o);
    }
    f.extend([
        "--remote-command".into(),
        remote.into(),
        "--target".into(),
        "127.0.0.1".into(),
    ]);
    f
}

/// stdout and stderr of `out`, for messages.
pub fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The names in `dir`, sorted.
pub fn listing(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Wait up to `within` for `cond`.
pub fn wait_for(within: std::time::Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + within;
    while std::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    cond()
}

/// Send `sig` to `child`.
pub fn signal(child: &std::process::Child, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), sig).expect("kill");
}

/// A one-answer-per-connection HTTP server on 127.0.0.1 (`200 ok`).
pub fn tiny_http_server() -> u16 {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let _ = conn
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
        }
    });
    port
}
