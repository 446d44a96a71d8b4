//! Golden tests of the Seatbelt profile generator. Regenerate after an
//! intended change with `UPDATE_GOLDEN=1 cargo test -p executor-sandbox`.

use executor_protocol::types::sandbox::NetworkIntent;
use executor_sandbox::policy::{Checked, Policy, Root};
use executor_sandbox::seatbelt::{command_line, profile};
use std::path::{Path, PathBuf};

fn check(name: &str, got: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{name}.sb"));
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, got).unwrap();
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|_| panic!("missing golden {}", path.display()));
    assert_eq!(got, want, "profile {name} differs from its golden file");
}

fn p(s: &str) -> Root {
    Root::Path(Checked::unchecked(s))
}

#[test]
fn read_only() {
    let policy = Policy {
        read: Some(vec![p("/usr"), p("/Users/dev/project")]),
        write: vec![],
        deny_read: vec![],
        deny_write: vec![],
        network: NetworkIntent::Deny,
        required: true,
        links: vec![],
        carve_out_links: vec![],
    };
    let sb = profile(&policy, None).unwrap();
    assert!(!sb.contains("(allow file-write*"), "no write rule at all");
    assert!(!sb.contains("network"));
    check("read_only", &sb);
}

#[test]
fn workspace_write_with_git_denied() {
    let policy = Policy {
        read: None,
        write: vec![p("/Users/dev/project"), Root::Tmp],
        deny_read: vec![],
        deny_write: vec![PathBuf::from("/Users/dev/project/.git")],
        network: NetworkIntent::Deny,
        required: true,
        links: vec![],
        carve_out_links: vec![],
    };
    let sb = profile(&policy, Some(Path::new("/var/folders/xy/T/job-1"))).unwrap();
    // The carve-out comes after the allow (later rules win in SBPL).
    let allow = sb.find("(allow file-write*").unwrap();
    let deny = sb
        .find("(deny file-write* (subpath \"/Users/dev/project/.git\"))")
        .unwrap();
    assert!(deny > allow);
    assert!(
        sb.contains("(subpath \"/private/var/folders/xy/T/job-1\")"),
        "/var is /private/var"
    );
    assert!(
        sb.contains("(literal \"/Users/dev/project\")"),
        "the parent cannot be renamed away"
    );
    check("workspace_write_git_denied", &sb);
}

#[test]
fn network_allowed_and_port_lists() {
    let mut policy = Policy {
        read: None,
        write: vec![p("/tmp/build")],
        deny_read: vec![],
        deny_write: vec![],
        network: NetworkIntent::Allow,
        required: true,
        links: vec![],
        carve_out_links: vec![],
    };
    let sb = profile(&policy, None).unwrap();
    assert!(sb.contains("(allow network-outbound)"));
    assert!(sb.contains("(subpath \"/private/tmp/build\")"));
    check("network_allowed", &sb);
    policy.network = NetworkIntent::AllowTcpConnect(vec![443, 8080]);
    let sb = profile(&policy, None).unwrap();
    assert!(sb.contains("(remote tcp \"*:443\")") && sb.contains("(remote tcp \"*:8080\")"));
    assert!(!sb.contains("network-inbound"));
    check("tcp_ports", &sb);
}

#[test]
fn paths_needing_quoting() {
    let policy = Policy {
        read: Some(vec![
            p("/Users/dev/My \"quoted\" dir"),
            p("/Users/dev/back\\slash"),
        ]),
        write: vec![p("/Users/dev/with space")],
        deny_read: vec![PathBuf::from("/Users/dev/with space/secret \"keys\"")],
        deny_write: vec![],
        network: NetworkIntent::Deny,
        required: true,
        links: vec![],
        carve_out_links: vec![],
    };
    let sb = profile(&policy, None).unwrap();
    assert!(sb.contains(r#"(subpath "/Users/dev/My \"quoted\" dir")"#));
    assert!(sb.contains(r#"(subpath "/Users/dev/back\\slash")"#));
    check("quoting", &sb);
    // Not UTF-8: refused, never mangled.
    use std::os::unix::ffi::OsStrExt;
    let bad = Policy {
        write: vec![Root::Path(Checked::unchecked(std::ffi::OsStr::from_bytes(
            b"/x/\xff",
        )))],
        ..policy
    };
    assert!(profile(&bad, None).is_err());
    // :tmp without a temp dir is an error, not an empty rule.
    let tmp = Policy {
        read: None,
        write: vec![Root::Tmp],
        deny_read: vec![],
        deny_write: vec![],
        network: NetworkIntent::Deny,
        required: true,
        links: vec![],
        carve_out_links: vec![],
    };
    assert!(profile(&tmp, None).is_err());
    let cl = command_line("(version 1)", &["/bin/ls".into(), "-l".into()]);
    assert_eq!(
        cl,
        vec![
            "/usr/bin/sandbox-exec",
            "-p",
            "(version 1)",
            "--",
            "/bin/ls",
            "-l"
        ]
    );
}
