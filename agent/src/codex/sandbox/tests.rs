use super::*;
use serde_json::json;

/// A captured Codex request (tests/fixtures/codex/), its `sandbox`.
fn fixture(name: &str) -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/codex")
        .join(format!("sandbox_{name}.json"));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    v
}

const WS: &str = "/home/user/workspace";

fn host() -> Host<'static> {
    Host {
        tmpdir: Some(Path::new("/var/tmp/user")),
    }
}

fn go(sandbox: &Value) -> R<Option<SandboxIntent>> {
    translate(sandbox, NetworkRequest::default(), Path::new(WS), host())
}

fn paths(v: &[WirePath]) -> Vec<String> {
    v.iter().map(|p| p.display()).collect()
}

/// The protected metadata names under each writable root, in order.
fn meta(roots: &[&str]) -> Vec<String> {
    roots
        .iter()
        .flat_map(|r| PROTECTED_METADATA.map(|n| format!("{r}/{n}")))
        .collect()
}

fn reads(i: &SandboxIntent) -> Option<Vec<String>> {
    match &i.filesystem.read {
        ReadRoots::All => None,
        ReadRoots::Paths(p) => Some(paths(p)),
    }
}

/// `codex exec --sandbox read-only`: read everything, write nothing, no
/// network, the workspace as the request's workspace root.
#[test]
fn the_captured_read_only_shape() {
    let f = fixture("read_only.process_start");
    let i = go(&f["sandbox"]).unwrap().unwrap();
    assert_eq!(reads(&i), None);
    assert!(i.filesystem.write.is_empty());
    assert!(i.filesystem.deny_read.is_empty() && i.filesystem.deny_write.is_empty());
    assert_eq!(i.network, NetworkIntent::Deny);
    assert!(i.required);
    assert_eq!(i.workspace_roots, Some(vec![WS.into()]));
}

/// `--sandbox workspace-write`: the workspace, /tmp and $TMPDIR writable
/// (each skipped when missing), `.git`, `.agents`, `.codex`, `.aws` under
/// the workspace read-only (the request's entries; the protected
/// metadata names are among them; none under the shared /tmp and
/// $TMPDIR); the same for `fs/writeFile`'s sandbox (with
/// `policyContext` and `userHomeDir`).
#[test]
fn the_captured_workspace_write_shapes() {
    for name in [
        "workspace_write.process_start",
        "workspace_write.fs_write_file",
    ] {
        let f = fixture(name);
        let i = go(&f["sandbox"]).unwrap().unwrap();
        assert_eq!(reads(&i), None, "{name}");
        assert_eq!(
            paths(&i.filesystem.write),
            ["?:workspace_roots", "?/tmp", "?/var/tmp/user"],
            "{name}"
        );
        assert_eq!(
            paths(&i.filesystem.deny_write),
            [".git", ".agents", ".codex", ".aws"].map(|d| format!("{WS}/{d}")),
            "{name}"
        );
        assert!(i.filesystem.deny_read.is_empty());
        assert_eq!(i.network, NetworkIntent::Deny, "{name}");
        assert_eq!(i.workspace_roots, Some(vec![WS.into()]));
    }
    // Without $TMPDIR, `tmpdir` grants nothing.
    let f = fixture("workspace_write.process_start");
    let i = translate(
        &f["sandbox"],
        NetworkRequest::default(),
        Path::new(WS),
        Host::default(),
    )
    .unwrap()
    .unwrap();
    assert_eq!(paths(&i.filesystem.write), ["?:workspace_roots", "?/tmp"]);
    // With network access: the host's network.
    let f = fixture("workspace_write_network.process_start");
    let i = go(&f["sandbox"]).unwrap().unwrap();
    assert_eq!(i.network, NetworkIntent::Allow);
}

/// `--sandbox danger-full-access` sends no sandbox: no intent.
#[test]
fn the_captured_full_access_shapes() {
    for name in [
        "danger_full_access.process_start",
        "danger_full_access.fs_write_file",
    ] {
        let f = fixture(name);
        assert_eq!(go(&f["sandbox"]).unwrap(), None, "{name}");
    }
}

fn managed(entries: Value) -> Value {
    json!({
        "permissions": {"type": "managed",
                        "file_system": {"type": "restricted", "entries": entries},
                        "network": "restricted"},
        "cwd": format!("file://{WS}"),
        "workspaceRoots": [format!("file://{WS}")],
        "windowsSandboxLevel": "disabled",
        "useLegacyLandlock": false
    })
}

