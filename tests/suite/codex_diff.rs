//! The differential suite of the Codex dialect: JSON-RPC scenarios run
//! against the reference `codex exec-server --listen stdio`, recorded as
//! normalized transcripts (`tests/fixtures/codex/diff/NAME.golden`). The
//! reference must keep matching its goldens (three runs each: the
//! normalization is stable); `executor codex-exec-server` must match them
//! too, except where a scenario declares that executor differs on purpose
//! (a line checked apart) or sends what the reference does not (exact
//! lines only executor may send, which the reference must not).
//!
//! `EXECUTOR_CODEX_DIFF_RECORD=1` rewrites the goldens from the reference.

use executor_tests::codex::{base64, Server};
use executor_tests::codex_diff::{golden_dir, run, ExecutorCheck, Match, Scenario, Step};
use serde_json::{json, Value};

fn send(v: Value) -> Step {
    Step::Send(v.to_string())
}

fn raw(line: &str) -> Step {
    Step::Send(line.to_string())
}

fn response(id: impl Into<Value>) -> Step {
    Step::Expect(Match::Response(id.into()))
}

/// A request and its response.
fn req(id: u64, method: &str, params: Value) -> Vec<Step> {
    vec![
        send(json!({"id": id, "method": method, "params": params})),
        response(id),
    ]
}

fn note(method: &'static str, who: &'static str) -> Step {
    Step::Expect(Match::NotificationFor(method, who))
}

/// `initialize` (its session id captured as `{sid}`) and `initialized`.
fn handshake() -> Vec<Step> {
    vec![
        send(json!({"id": 0, "method": "initialize", "params": {"clientName": "diff"}})),
        response(0),
        Step::Capture("sid", "/result/sessionId"),
        send(json!({"method": "initialized", "params": {}})),
    ]
}

/// `process/start` params for `argv` (pipes, no stdin, the workspace).
fn start(id: &str, argv: &[&str]) -> Value {
    json!({"processId": id, "argv": argv, "cwd": "{wsuri}", "env": {}, "tty": false,
           "pipeStdin": false, "arg0": null, "sandbox": null})
}

/// The output, exit and close notifications of a one-chunk process.
fn ran(id: &'static str) -> Vec<Step> {
    vec![
        note("process/output", id),
        note("process/exited", id),
        note("process/closed", id),
    ]
}

/// A check that executor's (normalized) message is exactly `want`.
fn exactly(want: Value) -> ExecutorCheck {
    ExecutorCheck::new(move |v| {
        if *v == want {
            Ok(())
        } else {
            Err(format!("expected {want}"))
        }
    })
}

fn b64(s: &str) -> String {
    base64(s.as_bytes())
}

