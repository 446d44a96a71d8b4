//! A request's sandbox roots as the agent's own fs requests and the
//! profile's narrowing see them: a root is opened without following a
//! symlink swapped in after the policy resolved it, and the links on the
//! way to a profile's carve-outs survive a request's narrower intent.

use executor_agent::config::Profile;
use executor_agent::fs::confine::{Confinement, Open};
use executor_agent::sandbox_gate::effective_policy;
use executor_protocol::types::fs::Scoped;
use executor_protocol::types::sandbox::{FilesystemIntent, ReadRoots, SandboxIntent};
use executor_protocol::WirePath;
use std::path::{Path, PathBuf};

struct Req(SandboxIntent);

impl Scoped for Req {
    fn sandbox(&self) -> Option<&SandboxIntent> {
        Some(&self.0)
    }
    fn cwd(&self) -> Option<&WirePath> {
        None
    }
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("agent-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::canonicalize(d).unwrap()
}

fn writing(w: &Path) -> SandboxIntent {
    SandboxIntent {
        filesystem: FilesystemIntent {
            read: ReadRoots::Paths(vec!["/usr".into()]),
            write: vec![w.to_str().unwrap().into()],
            ..Default::default()
        },
        ..Default::default()
    }
}

// A profile may write `ws`; the request writes `ws/sub`. A job allowed to
// write `ws` swaps `ws/sub` for a link to a directory outside after the
// policy was resolved: the request's root is not followed there (it
// listed the outside directory). Control: with `sub` in place it resolves.
#[test]
fn a_root_swapped_after_the_policy_is_not_followed() {
    let d = scratch("swapped-root");
    let (ws, outside) = (d.join("ws"), d.join("outside"));
    std::fs::create_dir_all(ws.join("sub")).unwrap();
    std::fs::create_dir_all(outside.join("sub")).unwrap();
    let sub = ws.join("sub");
    let profile = Profile {
        sandbox: Some(writing(&ws)),
        ..Default::default()
    };
    let c = Confinement::of(&profile, &Req(writing(&sub)))
        .unwrap()
        .unwrap();
    let r = c.resolve(&sub, Open::read(true)).expect("control");
    assert_eq!(r.path, sub);
    std::fs::rename(&sub, ws.join("sub-parked")).unwrap();
    std::os::unix::fs::symlink(outside.join("sub"), &sub).unwrap();
    let err = c.resolve(&sub, Open::read(true)).unwrap_err();
    assert!(err.to_string().contains("sandbox root"), "{err}");
    let _ = std::fs::remove_dir_all(&d);
}

// A profile's carve-out named through a link (`.git` -> `.gitdir`): the
// link is pinned with or without a request's own, narrower intent.
#[test]
fn a_profiles_carve_out_links_survive_narrowing() {
    let d = scratch("narrow-links");
    let ws = d.join("ws");
    std::fs::create_dir_all(ws.join(".gitdir/hooks")).unwrap();
    std::os::unix::fs::symlink(".gitdir", ws.join(".git")).unwrap();
    let mut intent = writing(&ws);
    intent.filesystem.read = ReadRoots::All;
    intent.filesystem.deny_write = vec![ws.join(".git/hooks").to_str().unwrap().into()];
    let profile = Profile {
        sandbox: Some(intent.clone()),
        ..Default::default()
    };
    let links = |p: &executor_sandbox::policy::Policy| -> Vec<PathBuf> {
        p.carve_out_links.iter().map(|c| c.path.clone()).collect()
    };
    let alone = effective_policy(None, None, "sandbox", &profile)
        .unwrap()
        .unwrap();
    assert_eq!(links(&alone), vec![ws.join(".git")]);
    let mut req = intent;
    req.filesystem.deny_write.clear();
    let narrowed = effective_policy(Some(&req), None, "sandbox", &profile)
        .unwrap()
        .unwrap();
    assert_eq!(links(&narrowed), vec![ws.join(".git")]);
    assert_eq!(narrowed.deny_write, vec![ws.join(".gitdir/hooks")]);
    let _ = std::fs::remove_dir_all(&d);
}