fn sp(kind: &str) -> Value {
    json!({"type": "special", "value": {"kind": kind}})
}

fn entry(path: Value, access: &str) -> Value {
    json!({"path": path, "access": access})
}

#[test]
fn every_kind_of_entry() {
    let i = go(&managed(json!([
        entry(sp("minimal"), "read"),
        entry(sp("current_working_directory"), "write"),
        entry(
            json!({"type": "path", "path": "file:///opt/tool%20s"}),
            "read"
        ),
        entry(
            json!({"type": "path", "path": "file:///srv/secret"}),
            "deny"
        ),
        entry(json!({"type": "path", "path": "file:///srv/other"}), "none"),
        entry(
            json!({"type": "special", "value": {"kind": "project_roots", "subpath": "out"}}),
            "write"
        ),
        entry(
            json!({"type": "special", "value": {"kind": "project_roots", "subpath": "out/keep"}}),
            "read"
        ),
        entry(
            json!({"type": "special", "value": {"kind": "unknown", "path": ":future"}}),
            "read"
        ),
        entry(sp("slash_tmp"), "write"),
    ])))
    .unwrap()
    .unwrap();
    assert_eq!(
        reads(&i),
        Some(vec![
            ":minimal".into(),
            "?/opt/tool s".into(),
            "?:workspace_roots/out/keep".into()
        ])
    );
    assert_eq!(
        paths(&i.filesystem.write),
        [
            format!("?{WS}"),
            "?:workspace_roots/out".into(),
            "?/tmp".into()
        ]
    );
    assert_eq!(
        paths(&i.filesystem.deny_read),
        ["/srv/secret", "/srv/other"]
    );
    let mut want = vec![format!("{WS}/out/keep")];
    want.extend(meta(&[WS, &format!("{WS}/out")]));
    assert_eq!(paths(&i.filesystem.deny_write), want);
    // A path `/` written is the root.
    let i = go(&managed(json!([entry(
        json!({"type": "path", "path": "file:///"}),
        "write"
    )])))
    .unwrap()
    .unwrap();
    assert_eq!(
        (reads(&i), paths(&i.filesystem.write)),
        (None, vec!["/".into()])
    );
    // `root` write: read everything, write `/`; `root` deny: only the
    // other grants.
    let i = go(&managed(json!([entry(sp("root"), "write")])))
        .unwrap()
        .unwrap();
    assert_eq!(
        (reads(&i), paths(&i.filesystem.write)),
        (None, vec!["/".into()])
    );
    let i = go(&managed(json!([
        entry(sp("root"), "deny"),
        entry(sp("minimal"), "read")
    ])))
    .unwrap()
    .unwrap();
    assert_eq!(reads(&i), Some(vec![":minimal".into()]));
    // An empty entry list: nothing readable (the reference's job then
    // cannot even exec its shell).
    let i = go(&managed(json!([]))).unwrap().unwrap();
    assert_eq!(reads(&i), Some(vec![]));
    // `tmpdir` is the job's TMPDIR, not the sandbox's
    // `temporaryDirectories` (which grant nothing).
    let mut s = managed(json!([entry(sp("tmpdir"), "write")]));
    s["temporaryDirectories"] = json!(["file:///scratch/t"]);
    let i = go(&s).unwrap().unwrap();
    assert_eq!(paths(&i.filesystem.write), ["?/var/tmp/user"]);
    // Project roots without workspace roots grant nothing (as the
    // reference: no fallback to the cwd).
    let mut s = managed(json!([entry(sp("project_roots"), "write")]));
    s["workspaceRoots"] = json!([]);
    let i = go(&s).unwrap().unwrap();
    assert!(i.filesystem.write.is_empty());
    assert_eq!(i.workspace_roots, None);
}