fn scenarios() -> Vec<Scenario> {
    // Capabilities and the prepended PATH dirs are the reference's own
    // (executor advertises only what it implements).
    const INFO_MASKS: &[&str] = &[
        "/result/environmentInfo/capabilities",
        "/result/environmentInfo/prependPathDirs",
        "/result/capabilities",
        "/result/prependPathDirs",
    ];
    let mut all = Vec::new();

    // Handshake errors and bad input; the connection survives all but an
    // unknown notification.
    let mut s = vec![
        send(json!({"id": 1, "method": "environment/info", "params": {}})),
        response(1),
        send(json!({"id": 2, "method": "fs/readFile", "params": {"path": "{wsuri}/x"}})),
        response(2),
        send(json!({"id": 3, "method": "initialize", "params": {"clientName": 7}})),
        response(3),
        send(json!({"id": 4, "method": "initialize", "params": {"clientName": "diff"}})),
        response(4),
        Step::Capture("sid", "/result/sessionId"),
        send(json!({"id": 5, "method": "environment/status", "params": {}})),
        response(5),
        send(json!({"id": 6, "method": "process/start", "params": start("early", &["/bin/true"])})),
        response(6),
        send(json!({"method": "initialized", "params": {}})),
        send(json!({"id": 7, "method": "initialize", "params": {"clientName": "diff"}})),
        response(7),
        raw("{not json"),
        Step::Expect(Match::Response(json!(-1))),
        raw("[1,2]"),
        Step::Expect(Match::Response(json!(-1))),
        send(json!({"id": 8, "method": "no/such", "params": {}})),
        response(8),
        send(json!({"id": 9, "method": "fs/readFile", "params": {"path": 42}})),
        response(9),
        send(json!({"id": 10, "method": "fs/getMetadata", "params": {"path": "/not/a/uri"}})),
        response(10),
        send(json!({"id": 11, "method": "fs/getMetadata", "params": {}})),
        response(11),
        send(json!({"id": "text-id", "method": "environment/status", "params": {}})),
        response("text-id"),
        send(json!({"id": 12, "method": "environment/status"})),
        response(12),
        send(json!({"id": 13, "method": "environment/info", "params": {}})),
        response(13),
        send(
            json!({"id": 14, "method": "process/start", "params": {"processId": "p", "argv": "ls", "cwd": "{wsuri}"}}),
        ),
        response(14),
        send(json!({"id": 15, "method": "process/read", "params": {"processId": 5}})),
        response(15),
        send(
            json!({"id": 16, "method": "fs/watchMissing", "params": {"watchId": 1, "missing": [], "present": null}}),
        ),
        response(16),
        send(
            json!({"id": 17, "method": "environmentConfig/read", "params": {"cwd": "{wsuri}", "configPaths": [["mcp_servers"]], "requirementsPaths": [["mcp_servers"]]}}),
        ),
        Step::ExpectDiffering {
            m: Match::Response(json!(17)),
            why: "executor does not read Codex's config.toml layers on the host (not advertised: environmentConfigRead is false)",
            check: ExecutorCheck::new(|v| {
                match v.pointer("/error/code").and_then(Value::as_i64) {
                    Some(-32601) => Ok(()),
                    _ => Err(format!("expected -32601 (not implemented), got {v}")),
                }
            }),
        },
        send(json!({"method": "bogus/notification", "params": {}})),
        // The reference drops the connection on an unknown notification,
        // but its process exits only when its stdin reader next wakes (a
        // race): closing stdin ends it; no answer to 18 comes.
        send(json!({"id": 18, "method": "environment/status", "params": {}})),
        Step::Sleep(300),
        Step::CloseStdin,
    ];
    all.push(Scenario {
        name: "handshake_errors",
        steps: std::mem::take(&mut s),
        executor_masks: INFO_MASKS,
    });

    // Process lifecycle: seqs, exit codes, duplicates, reads after exit.
    s = handshake();
    s.extend(req(
        1,
        "process/start",
        start("p1", &["/bin/sh", "-c", "echo hello"]),
    ));
    s.extend(ran("p1"));
    s.extend(req(2, "process/start", start("p1", &["/bin/true"])));
    s.extend(req(3, "process/read", json!({"processId": "p1"})));
    s.extend(req(
        5,
        "process/read",
        json!({"processId": "p1", "afterSeq": 3}),
    ));
    s.extend(req(
        6,
        "process/start",
        start("p2", &["/bin/sh", "-c", "echo bad >&2; exit 7"]),
    ));
    s.extend(ran("p2"));
    s.extend(req(
        7,
        "process/read",
        json!({"processId": "p2", "afterSeq": 0}),
    ));
    s.extend(req(8, "process/start", start("p3", &[])));
    s.extend(req(
        9,
        "process/start",
        start("p4", &["/nonexistent/binary"]),
    ));
    s.extend(req(10, "process/read", json!({"processId": "nope"})));
    s.extend(req(11, "process/terminate", json!({"processId": "nope"})));
    s.extend(req(12, "process/terminate", json!({"processId": "p1"})));
    s.extend(req(13, "process/start", json!({"processId": "p5", "argv": ["/bin/pwd"], "cwd": "{wsuri}/missing-dir", "env": {}, "tty": false})));
    s.extend(req(14, "process/start", json!({"processId": "p6", "argv": ["/bin/sh", "-c", "echo $ONE-$TWO"], "cwd": "{wsuri}", "env": {"ONE": "1", "TWO": "2"}, "tty": false})));
    s.extend(ran("p6"));
    all.push(Scenario {
        name: "process_lifecycle",
        steps: std::mem::take(&mut s),
        executor_masks: INFO_MASKS,
    });

    // stdin on a pipe: writes with writeId dedupe, then close by terminate.
    s = handshake();
    s.extend(req(1, "process/start", json!({"processId": "cat", "argv": ["/bin/cat"], "cwd": "{wsuri}", "env": {}, "tty": false, "pipeStdin": true})));
    s.extend(req(
        2,
        "process/write",
        json!({"processId": "cat", "chunk": b64("first\n"), "writeId": "w1"}),
    ));
    s.push(note("process/output", "cat"));
    s.extend(req(
        3,
        "process/write",
        json!({"processId": "cat", "chunk": b64("first\n"), "writeId": "w1"}),
    ));
    s.extend(req(
        4,
        "process/write",
        json!({"processId": "cat", "chunk": b64("second\n"), "writeId": "w2"}),
    ));
    s.push(note("process/output", "cat"));
    s.extend(req(
        5,
        "process/write",
        json!({"processId": "cat", "chunk": b64("x"), "writeId": ""}),
    ));
    s.extend(req(
        6,
        "process/write",
        json!({"processId": "cat", "chunk": "not base64!", "writeId": "w3"}),
    ));
    s.extend(req(
        7,
        "process/write",
        json!({"processId": "gone", "chunk": b64("x"), "writeId": "w4"}),
    ));
    s.extend(req(
        8,
        "process/read",
        json!({"processId": "cat", "afterSeq": 1}),
    ));
    s.extend(req(
        14,
        "process/read",
        json!({"processId": "cat", "afterSeq": 0, "maxBytes": 2}),
    ));
    s.extend(req(9, "process/terminate", json!({"processId": "cat"})));
    s.push(note("process/exited", "cat"));
    s.push(note("process/closed", "cat"));
    s.extend(req(
        10,
        "process/write",
        json!({"processId": "cat", "chunk": b64("late\n"), "writeId": "w5"}),
    ));
    // Without pipeStdin, stdin is closed: a write is refused.
    s.extend(req(11, "process/start", json!({"processId": "nostdin", "argv": ["/bin/sleep", "5"], "cwd": "{wsuri}", "env": {}, "tty": false})));
    s.extend(req(
        12,
        "process/write",
        json!({"processId": "nostdin", "chunk": b64("x\n"), "writeId": "w6"}),
    ));
    s.extend(req(
        13,
        "process/terminate",
        json!({"processId": "nostdin"}),
    ));
    s.push(note("process/exited", "nostdin"));
    s.push(note("process/closed", "nostdin"));
    all.push(Scenario {
        name: "process_stdin_pipe",
        steps: std::mem::take(&mut s),
        executor_masks: INFO_MASKS,
    });

    // A tty: a write reaches the command (echo off, so one output chunk).
    s = handshake();
    s.extend(req(1, "process/start", json!({"processId": "tty", "argv": ["/bin/sh", "-c", "stty -echo; echo ready; read x; echo got-$x"], "cwd": "{wsuri}", "env": {}, "tty": true})));
    s.push(note("process/output", "tty"));
    s.extend(req(
        2,
        "process/write",
        json!({"processId": "tty", "chunk": b64("ping\n"), "writeId": "1"}),
    ));
    s.push(note("process/output", "tty"));
    s.push(note("process/exited", "tty"));
    s.push(note("process/closed", "tty"));
    s.extend(req(
        3,
        "process/read",
        json!({"processId": "tty", "afterSeq": 0}),
    ));
    all.push(Scenario {
        name: "process_tty",
        steps: std::mem::take(&mut s),
        executor_masks: INFO_MASKS,
    });

    // Terminate a sleeper; signal; read it afterwards.
    s = handshake();
    s.extend(req(
        1,
        "process/start",
        start("sleeper", &["/bin/sleep", "30"]),
    ));
    s.extend(req(
        2,
        "process/read",
        json!({"processId": "sleeper", "afterSeq": 0, "waitMs": 100}),
    ));
    s.extend(req(3, "process/terminate", json!({"processId": "sleeper"})));
    s.push(note("process/exited", "sleeper"));
    s.push(note("process/closed", "sleeper"));
    s.extend(req(4, "process/terminate", json!({"processId": "sleeper"})));
    s.extend(req(
        5,
        "process/read",
        json!({"processId": "sleeper", "afterSeq": 0}),
    ));
    s.extend(req(
        6,
        "process/start",
        start(
            "trap",
            &[
                "/bin/sh",
                "-c",
                "trap 'echo interrupted; exit 4' INT; echo armed; while :; do sleep 0.05; done",
            ],
        ),
    ));
    s.push(note("process/output", "trap"));
    s.extend(req(
        7,
        "process/signal",
        json!({"processId": "trap", "signal": "interrupt"}),
    ));
    s.push(note("process/output", "trap"));
    s.push(note("process/exited", "trap"));
    s.push(note("process/closed", "trap"));
    s.extend(req(
        8,
        "process/signal",
        json!({"processId": "trap", "signal": "kill"}),
    ));
    all.push(Scenario {
        name: "process_terminate_signal",
        steps: std::mem::take(&mut s),
        executor_masks: INFO_MASKS,
    });

    // envPolicy: what the command sees (the server's environment is fixed
    // by the harness: PATH, HOME, CODEX_HOME, LANG, DIFF_*).
    s = handshake();
    let show_env = [
        "/bin/sh",
        "-c",
        "env | grep -v -e '^PWD=' -e '^SHLVL=' -e '^_=' | LC_ALL=C sort",
    ];
    let policies: [(&'static str, Value, Value); 8] = [
        (
            "none",
            json!({"inherit": "none", "ignoreDefaultExcludes": false, "exclude": [], "set": {}, "includeOnly": []}),
            json!({"GIVEN": "g"}),
        ),
        (
            "core",
            json!({"inherit": "core", "ignoreDefaultExcludes": false, "exclude": [], "set": {}, "includeOnly": []}),
            json!({}),
        ),
        (
            "all",
            json!({"inherit": "all", "ignoreDefaultExcludes": false, "exclude": [], "set": {}, "includeOnly": []}),
            json!({}),
        ),
        (
            "all-raw",
            json!({"inherit": "all", "ignoreDefaultExcludes": true, "exclude": ["DIFF_OTHER"], "set": {}, "includeOnly": []}),
            json!({}),
        ),
        (
            "only",
            json!({"inherit": "all", "ignoreDefaultExcludes": true, "exclude": [], "set": {}, "includeOnly": ["DIFF_V*", "PATH"]}),
            json!({}),
        ),
        (
            "set",
            json!({"inherit": "core", "ignoreDefaultExcludes": false, "exclude": [], "set": {"DIFF_SET": "from-set", "DIFF_VISIBLE": "set-wins"}, "includeOnly": []}),
            json!({"DIFF_VISIBLE": "env-wins"}),
        ),
        ("absent", Value::Null, json!({"GIVEN": "g"})),
        ("bogus", json!({"inherit": "some"}), json!({})),
    ];
    const NAMES: [&str; 8] = [
        "env-none",
        "env-core",
        "env-all",
        "env-all-raw",
        "env-only",
        "env-set",
        "env-absent",
        "env-bogus",
    ];
    for (i, (_, policy, env)) in policies.iter().enumerate() {
        let id = NAMES[i];
        let mut p = start(id, &show_env);
        p["envPolicy"] = policy.clone();
        p["env"] = env.clone();
        s.extend(req(i as u64 + 1, "process/start", p));
        if i < 7 {
            s.extend(ran(id));
        }
    }
    all.push(Scenario {
        name: "env_policy",
        steps: std::mem::take(&mut s),
        executor_masks: INFO_MASKS,
    });

    all.push(fs_scenario(INFO_MASKS));
    all.push(fs_handles_scenario(INFO_MASKS));
    all.push(http_scenario(INFO_MASKS));

    // Resume after the connection closes: over stdio the reference's
    // session ends with its process; executor's detaches and resumes. An
    // unknown session id is refused by both (and ends the connection).
    s = vec![
        send(
            json!({"id": 1, "method": "initialize", "params": {"clientName": "diff", "resumeSessionId": "00000000-0000-4000-8000-000000000000"}}),
        ),
        response(1),
        send(json!({"id": 2, "method": "environment/status", "params": {}})),
        Step::Sleep(300),
        Step::CloseStdin,
        Step::Reconnect,
    ];
    s.extend(handshake());
    s.extend(req(
        1,
        "process/start",
        start(
            "survivor",
            &["/bin/sh", "-c", "echo before; sleep 1; echo after"],
        ),
    ));
    s.push(note("process/output", "survivor"));
    s.extend(req(
        2,
        "process/start",
        start(
            "live",
            &[
                "/bin/sh",
                "-c",
                "echo before; sleep 1; echo during; sleep 5; echo after",
            ],
        ),
    ));
    s.push(note("process/output", "live"));
    s.push(Step::CloseStdin);
    // `survivor` ends and `live` writes `during` while no connection is
    // attached: what they did is read after the resume (nothing of it is
    // pushed); `live` writes `after` once resumed, pushed with the next
    // seq. The reference kills both with the connection and refuses the
    // resume.
    s.push(Step::Sleep(2500));
    s.push(Step::Reconnect);
    s.push(send(json!({"id": 1, "method": "initialize", "params": {"clientName": "diff", "resumeSessionId": "{sid}"}})));
    s.push(Step::ExpectDiffering {
        m: Match::Response(json!(1)),
        why: "executor's stdio session survives the closed connection and resumes",
        check: ExecutorCheck::new(|v| {
            match v.pointer("/result/sessionId").and_then(Value::as_str) {
                Some("<sid>") => Ok(()),
                _ => Err(format!("expected the same session back, got {v}")),
            }
        }),
    });
    s.push(send(json!({"method": "initialized", "params": {}})));
    s.push(send(json!({"id": 2, "method": "process/read", "params": {"processId": "survivor", "afterSeq": 0}})));
    s.push(Step::ExpectDiffering {
        m: Match::Response(json!(2)),
        why: "executor's process ran on while detached: its whole output and exit are read",
        check: exactly(json!({"id": 2, "result": {
            "chunks": [
                {"chunk@text": "before\n", "seq": "<seq>", "stream": "stdout"},
                {"chunk@text": "after\n", "seq": "<seq>", "stream": "stdout"},
            ],
            "closed": true, "exitCode": 0, "exited": true, "failure": null,
            "nextSeq": 5, "sandboxDenied": false,
        }})),
    });
    s.push(send(
        json!({"id": 3, "method": "process/read", "params": {"processId": "live", "afterSeq": 1}}),
    ));
    s.push(Step::ExpectDiffering {
        m: Match::Response(json!(3)),
        why: "executor's process ran on while detached: what it wrote then is read",
        check: exactly(json!({"id": 3, "result": {
            "chunks": [{"chunk@text": "during\n", "seq": "<seq>", "stream": "stdout"}],
            "closed": false, "exitCode": null, "exited": false, "failure": null,
            "nextSeq": 3, "sandboxDenied": false,
        }})),
    });
    // What `live` does once resumed is pushed, its seqs going on from
    // what the reads returned (`before` 1, `during` 2), nothing twice.
    for (method, want) in [
        (
            "process/output",
            json!({"chunk@text": "after\n", "processId": "live", "seq": 3, "stream": "stdout"}),
        ),
        (
            "process/exited",
            json!({"exitCode": 0, "processId": "live", "sandboxDenied": false, "seq": 4}),
        ),
        ("process/closed", json!({"processId": "live", "seq": 5})),
    ] {
        s.push(Step::ExecutorOnly {
            m: Match::NotificationFor(method, "live"),
            why: "the resumed session's running process goes on being pushed",
            want: json!({"method": method, "params": want}),
        });
    }
    all.push(Scenario {
        name: "resume_after_stdin_closes",
        steps: s,
        executor_masks: INFO_MASKS,
    });
    all
}

/// Every fs method with its errors.
fn fs_scenario(masks: &'static [&'static str]) -> Scenario {
    let mut s = handshake();
    let mut id = 0;
    let mut r = |method: &str, params: Value| {
        id += 1;
        req(id, method, params)
    };
    let f = |p: &str| format!("{{wsuri}}/{p}");
    s.extend(r("fs/getMetadata", json!({"path": f("missing")})));
    s.extend(r("fs/getMetadata", json!({"path": "{wsuri}"})));
    s.extend(r(
        "fs/writeFile",
        json!({"path": f("a.txt"), "dataBase64": b64("hello\n")}),
    ));
    s.extend(r("fs/getMetadata", json!({"path": f("a.txt")})));
    s.extend(r("fs/readFile", json!({"path": f("a.txt")})));
    s.extend(r("fs/readFile", json!({"path": f("missing")})));
    s.extend(r("fs/readFile", json!({"path": "{wsuri}"})));
    s.extend(r(
        "fs/writeFile",
        json!({"path": f("no/such/dir/b.txt"), "dataBase64": b64("x")}),
    ));
    s.extend(r(
        "fs/writeFile",
        json!({"path": f("bad.txt"), "dataBase64": "***"}),
    ));
    s.extend(r(
        "fs/writeFile",
        json!({"path": "{wsuri}", "dataBase64": b64("x")}),
    ));
    s.extend(r(
        "fs/createDirectory",
        json!({"path": f("d1/d2/d3"), "recursive": false}),
    ));
    s.extend(r(
        "fs/createDirectory",
        json!({"path": f("d1/d2/d3"), "recursive": true}),
    ));
    s.extend(r(
        "fs/createDirectory",
        json!({"path": f("d1/d2/d3"), "recursive": true}),
    ));
    s.extend(r(
        "fs/createDirectory",
        json!({"path": f("d1"), "recursive": false}),
    ));
    s.extend(r(
        "fs/createDirectory",
        json!({"path": f("a.txt/sub"), "recursive": true}),
    ));
    s.extend(r(
        "fs/writeFile",
        json!({"path": f("d1/d2/inner.txt"), "dataBase64": b64("inner\n")}),
    ));
    s.extend(r(
        "fs/writeFile",
        json!({"path": f("d1/.hidden/h.txt"), "dataBase64": b64("h")}),
    ));
    s.extend(r(
        "fs/createDirectory",
        json!({"path": f("d1/.hidden"), "recursive": true}),
    ));
    s.extend(r(
        "fs/writeFile",
        json!({"path": f("d1/.hidden/h.txt"), "dataBase64": b64("h")}),
    ));
    s.extend(r("fs/readDirectory", json!({"path": "{wsuri}"})));
    s.extend(r("fs/readDirectory", json!({"path": f("d1")})));
    s.extend(r("fs/readDirectory", json!({"path": f("a.txt")})));
    s.extend(r("fs/readDirectory", json!({"path": f("missing")})));
    s.extend(r("fs/walk", json!({"path": "{wsuri}", "options": {"maxDepth": 8, "maxDirectories": 100, "maxEntries": 100, "followDirectorySymlinks": false}})));
    s.extend(r("fs/walk", json!({"path": "{wsuri}", "options": {"maxDepth": 8, "maxDirectories": 100, "maxEntries": 100, "followDirectorySymlinks": false, "pruneHiddenDirectories": true}})));
    s.extend(r("fs/walk", json!({"path": "{wsuri}", "options": {"maxDepth": 1, "maxDirectories": 100, "maxEntries": 2, "followDirectorySymlinks": false}})));
    s.extend(r("fs/walk", json!({"path": "{wsuri}", "options": {"maxDepth": 65, "maxDirectories": 100, "maxEntries": 100, "followDirectorySymlinks": false}})));
    s.extend(r("fs/walk", json!({"path": "{wsuri}", "options": {"maxDepth": 8, "maxDirectories": 10001, "maxEntries": 50001, "followDirectorySymlinks": false}})));
    s.extend(r("fs/walk", json!({"path": f("missing"), "options": {"maxDepth": 8, "maxDirectories": 100, "maxEntries": 100, "followDirectorySymlinks": false}})));
    s.extend(r("fs/walk", json!({"path": f("a.txt"), "options": {"maxDepth": 8, "maxDirectories": 100, "maxEntries": 100, "followDirectorySymlinks": false}})));
    s.extend(r(
        "fs/canonicalize",
        json!({"path": f("d1/d2/../d2/./inner.txt")}),
    ));
    s.extend(r("fs/canonicalize", json!({"path": f("missing")})));
    s.extend(r(
        "fs/copy",
        json!({"sourcePath": f("a.txt"), "destinationPath": f("copy.txt"), "recursive": false}),
    ));
    s.extend(r("fs/readFile", json!({"path": f("copy.txt")})));
    s.extend(r(
        "fs/copy",
        json!({"sourcePath": f("d1"), "destinationPath": f("d1copy"), "recursive": false}),
    ));
    s.extend(r(
        "fs/copy",
        json!({"sourcePath": f("d1"), "destinationPath": f("d1copy"), "recursive": true}),
    ));
    s.extend(r("fs/readDirectory", json!({"path": f("d1copy/d2")})));
    s.extend(r(
        "fs/copy",
        json!({"sourcePath": f("d1"), "destinationPath": f("d1/d2/inside"), "recursive": true}),
    ));
    s.extend(r(
        "fs/copy",
        json!({"sourcePath": f("missing"), "destinationPath": f("x"), "recursive": false}),
    ));
    s.extend(r(
        "fs/copy",
        json!({"sourcePath": f("a.txt"), "destinationPath": f("no/such/x"), "recursive": false}),
    ));
    s.extend(r(
        "fs/remove",
        json!({"path": f("d1"), "recursive": false, "force": false}),
    ));
    s.extend(r(
        "fs/remove",
        json!({"path": f("d1"), "recursive": true, "force": false}),
    ));
    s.extend(r(
        "fs/remove",
        json!({"path": f("d1"), "recursive": true, "force": false}),
    ));
    s.extend(r(
        "fs/remove",
        json!({"path": f("d1"), "recursive": true, "force": true}),
    ));
    s.extend(r("fs/remove", json!({"path": f("copy.txt")})));
    s.extend(r("fs/getMetadata", json!({"path": f("copy.txt")})));
    s.extend(r("fs/readDirectory", json!({"path": "{wsuri}"})));
    s.extend(r(
        "fs/getMetadata",
        json!({"path": "file:///proc/self/../self/status"}),
    ));
    s.extend(r("fs/readFile", json!({"path": "file://{ws}/a%2Etxt"})));
    s.extend(r(
        "fs/readFile",
        json!({"path": "http://example.com/a.txt"}),
    ));
    Scenario {
        name: "fs_methods",
        steps: s,
        executor_masks: masks,
    }
}

