//! `ssh devbox executor` against a real OpenSSH sshd on 127.0.0.1.

use executor_client::{Client, ClientOptions};
use executor_protocol::types::process::ProcessStartParams;
use executor_tests::sshd::Sshd;
use executor_tests::*;

use executor_tests::path_env as env;

/// What every transport must do: initialize, run, stream a file.
async fn exercise(c: &Client) {
    assert_eq!(c.initialize_result().protocol_version, 1);
    let mut p = ProcessStartParams::new(
        vec!["sh".into(), "-c".into(), "echo over-ssh; exit 5".into()],
        "/",
        env(),
    );
    p.tag = Some("ssh".into());
    let mut proc = c.start(&p).await.unwrap();
    let mut out = Vec::new();
    while let Some(ch) = proc.next_output().await.unwrap() {
        out.extend_from_slice(&ch.data);
    }
    assert_eq!(out, b"over-ssh\n");
    assert_eq!(proc.exit_status().unwrap().code, Some(5));
    let dir = std::env::temp_dir().join(format!("executor-ssh-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 241) as u8).collect();
    let f = dir.join("data");
    c.write_stream(f.to_str().unwrap(), &data[..], None)
        .await
        .unwrap();
    let (_, s) = c.read_stream(f.to_str().unwrap()).await.unwrap();
    use futures_util::StreamExt;
    let got: Vec<u8> = s
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .flat_map(|b| b.unwrap().to_vec())
        .collect();
    assert_eq!(got, data);
}

#[tokio::test]
async fn exec_mode() {
    let (_sshd, c) = crate::transports::openssh().await;
    exercise(&c).await;
    // SSH_CLIENT shows it really went through sshd.
    let info = c
        .call(&executor_protocol::types::session::EnvironmentInfoParams {})
        .await
        .unwrap();
    assert!(!info.user.is_empty());
    c.close().await.unwrap();
}

#[tokio::test]
async fn subsystem_mode() {
    let sshd = Sshd::start(
        "",
        &format!("Subsystem executor {}", executor_bin().display()),
    );
    let mut opts = sshd.options(std::path::Path::new("executor"));
    opts.subsystem = true;
    let c = Client::connect_target(
        &executor_client::Target::ssh_with("127.0.0.1", opts.clone()),
        ClientOptions::default(),
    )
    .await
    .expect("subsystem");
    exercise(&c).await;
    c.close().await.unwrap();
}

#[tokio::test]
async fn forced_command_accepts_the_executor_and_refuses_anything_else() {
    let prefix = format!("command=\"{}\",restrict ", executor_bin().display());
    let sshd = Sshd::start(&prefix, "");
    // Allowed: the client asks for `executor`.
    let c = Client::connect_target(
        &executor_client::Target::ssh_with(
            "127.0.0.1",
            sshd.options(std::path::Path::new("executor")),
        ),
        ClientOptions::default(),
    )
    .await
    .expect("forced command serves the executor");
    exercise(&c).await;
    c.close().await.unwrap();
    // `--version` is allowed too.
    let out = sshd.ssh("executor --version").output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("executor "));
    // Anything else: refused, with a message, non-zero, nothing run.
    let marker = std::env::temp_dir().join(format!("executor-forced-{}", std::process::id()));
    let out = sshd
        .ssh(&format!("touch {}", marker.display()))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("may only run the executor"), "{err}");
    assert!(!marker.exists(), "the refused command did not run");
    let out = sshd.ssh("executor --config /tmp/x").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[tokio::test]
async fn login_shell_noise_before_the_preamble_is_skipped() {
    // Output before the agent starts, as a user's .bashrc or a motd script
    // produces it: here the remote side prints a banner, then runs us.
    let prefix = format!(
        "command=\"echo 'Welcome to devbox! Last login: yesterday'; echo motd; exec {}\",restrict ",
        executor_bin().display()
    );
    let sshd = Sshd::start(&prefix, "");
    let out = sshd.ssh("executor --version").output().unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("Welcome to devbox"),
        "the banner is really there"
    );
    let c = Client::connect_target(
        &executor_client::Target::ssh_with(
            "127.0.0.1",
            sshd.options(std::path::Path::new("executor")),
        ),
        ClientOptions::default(),
    )
    .await
    .expect("banner skipped");
    exercise(&c).await;
    c.close().await.unwrap();
}