/// The more specific entry wins: a read below any write (a path below
/// the workspace, the workspace below a writable /tmp) is read-only; a
/// write of the same place wins over a read of it.
#[test]
fn a_read_below_a_write_is_read_only() {
    let i = go(&managed(json!([
        entry(sp("project_roots"), "write"),
        entry(
            json!({"type": "path", "path": format!("file://{WS}/.git")}),
            "read"
        ),
        entry(
            json!({"type": "path", "path": "file:///home/user/other"}),
            "read"
        ),
    ])))
    .unwrap()
    .unwrap();
    assert_eq!(paths(&i.filesystem.deny_write), meta(&[WS]));
    let i = go(&managed(json!([
        entry(json!({"type": "path", "path": "file:///home"}), "write"),
        entry(sp("project_roots"), "read"),
    ])))
    .unwrap()
    .unwrap();
    let mut want = vec![WS.to_string()];
    want.extend(meta(&["/home"]));
    assert_eq!(paths(&i.filesystem.deny_write), want);
    let i = go(&managed(json!([
        entry(json!({"type": "path", "path": "file:///home"}), "write"),
        entry(sp("project_roots"), "read"),
        entry(sp("project_roots"), "write"),
    ])))
    .unwrap()
    .unwrap();
    assert_eq!(paths(&i.filesystem.deny_write), meta(&["/home", WS]));
}

/// `.git`, `.agents`, `.codex` stay read-only under every writable root
/// but the whole disk and the shared temporary directories, created or not, unless a write entry names the
/// place itself (a write of the root around it does not).
#[test]
fn protected_metadata_under_every_writable_root() {
    let i = go(&managed(json!([
        entry(sp("root"), "read"),
        entry(json!({"type": "path", "path": "file:///srv/a"}), "write"),
        entry(
            json!({"type": "path", "path": "file:///srv/a/.git"}),
            "write"
        ),
        entry(sp("tmpdir"), "write"),
    ])))
    .unwrap()
    .unwrap();
    let mut want = vec!["/srv/a/.agents".to_string(), "/srv/a/.codex".into()];
    want.extend(meta(&["/srv/a/.git"]));
    assert_eq!(paths(&i.filesystem.deny_write), want);
    // The whole disk writable: nothing carved (Codex's full access).
    for whole in [sp("root"), json!({"type": "path", "path": "file:///"})] {
        let i = go(&managed(json!([entry(whole, "write")])))
            .unwrap()
            .unwrap();
        assert!(i.filesystem.deny_write.is_empty());
    }
    // Read-only: nothing to protect.
    let i = go(&managed(json!([entry(sp("root"), "read")])))
        .unwrap()
        .unwrap();
    assert!(i.filesystem.deny_write.is_empty());
}

#[test]
fn unrestricted_disabled_and_external() {
    let mut s = managed(json!([]));
    s["permissions"]["file_system"] = json!({"type": "unrestricted"});
    let i = go(&s).unwrap().unwrap();
    assert_eq!(
        (reads(&i), paths(&i.filesystem.write), &i.network),
        (None, vec!["/".into()], &NetworkIntent::Deny)
    );
    s["permissions"]["network"] = json!("enabled");
    assert_eq!(go(&s).unwrap().unwrap().network, NetworkIntent::Allow);
    let mut d = managed(json!([]));
    d["permissions"] = json!({"type": "disabled"});
    assert_eq!(go(&d).unwrap(), None);
    // Disabled but the network managed: fail closed.
    let n = NetworkRequest {
        enforce_managed: true,
        ..Default::default()
    };
    let i = translate(&d, n, Path::new(WS), host()).unwrap().unwrap();
    assert_eq!((reads(&i), &i.network), (None, &NetworkIntent::Deny));
    let i = translate(&Value::Null, n, Path::new(WS), host())
        .unwrap()
        .unwrap();
    assert_eq!(i.network, NetworkIntent::Deny);
    // A proxy's rules apply even without enforcement: never the host's
    // whole network when a proxy was asked for.
    let p = proxy(json!({"pypi.org": "allow"}));
    let n = NetworkRequest {
        proxy: Some(&p),
        ..Default::default()
    };
    let i = translate(&Value::Null, n, Path::new(WS), host())
        .unwrap()
        .unwrap();
    let NetworkIntent::AllowHosts(e) = &i.network else {
        panic!("{:?}", i.network)
    };
    assert_eq!(e.allow_hosts, ["pypi.org"]);
    assert_eq!(reads(&i), None);
    let mut e = managed(json!([]));
    e["permissions"] = json!({"type": "external", "network": "restricted"});
    let i = go(&e).unwrap().unwrap();
    assert_eq!(
        (reads(&i), paths(&i.filesystem.write), &i.network),
        (None, vec!["/".into()], &NetworkIntent::Deny)
    );
}