/// fs/open, readBlock, close and the handle limits.
fn fs_handles_scenario(masks: &'static [&'static str]) -> Scenario {
    let mut s = handshake();
    s.extend(req(
        1,
        "fs/writeFile",
        json!({"path": "{wsuri}/data.bin", "dataBase64": b64("0123456789")}),
    ));
    s.extend(req(
        2,
        "fs/open",
        json!({"handleId": "h1", "path": "{wsuri}/data.bin"}),
    ));
    s.extend(req(
        3,
        "fs/readBlock",
        json!({"handleId": "h1", "offset": 0, "len": 4}),
    ));
    s.extend(req(
        4,
        "fs/readBlock",
        json!({"handleId": "h1", "offset": 6, "len": 4}),
    ));
    s.extend(req(
        5,
        "fs/readBlock",
        json!({"handleId": "h1", "offset": 8, "len": 4}),
    ));
    s.extend(req(
        6,
        "fs/readBlock",
        json!({"handleId": "h1", "offset": 20, "len": 4}),
    ));
    s.extend(req(
        7,
        "fs/readBlock",
        json!({"handleId": "h1", "offset": 2, "len": 0}),
    ));
    s.extend(req(
        8,
        "fs/open",
        json!({"handleId": "h1", "path": "{wsuri}/data.bin"}),
    ));
    s.extend(req(
        9,
        "fs/open",
        json!({"handleId": "h2", "path": "{wsuri}/missing"}),
    ));
    s.extend(req(
        10,
        "fs/open",
        json!({"handleId": "h3", "path": "{wsuri}"}),
    ));
    s.extend(req(
        11,
        "fs/open",
        json!({"handleId": "x".repeat(33), "path": "{wsuri}/data.bin"}),
    ));
    s.extend(req(
        12,
        "fs/open",
        json!({"handleId": "y".repeat(32), "path": "{wsuri}/data.bin"}),
    ));
    s.extend(req(
        13,
        "fs/open",
        json!({"handleId": "", "path": "{wsuri}/data.bin"}),
    ));
    s.extend(req(14, "fs/close", json!({"handleId": "h1"})));
    s.extend(req(15, "fs/close", json!({"handleId": "h1"})));
    s.extend(req(
        16,
        "fs/readBlock",
        json!({"handleId": "h1", "offset": 0, "len": 4}),
    ));
    s.extend(req(17, "fs/close", json!({"handleId": "y".repeat(32)})));
    // 128 open handles are the limit: the 129th is refused; closing one
    // makes room.
    for i in 0..129u64 {
        s.extend(req(
            100 + i,
            "fs/open",
            json!({"handleId": format!("n{i}"), "path": "{wsuri}/data.bin"}),
        ));
    }
    s.extend(req(300, "fs/close", json!({"handleId": "n0"})));
    s.extend(req(
        301,
        "fs/open",
        json!({"handleId": "again", "path": "{wsuri}/data.bin"}),
    ));
    s.extend(req(
        302,
        "fs/readBlock",
        json!({"handleId": "again", "offset": 0, "len": 1048577}),
    ));
    Scenario {
        name: "fs_handles",
        steps: s,
        executor_masks: masks,
    }
}