/// A dist folder with this machine's agent as `<os>-<arch>/executor`.
fn dist_with_agent(tag: &str) -> std::path::PathBuf {
    let dist = unique_tempdir(tag);
    let platform = format!("{}-{}", std::env::consts::OS, std::env::consts::ARCH);
    std::fs::create_dir_all(dist.join(&platform)).unwrap();
    std::fs::copy(executor_bin(), dist.join(&platform).join("executor")).unwrap();
    dist
}

#[tokio::test]
async fn bootstrap_installs_the_agent_over_ssh_and_it_then_serves() {
    use executor_client::bootstrap::bootstrap;
    let sshd = Sshd::start("", "");
    let dist = dist_with_agent("bootstrap-dist");
    let remote = unique_tempdir("bootstrap-remote");
    let opts = sshd.options(std::path::Path::new("executor"));
    // A host without the agent: connecting fails.
    let mut missing = opts.clone();
    missing.remote_command = remote.join("nothing/executor").to_string_lossy().into();
    assert!(Client::connect_target(
        &executor_client::Target::ssh_with("127.0.0.1", missing.clone()),
        ClientOptions::default()
    )
    .await
    .is_err());
    let installed = bootstrap("127.0.0.1", &opts, &dist, Some(remote.to_str().unwrap()))
        .await
        .expect("bootstrap");
    let version = env!("CARGO_PKG_VERSION");
    let expected = remote.join(version).join("executor");
    assert_eq!(installed.path, expected.to_str().unwrap());
    assert!(
        installed.version_line.starts_with("executor "),
        "{installed:?}"
    );
    assert_eq!(
        std::fs::read(&expected).unwrap(),
        std::fs::read(executor_bin()).unwrap()
    );
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&expected).unwrap().permissions().mode() & 0o777,
        0o755
    );
    // No temporary file left behind.
    let names: Vec<_> = std::fs::read_dir(remote.join(version))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["executor"]);
    // And it serves.
    let mut served = opts.clone();
    served.remote_command = installed.path.clone();
    let c = Client::connect_target(
        &executor_client::Target::ssh_with("127.0.0.1", served.clone()),
        ClientOptions::default(),
    )
    .await
    .expect("the installed agent serves");
    exercise(&c).await;
    c.close().await.unwrap();
}

#[tokio::test]
async fn a_corrupted_upload_is_detected_on_the_host_and_not_installed() {
    use executor_client::bootstrap::{install_with, BootstrapError};
    let sshd = Sshd::start("", "");
    let remote = unique_tempdir("bootstrap-corrupt");
    let opts = sshd.options(std::path::Path::new("executor"));
    let good = std::fs::read(executor_bin()).unwrap();
    let e = install_with("127.0.0.1", &opts, Some(remote.to_str().unwrap()), |_| {
        // The digest of the real binary, and bytes damaged in transit.
        let digest: String = ring::digest::digest(&ring::digest::SHA256, &good)
            .as_ref()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let mut damaged = good.clone();
        damaged[1000] ^= 0x40;
        Ok((damaged, digest))
    })
    .await
    .unwrap_err();
    assert!(matches!(e, BootstrapError::ChecksumMismatch(_)), "{e}");
    assert!(e.to_string().contains("nothing installed"), "{e}");
    let dir = remote.join(env!("CARGO_PKG_VERSION"));
    let left: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left on the host: {left:?}");
}

#[tokio::test]
async fn bootstrap_under_a_forced_command_is_refused_saying_why() {
    use executor_client::bootstrap::{bootstrap, BootstrapError};
    let prefix = format!("command=\"{}\",restrict ", executor_bin().display());
    let sshd = Sshd::start(&prefix, "");
    let dist = dist_with_agent("bootstrap-forced");
    let remote = unique_tempdir("bootstrap-forced-remote");
    let e = bootstrap(
        "127.0.0.1",
        &sshd.options(std::path::Path::new("executor")),
        &dist,
        Some(remote.to_str().unwrap()),
    )
    .await
    .unwrap_err();
    assert!(matches!(e, BootstrapError::ForcedCommand), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("forced command"), "{msg}");
    // One sentence: not the installer script the agent refused.
    assert!(!msg.contains('\n') && !msg.contains("uname"), "{msg}");
    assert!(std::fs::read_dir(&remote).unwrap().next().is_none());
}