/// What the reference refuses gets the reference's words (all -32602).
#[test]
fn bad_shapes_answer_as_the_reference() {
    let cases: Vec<(Value, &str, &str)> = vec![
        (
            managed(json!([entry(sp("root"), "bogus")])),
            "sandbox.permissions.file_system.entries.0.access",
            "unknown variant `bogus`, expected one of `read`, `write`, `deny`, `none`",
        ),
        (
            managed(json!([entry(sp("weird"), "read")])),
            "sandbox.permissions.file_system.entries.0.path.value.kind",
            "unknown variant `weird`, expected one of `root`, `minimal`, `current_working_directory`, `project_roots`, `tmpdir`, `slash_tmp`, `unknown`",
        ),
        (
            json!({"permissions": {"type": "weird"}}),
            "sandbox.permissions.type",
            "unknown variant `weird`, expected one of `managed`, `disabled`, `external`",
        ),
        (
            managed(json!([{"path": sp("root"), "access": "read", "missing_path_behavior": "bogus"}])),
            "sandbox.permissions.file_system.entries.0.missing_path_behavior",
            "unknown variant `bogus`, expected `skip`",
        ),
        (
            managed(json!([entry(json!({"type": "path", "path": "relative/x"}), "write")])),
            "sandbox.permissions.file_system.entries.0.path.path",
            "invalid URI: relative URL without a base",
        ),
        (
            managed(json!([entry(json!({"type": "path", "path": "/root/x"}), "write")])),
            "sandbox.permissions.file_system.entries.0.path.path",
            "invalid URI: relative URL without a base",
        ),
    ];
    for (s, field, message) in cases {
        let e = go(&s).unwrap_err();
        assert_eq!((e.field.as_str(), e.message.as_str()), (field, message));
        assert_eq!(e.code(), -32602);
    }
}

/// What the reference would run but has no native form is refused,
/// naming the field: never weaker.
#[test]
fn what_cannot_be_expressed_is_refused() {
    let mut extra = managed(json!([entry(sp("root"), "read")]));
    extra["sandboxExtra"] = json!(1);
    let mut entry_extra = managed(json!([{"path": sp("root"), "access": "read", "also": 1}]));
    entry_extra["cwd"] = json!(format!("file://{WS}"));
    let mut disagree = managed(json!([]));
    disagree["policyContext"] = json!({"workspaceRoots": ["file:///elsewhere"]});
    for (s, field) in [
        (extra, "sandbox.sandboxExtra"),
        (
            entry_extra,
            "sandbox.permissions.file_system.entries.0.also",
        ),
        (
            managed(json!([entry(
                json!({"type": "special", "value": {"kind": "project_roots", "subpath": "../x"}}),
                "write"
            )])),
            "sandbox.permissions.file_system.entries.0.path.value.subpath",
        ),
        (
            managed(json!([entry(
                json!({"type": "special", "value": {"kind": "project_roots", "subpath": "/etc"}}),
                "write"
            )])),
            "sandbox.permissions.file_system.entries.0.path.value.subpath",
        ),
        (
            managed(json!([entry(
                json!({"type": "special", "value": {"kind": "unknown", "path": ":x"}}),
                "deny"
            )])),
            "sandbox.permissions.file_system.entries.0.path.value.kind",
        ),
        (
            managed(json!([entry(sp("minimal"), "deny")])),
            "sandbox.permissions.file_system.entries.0.path.value.kind",
        ),
        (
            managed(json!([entry(
                json!({"type": "glob_pattern", "pattern": "/srv/**/*.txt"}),
                "read"
            )])),
            "sandbox.permissions.file_system.entries.0.path.pattern",
        ),
        (
            managed(json!([entry(
                // Unbounded from `/`: beyond the scan budget.
                json!({"type": "glob_pattern", "pattern": "/**/*.env"}),
                "deny"
            )])),
            "sandbox.permissions.file_system.entries.0.path.pattern",
        ),
        (
            managed(json!([entry(
                json!({"type": "path", "path": "http://host/x"}),
                "read"
            )])),
            "sandbox.permissions.file_system.entries.0.path.path",
        ),
        (
            managed(json!([entry(
                json!({"type": "path", "path": "file://otherhost/x"}),
                "read"
            )])),
            "sandbox.permissions.file_system.entries.0.path.path",
        ),
        (disagree, "sandbox.policyContext.workspaceRoots"),
        (
            managed(json!([entry(
                json!({"type": "path", "path": format!("file://{WS}/link/..")}),
                "write"
            )])),
            "sandbox.permissions.file_system.entries.0.path.path",
        ),
        (
            managed(json!([entry(
                json!({"type": "path", "path": "file:///srv/%2E%2E/etc"}),
                "write"
            )])),
            "sandbox.permissions.file_system.entries.0.path.path",
        ),
    ] {
        let e = go(&s).unwrap_err();
        assert_eq!(e.field, field, "{e}");
        assert!(e.message.starts_with("unsupported sandbox: "), "{e}");
        assert_eq!(e.code(), -32602);
    }
}