/// http/request: buffered, streamed (bodyDelta), redirects, timeouts,
/// valueEnvVar and its refusals, against a loopback HTTP server.
fn http_scenario(masks: &'static [&'static str]) -> Scenario {
    let mut s = handshake();
    let get = |url: &str| json!({"method": "GET", "url": url, "headers": []});
    // Every http/request names a requestId (the reference requires it,
    // streamed or not).
    let req = |id: u64, method: &str, mut params: Value| {
        if params.get("requestId").is_none() {
            params["requestId"] = json!(format!("b{id}"));
        }
        req(id, method, params)
    };
    // A /headers request: the body lists the request's headers, which
    // include the HTTP client's own (accept-encoding, their order), so
    // executor's is checked for the resolved header line only.
    let headers = |id: u64, header: Value, want: &'static str| {
        vec![
            send(json!({"id": id, "method": "http/request", "params": {
                "method": "GET", "url": "{http}/headers", "headers": [header],
                "requestId": format!("b{id}")}})),
            Step::ExpectDiffering {
                m: Match::Response(json!(id)),
                why: "the body lists the HTTP client's own headers too",
                check: ExecutorCheck::new(move |v| {
                    let body = v
                        .pointer("/result/bodyBase64@text")
                        .and_then(Value::as_str)
                        .unwrap_or("");
                    if body.lines().any(|l| l == want) {
                        Ok(())
                    } else {
                        Err(format!("expected the header line {want:?}, got {v}"))
                    }
                }),
            },
        ]
    };
    s.extend(req(1, "http/request", json!({"method": "POST", "url": "{http}/echo", "headers": [{"name": "x-rep", "value": "one"}], "bodyBase64": b64("posted body")})));
    s.extend(req(
        2,
        "http/request",
        get("{http}/redirect?code=302&to={http}/echo"),
    ));
    let mut stop = get("{http}/redirect?code=302&to={http}/echo");
    stop["redirectPolicy"] = json!("stop");
    s.extend(req(3, "http/request", stop));
    let mut follow = get("{http}/redirect?code=307&to={http}/echo");
    follow["redirectPolicy"] = json!("follow");
    s.extend(req(4, "http/request", follow));
    let mut streamed = get("{http}/sse?events=3&interval_ms=150");
    streamed["requestId"] = json!("r1");
    streamed["streamResponse"] = json!(true);
    s.extend(req(5, "http/request", streamed.clone()));
    for _ in 0..4 {
        s.push(note("http/request/bodyDelta", "r1"));
    }
    let mut slow = get("{http}/slow?ms=3000");
    slow["timeoutMs"] = json!(200);
    slow["requestId"] = json!("b6");
    // The reference words a timeout two ways (which timer fires first).
    s.push(send(
        json!({"id": 6, "method": "http/request", "params": slow}),
    ));
    s.push(Step::ExpectMasked(
        Match::Response(json!(6)),
        &["/error/message"],
    ));
    s.extend(req(7, "http/request", get("{http}/no-route")));
    s.extend(req(8, "http/request", get("not a url")));
    s.extend(req(9, "http/request", get("ftp://127.0.0.1/x")));
    s.extend(headers(
        10,
        json!({"name": "authorization", "value": "Bearer ", "valueEnvVar": "DIFF_TOKEN"}),
        "authorization: Bearer token-from-the-server-env",
    ));
    s.extend(req(11, "http/request", json!({"method": "GET", "url": "{http}/headers", "headers": [{"name": "x-secret", "value": "", "valueEnvVar": "DIFF_UNSET_VARIABLE"}]})));
    s.extend(headers(
        12,
        json!({"name": "x-path", "value": "", "valueEnvVar": "PATH"}),
        "x-path: /usr/local/bin:/usr/bin:/bin",
    ));
    s.extend(req(13, "http/request", json!({"method": "GET", "url": "{http}/headers", "headers": [{"name": "x-bad", "value": "", "valueEnvVar": "not a name"}]})));
    s.extend(headers(
        14,
        json!({"name": "x-both", "value": "literal", "valueEnvVar": "DIFF_VISIBLE"}),
        "x-both: literalvisible-value",
    ));
    s.extend(headers(
        15,
        json!({"name": "x-home", "value": "", "valueEnvVar": "HOME"}),
        "x-home: {home}",
    ));
    s.extend(req(
        16,
        "http/request",
        json!({"method": "BAD METHOD", "url": "{http}/echo", "headers": []}),
    ));
    // A requestId in use by a running stream is refused.
    let mut long = get("{http}/sse?events=2&interval_ms=1000");
    long["requestId"] = json!("r2");
    long["streamResponse"] = json!(true);
    s.extend(req(17, "http/request", long.clone()));
    s.extend(req(18, "http/request", long));
    for _ in 0..3 {
        s.push(note("http/request/bodyDelta", "r2"));
    }
    Scenario {
        name: "http_request",
        steps: s,
        executor_masks: masks,
    }
}