#[tokio::test]
async fn the_native_russh_transport_verifies_host_keys_against_known_hosts() {
    use executor_client::native_ssh::NativeSshOptions;
    let sshd = Sshd::start("", "");
    let host_pub = std::fs::read_to_string(sshd.dir.join("host_key.pub")).unwrap();
    let mut fields = host_pub.split_whitespace();
    let (kind, key) = (fields.next().unwrap(), fields.next().unwrap());
    let known = sshd.dir.join("native_known_hosts");
    let opts = NativeSshOptions {
        user: sshd.user.clone(),
        port: sshd.port,
        identity: sshd.client_key.clone(),
        known_hosts: Some(known.clone()),
        remote_command: executor_bin().to_string_lossy().into_owned(),
        subsystem: false,
    };
    // Unknown host: refused.
    std::fs::write(&known, "").unwrap();
    let e = Client::connect_native_ssh("127.0.0.1", &opts, ClientOptions::default())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("is not in"), "{e}");
    // A changed key: refused, loudly.
    let other = sshd.dir.join("other_key");
    let st = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&other)
        .status()
        .unwrap();
    assert!(st.success());
    let other_pub = std::fs::read_to_string(other.with_extension("pub")).unwrap();
    let other_key = other_pub.split_whitespace().nth(1).unwrap();
    std::fs::write(
        &known,
        format!("[127.0.0.1]:{} {kind} {other_key}\n", sshd.port),
    )
    .unwrap();
    let e = Client::connect_native_ssh("127.0.0.1", &opts, ClientOptions::default())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("CHANGED"), "{e}");
    // The right key: it connects and works like any transport.
    std::fs::write(&known, format!("[127.0.0.1]:{} {kind} {key}\n", sshd.port)).unwrap();
    let c = Client::connect_native_ssh("127.0.0.1", &opts, ClientOptions::default())
        .await
        .expect("native ssh");
    exercise(&c).await;
    c.close().await.unwrap();
}

#[tokio::test]
async fn a_forced_command_with_a_profile_limits_what_the_key_may_do() {
    let dir = unique_tempdir("forced-profile");
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        "[profiles.reader]\nmethods.allow = [\"fs/readFile\", \"fs/stat\"]\n",
    )
    .unwrap();
    let prefix = format!(
        "command=\"{} --config {} --profile reader\",restrict ",
        executor_bin().display(),
        config.display()
    );
    let sshd = Sshd::start(&prefix, "");
    let c = Client::connect_target(
        &executor_client::Target::ssh_with(
            "127.0.0.1",
            sshd.options(std::path::Path::new("executor")),
        ),
        ClientOptions::default(),
    )
    .await
    .expect("the forced command serves");
    assert_eq!(c.initialize_result().methods, ["fs/stat", "fs/readFile"]);
    let f = dir.join("f");
    std::fs::write(&f, b"readable").unwrap();
    assert_eq!(c.read_file(f.to_str().unwrap()).await.unwrap(), b"readable");
    let e = c
        .start(&ProcessStartParams::new(vec!["true".into()], "/", env()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(executor_client::ErrorCode::PolicyDenied));
    c.close().await.unwrap();
}

#[tokio::test]
async fn connect_ssh_bootstrapping_installs_a_missing_agent_then_connects() {
    let sshd = Sshd::start("", "");
    let dist = dist_with_agent("autoboot-dist");
    let remote = unique_tempdir("autoboot-remote");
    let mut opts = sshd.options(std::path::Path::new("executor"));
    // Nothing at the remote command: the first connection fails.
    opts.remote_command = remote.join("missing/executor").to_string_lossy().into();
    let (c, installed) = Client::connect_ssh_bootstrapping(
        "127.0.0.1",
        &opts,
        ClientOptions::default(),
        &dist,
        Some(remote.to_str().unwrap()),
    )
    .await
    .expect("bootstrap and connect");
    let installed = installed.expect("it had to install");
    assert!(installed.path.starts_with(remote.to_str().unwrap()));
    exercise(&c).await;
    c.close().await.unwrap();
    // An agent of this version already there: used as it is.
    let mut present = opts.clone();
    present.remote_command = installed.path.clone();
    let (c, again) = Client::connect_ssh_bootstrapping(
        "127.0.0.1",
        &present,
        ClientOptions::default(),
        &dist,
        Some(remote.to_str().unwrap()),
    )
    .await
    .unwrap();
    assert!(again.is_none(), "nothing to install");
    c.close().await.unwrap();
}
