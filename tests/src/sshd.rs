//! A real OpenSSH `sshd` on 127.0.0.1 for a test: temp host and client
//! keys, its own config and port, killed on drop.

use executor_client::SshOptions;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running sshd.
#[derive(Debug)]
pub struct Sshd {
    pub dir: PathBuf,
    pub port: u16,
    pub client_key: PathBuf,
    pub user: String,
    child: Child,
}

fn keygen(path: &Path) {
    let st = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(path)
        .status()
        .expect("ssh-keygen (apt-get install openssh-client)");
    assert!(st.success(), "ssh-keygen failed");
}

fn current_user() -> String {
    let out = Command::new("id").arg("-un").output().expect("id -un");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

impl Sshd {
    /// Start sshd. `key_prefix` goes before the client key in
    /// authorized_keys (e.g. `command="...",restrict `); `extra` is
    /// appended to sshd_config.
    pub fn start(key_prefix: &str, extra: &str) -> Sshd {
        let dir = std::env::temp_dir().join(format!(
            "executor-sshd-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let _ = std::fs::create_dir_all("/run/sshd");
        let host_key = dir.join("host_key");
        let client_key = dir.join("client_key");
        keygen(&host_key);
        keygen(&client_key);
        let pubkey = std::fs::read_to_string(dir.join("client_key.pub")).unwrap();
        std::fs::write(dir.join("authorized_keys"), format!("{key_prefix}{pubkey}")).unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let config = format!(
            "ListenAddress 127.0.0.1\nPort {port}\nHostKey {hk}\nPidFile {dir}/sshd.pid\n\
             AuthorizedKeysFile {dir}/authorized_keys\nPubkeyAuthentication yes\n\
             PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n\
             PermitRootLogin prohibit-password\nLogLevel ERROR\n{extra}\n",
            hk = host_key.display(),
            dir = dir.display(),
        );
        std::fs::write(dir.join("sshd_config"), config).unwrap();
        let child = Command::new("/usr/sbin/sshd")
            .args(["-D", "-e", "-f"])
            .arg(dir.join("sshd_config"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                std::fs::File::create(dir.join("sshd.log")).unwrap(),
            ))
            .spawn()
            .expect("start /usr/sbin/sshd (apt-get install openssh-server)");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "sshd did not start: {}",
                std::fs::read_to_string(dir.join("sshd.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Sshd {
            dir,
            port,
            client_key,
            user: current_user(),
            child,
        }
    }

    /// Client options for this server (no host key check: a test server).
    pub fn options(&self, remote_command: &Path) -> SshOptions {
        SshOptions {
            user: Some(self.user.clone()),
            port: Some(self.port),
            identity: Some(self.client_key.clone()),
            options: self.ssh_o_options(),
            remote_command: remote_command.to_string_lossy().into_owned(),
            ..SshOptions::default()
        }
    }

    /// Options for the native (russh) transport to this sshd running
    /// `remote_command`: its host key the only known host (written to
    /// `native_known_hosts` in its directory).
    pub fn native_options(
        &self,
        remote_command: &Path,
    ) -> executor_client::native_ssh::NativeSshOptions {
        let host_pub = std::fs::read_to_string(self.dir.join("host_key.pub")).expect("host key");
        let mut fields = host_pub.split_whitespace();
        let (kind, key) = (fields.next().expect("type"), fields.next().expect("key"));
        let known = self.dir.join("native_known_hosts");
        std::fs::write(&known, format!("[127.0.0.1]:{} {kind} {key}\n", self.port))
            .expect("write known_hosts");
        executor_client::native_ssh::NativeSshOptions {
            user: self.user.clone(),
            port: self.port,
            identity: self.client_key.clone(),
            known_hosts: Some(known),
            remote_command: remote_command.to_string_lossy().into_owned(),
            subsystem: false,
        }
    }

    /// The `-o` options every test connection uses.
    pub fn ssh_o_options(&self) -> Vec<String> {
        vec![
            "StrictHostKeyChecking=no".into(),
            format!(
                "UserKnownHostsFile={}",
                self.dir.join("known_hosts").display()
            ),
            "BatchMode=yes".into(),
            "LogLevel=ERROR".into(),
        ]
    }

    /// A plain `ssh` command to this server running `remote`.
    pub fn ssh(&self, remote: &str) -> Command {
        self.ssh_with(&[], remote)
    }

    /// `ssh` with extra `-o` options (before the destination).
    pub fn ssh_with(&self, extra_o: &[&str], remote: &str) -> Command {
        let mut c = Command::new("ssh");
        c.arg("-T")
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-i")
            .arg(&self.client_key);
        for o in self.ssh_o_options() {
            c.arg("-o").arg(o);
        }
        for o in extra_o {
            c.arg("-o").arg(o);
        }
        c.arg(format!("{}@127.0.0.1", self.user)).arg(remote);
        c
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