fn golden_path(name: &str) -> std::path::PathBuf {
    golden_dir().join(format!("{name}.golden"))
}

fn recording() -> bool {
    std::env::var_os("EXECUTOR_CODEX_DIFF_RECORD").is_some_and(|v| v == "1")
}

/// The reference matches its golden, three runs in a row (or, when
/// recording, writes it).
async fn reference_matches_golden(name: &str) {
    let scenario = scenarios()
        .into_iter()
        .find(|s| s.name == name)
        .expect("a scenario of that name");
    for round in 0..3 {
        let Some(t) = run(&scenario, Server::Reference { via_ssh: false }).await else {
            return;
        };
        assert!(
            t.reference_sent_executor_only.is_empty(),
            "{name} (run {}): {}",
            round + 1,
            t.reference_sent_executor_only.join("\n")
        );
        if recording() && round == 0 {
            std::fs::create_dir_all(golden_dir()).expect("mkdir the golden dir");
            std::fs::write(golden_path(name), t.text()).expect("write the golden");
        }
        let golden = std::fs::read_to_string(golden_path(name))
            .unwrap_or_else(|e| panic!("no golden for {name} ({e}): record it"));
        let got = t.text();
        if got != golden {
            let diff: Vec<String> = golden
                .lines()
                .map(Some)
                .chain(std::iter::repeat(None))
                .zip(got.lines().map(Some).chain(std::iter::repeat(None)))
                .take(golden.lines().count().max(got.lines().count()))
                .enumerate()
                .filter(|(_, (w, g))| w != g)
                .map(|(i, (w, g))| {
                    format!(
                        "line {}:\n  golden {}\n  now    {}",
                        i + 1,
                        w.unwrap_or("<none>"),
                        g.unwrap_or("<none>")
                    )
                })
                .collect();
            panic!(
                "the reference's transcript of {name} (run {}) differs from its golden:\n{}",
                round + 1,
                diff.join("\n")
            );
        }
    }
}