#[test]
fn deny_globs_expand_within_their_depth() {
    let d = std::env::temp_dir().join(format!("codex-glob-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(d.join("a/b/c")).unwrap();
    for f in [".env", "a/x.env", "a/b/y.env", "a/b/c/z.env", "a/keep.txt"] {
        std::fs::write(d.join(f), "").unwrap();
    }
    let glob = |pattern: String, depth: Option<u64>| {
        let mut s = managed(json!([
            entry(sp("root"), "read"),
            entry(json!({"type": "glob_pattern", "pattern": pattern}), "deny")
        ]));
        if let Some(depth) = depth {
            s["permissions"]["file_system"]["glob_scan_max_depth"] = json!(depth);
        }
        go(&s).map(|i| paths(&i.unwrap().filesystem.deny_read))
    };
    let all = glob(format!("{}/**/*.env", d.display()), Some(8)).unwrap();
    let want: Vec<String> = [".env", "a/b/c/z.env", "a/b/y.env", "a/x.env"]
        .iter()
        .map(|f| d.join(f).display().to_string())
        .collect();
    assert_eq!(all, want);
    // Without glob_scan_max_depth: as deep as the tree goes (the scan
    // budget bounds it), as the reference expands it.
    assert_eq!(
        glob(format!("{}/**/*.env", d.display()), None).unwrap(),
        want
    );
    // Depth 2: names one and two levels below the prefix.
    let two = glob(format!("{}/**/*.env", d.display()), Some(2)).unwrap();
    assert_eq!(
        two,
        [d.join(".env"), d.join("a/x.env")].map(|p| p.display().to_string())
    );
    // Without `**` the pattern bounds itself.
    let one = glob(format!("{}/*/*.env", d.display()), None).unwrap();
    assert_eq!(one, [d.join("a/x.env").display().to_string()]);
    // Relative: from the cwd.
    let mut s = managed(json!([entry(
        json!({"type": "glob_pattern", "pattern": "a/*.env"}),
        "deny"
    )]));
    s["cwd"] = json!(format!("file://{}", d.display()));
    let i = go(&s).unwrap().unwrap();
    assert_eq!(
        paths(&i.filesystem.deny_read),
        [d.join("a/x.env").display().to_string()]
    );
    for bad in [
        format!("{}/[ab]/*.env", d.display()),
        format!("{}/a**/x", d.display()),
    ] {
        assert!(glob(bad.clone(), Some(3)).is_err(), "{bad}");
    }
    let _ = std::fs::remove_dir_all(&d);
}

fn proxy(domains: Value) -> Value {
    json!({"proxy": {"enabled": true, "enableSocks5": false, "enableSocks5Udp": false,
                     "allowUpstreamProxy": false, "dangerouslyAllowAllUnixSockets": false,
                     "mode": "full", "domains": domains, "unixSockets": null,
                     "allowLocalBinding": false}})
}

fn with_net(p: Option<&Value>, enforce: bool) -> R<Option<SandboxIntent>> {
    let mut s = managed(json!([entry(sp("root"), "read")]));
    s["permissions"]["network"] = json!("enabled");
    translate(
        &s,
        NetworkRequest {
            enforce_managed: enforce,
            proxy: p,
            managed: None,
        },
        Path::new(WS),
        host(),
    )
}

#[test]
fn managed_network_maps_onto_egress_by_name_or_fails_closed() {
    // Enforced without a proxy: denied.
    assert_eq!(
        with_net(None, true).unwrap().unwrap().network,
        NetworkIntent::Deny
    );
    assert_eq!(
        with_net(None, false).unwrap().unwrap().network,
        NetworkIntent::Allow
    );
    let p = proxy(json!({"pypi.org": "allow", "**.github.com": "allow",
                         "*.example.net": "allow", "tracker.test": "deny", "x.y": "none"}));
    let i = with_net(Some(&p), true).unwrap().unwrap();
    let NetworkIntent::AllowHosts(e) = i.network else {
        panic!("{:?}", i.network)
    };
    assert_eq!(
        e.allow_hosts,
        ["github.com", "*.github.com", "*.example.net", "pypi.org"]
    );
    assert!(!e.ask);
    // A decision budget: ask the client.
    let mut p2 = p.clone();
    p2["policyDecisionTimeoutMs"] = json!(5000);
    let NetworkIntent::AllowHosts(e) = with_net(Some(&p2), true).unwrap().unwrap().network else {
        panic!()
    };
    assert_eq!((e.ask, e.ask_timeout_ms), (true, 5000));
    // Restricted stays denied whatever the proxy says.
    let mut s = managed(json!([entry(sp("root"), "read")]));
    s["permissions"]["network"] = json!("restricted");
    let n = NetworkRequest {
        enforce_managed: true,
        proxy: Some(&p),
        managed: None,
    };
    assert_eq!(
        translate(&s, n, Path::new(WS), host())
            .unwrap()
            .unwrap()
            .network,
        NetworkIntent::Deny
    );
    // The reference's own refusals.
    for (p, field, msg) in [
        (
            proxy(json!([{"pattern": "x"}])),
            "networkProxy.proxy.domains",
            "invalid type: sequence, expected a map",
        ),
        (
            proxy(json!({"x": "maybe"})),
            "networkProxy.proxy.domains.x",
            "unknown variant `maybe`, expected one of `none`, `allow`, `deny`",
        ),
        (
            json!({"proxy": {"enabled": true}}),
            "networkProxy.proxy.enableSocks5",
            "missing field `enableSocks5`",
        ),
    ] {
        let e = with_net(Some(&p), true).unwrap_err();
        assert_eq!((e.field.as_str(), e.message.as_str()), (field, msg));
    }
    // No native form: refused.
    let mut limited = proxy(json!({"a.b": "allow"}));
    limited["proxy"]["mode"] = json!("limited");
    let mut udp = proxy(json!({"a.b": "allow"}));
    udp["proxy"]["enableSocks5Udp"] = json!(true);
    let mut bind = proxy(json!({"a.b": "allow"}));
    bind["proxy"]["allowLocalBinding"] = json!(true);
    for (p, field) in [
        (limited, "networkProxy.proxy.mode"),
        (udp, "networkProxy.proxy.enableSocks5Udp"),
        (bind, "networkProxy.proxy.allowLocalBinding"),
        (proxy(json!({"*": "allow"})), "networkProxy.proxy.domains.*"),
        (
            proxy(json!({"a*.b": "allow"})),
            "networkProxy.proxy.domains.a*.b",
        ),
        (
            proxy(json!({"*.corp.test": "allow", "secret.corp.test": "deny"})),
            "networkProxy.proxy.domains.secret.corp.test",
        ),
    ] {
        let e = with_net(Some(&p), true).unwrap_err();
        assert_eq!(e.field, field, "{e}");
        assert!(e.message.starts_with("unsupported sandbox"), "{e}");
    }
}

/// Review of issue 30: a deny of the root beside a grant of it was
/// dropped (Codex lets the deny win that tie): the job read everything.
/// Refused now; a root deny beside grants of other paths still applies.
#[test]
fn a_root_both_denied_and_granted_is_refused() {
    let entry = |access: &str| json!({"path": {"type": "special", "value": {"kind": "root"}}, "access": access});
    let slash_write = json!({"path": {"type": "path", "path": "file:///"}, "access": "write"});
    for entries in [
        vec![entry("read"), entry("none")],
        vec![entry("write"), entry("none")],
        vec![slash_write.clone(), entry("none")],
        vec![entry("none"), entry("read")],
    ] {
        let sandbox = json!({"permissions": {"type": "managed", "file_system":
            {"type": "restricted", "entries": entries}, "network": "restricted"}});
        let e = go(&sandbox).unwrap_err();
        assert!(
            e.message.contains("both denied and granted"),
            "{}",
            e.message
        );
    }
    let sandbox = json!({"permissions": {"type": "managed", "file_system":
        {"type": "restricted", "entries": [
            entry("none"),
            {"path": {"type": "path", "path": format!("file://{WS}")}, "access": "read"}
        ]}, "network": "restricted"}});
    let i = go(&sandbox).unwrap().unwrap();
    let r = reads(&i).expect("not read-all");
    assert_eq!(r.len(), 1, "{r:?}");
    assert!(r[0].trim_start_matches('?') == WS, "{r:?}");
}