/// Executor's transcript matches the reference's golden but for the
/// declared differences.
async fn executor_matches_golden(name: &str) {
    let scenario = scenarios()
        .into_iter()
        .find(|s| s.name == name)
        .expect("a scenario of that name");
    let Some(t) = run(&scenario, Server::Executor { via_ssh: false }).await else {
        return;
    };
    let golden = std::fs::read_to_string(golden_path(name)).expect("the golden");
    let diffs = executor_tests::codex_diff::compare(&scenario, &golden, &t);
    if !diffs.is_empty() {
        let out = std::env::temp_dir().join(format!("codex-diff-{name}.executor"));
        let _ = std::fs::write(&out, t.text());
        panic!(
            "executor differs from the reference in {name} ({} lines; its transcript: {}):\n{}",
            diffs.len(),
            out.display(),
            diffs.join("\n")
        );
    }
}

macro_rules! diff_tests {
    ($($name:ident),* $(,)?) => {
        mod reference {
            $(
                #[tokio::test]
                async fn $name() {
                    super::reference_matches_golden(stringify!($name)).await;
                }
            )*
        }
        mod executor {
            $(
                #[tokio::test]
                async fn $name() {
                    super::executor_matches_golden(stringify!($name)).await;
                }
            )*
        }
    };
}

diff_tests!(
    handshake_errors,
    process_lifecycle,
    process_stdin_pipe,
    process_tty,
    process_terminate_signal,
    env_policy,
    fs_methods,
    fs_handles,
    http_request,
    resume_after_stdin_closes,
);

/// Every scenario has a test (the list above is complete).
#[test]
fn every_scenario_is_registered() {
    let names: Vec<&str> = scenarios().iter().map(|s| s.name).collect();
    let registered = [
        "handshake_errors",
        "process_lifecycle",
        "process_stdin_pipe",
        "process_tty",
        "process_terminate_signal",
        "env_policy",
        "fs_methods",
        "fs_handles",
        "http_request",
        "resume_after_stdin_closes",
    ];
    assert_eq!(names, registered);
}

/// The comparison itself: equal transcripts agree; a changed line, a
/// missing line and a declared difference whose check fails are each
/// reported; a masked pointer is ignored.
#[test]
fn the_comparison_reports_each_kind_of_difference() {
    use executor_tests::codex_diff::{compare, Line, Transcript};
    let scenario = Scenario {
        name: "self-test",
        steps: Vec::new(),
        executor_masks: &["/result/capabilities"],
    };
    let golden = "> {\"id\":1}\n< {\"id\":1,\"result\":{\"capabilities\":{\"a\":true},\"x\":1}}\n< {\"id\":2,\"result\":{}}\n";
    let line = |t: &str| Line::plain(t);
    let same = Transcript {
        lines: vec![
            line("> {\"id\":1}"),
            line("< {\"id\":1,\"result\":{\"capabilities\":{\"b\":false},\"x\":1}}"),
            line("< {\"id\":2,\"result\":{}}"),
        ],
        reference_sent_executor_only: Vec::new(),
    };
    assert_eq!(compare(&scenario, golden, &same), Vec::<String>::new());
    let mut changed = same.clone();
    changed.lines[1] = line("< {\"id\":1,\"result\":{\"capabilities\":{},\"x\":2}}");
    let diffs = compare(&scenario, golden, &changed);
    assert_eq!(diffs.len(), 1, "{diffs:?}");
    assert!(diffs[0].starts_with("line 2:"), "{diffs:?}");
    let mut short = same.clone();
    short.lines.pop();
    assert_eq!(compare(&scenario, golden, &short).len(), 1);
    let mut declared = same.clone();
    declared.lines[2].differing = Some((
        "on purpose",
        ExecutorCheck::new(|v| match v.pointer("/result/ok") {
            Some(_) => Ok(()),
            None => Err("no ok".into()),
        }),
    ));
    let diffs = compare(&scenario, golden, &declared);
    assert_eq!(diffs.len(), 1, "{diffs:?}");
    assert!(
        diffs[0].contains("on purpose") && diffs[0].contains("no ok"),
        "{diffs:?}"
    );
    declared.lines[2].text = "< {\"id\":2,\"result\":{\"ok\":1}}".into();
    assert_eq!(compare(&scenario, golden, &declared), Vec::<String>::new());

    // An executor-only line: stepped over when it is exactly the declared
    // one (the golden's next line is compared with executor's next).
    let added = |text: &str| Line {
        text: text.to_string(),
        differing: None,
        executor_only: Some(("better", "{\"method\":\"m\",\"params\":{\"seq\":3}}".into())),
    };
    let mut extra = same.clone();
    extra
        .lines
        .insert(2, added("+ {\"method\":\"m\",\"params\":{\"seq\":3}}"));
    assert_eq!(compare(&scenario, golden, &extra), Vec::<String>::new());
    // Another value, or not sent at all, is reported.
    extra.lines[2] = added("+ {\"method\":\"m\",\"params\":{\"seq\":4}}");
    let diffs = compare(&scenario, golden, &extra);
    assert_eq!(diffs.len(), 1, "{diffs:?}");
    assert!(
        diffs[0].starts_with("line 3: executor-only (better)"),
        "{diffs:?}"
    );
    extra.lines[2] = added("! no message Notification(\"m\")");
    assert_eq!(compare(&scenario, golden, &extra).len(), 1);
    // A line executor sends that is not declared is a difference.
    let mut undeclared = same.clone();
    undeclared
        .lines
        .insert(2, line("<? {\"method\":\"m\",\"params\":{\"seq\":3}}"));
    let diffs = compare(&scenario, golden, &undeclared);
    assert_eq!(diffs.len(), 2, "{diffs:?}");
    assert!(
        diffs[0].starts_with("line 3:") && diffs[1].starts_with("line 4: reference <missing>"),
        "{diffs:?}"
    );
}
