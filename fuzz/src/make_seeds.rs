//! Writes the seed corpus (`fuzz/corpus/<target>/`): valid requests of
//! every method, so the fuzzer starts from the protocol's real shapes.
//! Run from `fuzz/`: `cargo run --bin make_seeds`.

use executor_fuzz::agent::root;
use executor_protocol::message::{encode_notification, encode_request};
use rmpv::Value;

fn map(entries: Vec<(&str, Value)>) -> Value {
    Value::Map(entries.into_iter().map(|(k, v)| (k.into(), v)).collect())
}

fn main() -> std::io::Result<()> {
    let root = root();
    let p = |rel: &str| Value::from(root.join(rel).to_str().expect("utf-8 root"));
    let requests: Vec<(&str, Value)> = vec![
        ("environment/info", map(vec![])),
        ("tools/list", map(vec![])),
        ("fs/stat", map(vec![("path", p("a.txt"))])),
        (
            "fs/stat",
            map(vec![("path", p("out")), ("follow_symlinks", true.into())]),
        ),
        ("fs/canonicalize", map(vec![("path", p("sub/../a.txt"))])),
        (
            "fs/readFile",
            map(vec![
                ("path", p("a.txt")),
                ("offset", 2.into()),
                ("length", 3.into()),
            ]),
        ),
        (
            "fs/readFile",
            map(vec![("path", Value::Binary(b"/etc/passwd".to_vec()))]),
        ),
        (
            "fs/walk",
            map(vec![
                ("root", p("")),
                ("max_depth", 3.into()),
                ("max_entries", 2.into()),
            ]),
        ),
        ("fs/open", map(vec![("path", p("sub/b.bin"))])),
        (
            "fs/readBlock",
            map(vec![
                ("handle", 1.into()),
                ("offset", 0.into()),
                ("length", 65536.into()),
            ]),
        ),
        ("fs/close", map(vec![("handle", 1.into())])),
        (
            "fs/readStream",
            map(vec![
                ("path", p("sub/b.bin")),
                ("block_bytes", 16384.into()),
                ("credit_bytes", 32768.into()),
            ]),
        ),
        (
            "fs/readCredit",
            map(vec![("stream_id", 1.into()), ("bytes", 16384.into())]),
        ),
        ("fs/readCancel", map(vec![("stream_id", 1.into())])),
        ("fs/readLink", map(vec![("path", p("out"))])),
        (
            "fs/createSymlink",
            map(vec![
                ("path", p("planted")),
                ("target", "/etc/shadow".into()),
            ]),
        ),
        (
            "fs/writeFile",
            map(vec![
                ("path", p("w")),
                ("data", Value::Binary(b"x".to_vec())),
            ]),
        ),
        ("fs/openWrite", map(vec![("path", p("w2"))])),
        (
            "process/start",
            map(vec![
                ("argv", Value::Array(vec!["true".into()])),
                ("cwd", "/".into()),
                ("env", map(vec![])),
            ]),
        ),
        (
            "process/read",
            map(vec![
                ("process_id", "proc-1".into()),
                ("wait_ms", 10.into()),
            ]),
        ),
        ("process/list", map(vec![])),
        (
            "exec_command",
            map(vec![
                ("command", Value::Array(vec!["true".into()])),
                ("cwd", "/".into()),
                ("env", map(vec![])),
            ]),
        ),
        (
            "http/request",
            map(vec![
                ("method", "GET".into()),
                ("url", "http://127.0.0.1:9/".into()),
            ]),
        ),
        ("http/cancel", map(vec![("stream_id", 1.into())])),
        ("no/such/method", map(vec![])),
        ("initialize", map(vec![])),
    ];
    let mut payloads = Vec::new();
    let mut frames = Vec::new();
    for (i, (method, params)) in requests.iter().enumerate() {
        let mut f = Vec::new();
        encode_request(&mut f, i as u64 + 1, method, params, 1 << 24).expect("encode");
        payloads.push(f[4..].to_vec());
        frames.push(f);
    }
    let mut cancel = Vec::new();
    encode_notification(
        &mut cancel,
        "$/cancel",
        &map(vec![("id", 3.into())]),
        1 << 24,
    )
    .expect("encode");
    payloads.push(cancel[4..].to_vec());
    frames.push(cancel);

    let dir = std::path::Path::new("corpus");
    for target in ["frame_decoder", "message_decode", "dispatch"] {
        std::fs::create_dir_all(dir.join(target))?;
    }
    for (i, payload) in payloads.iter().enumerate() {
        std::fs::write(
            dir.join("message_decode").join(format!("seed-{i:02}")),
            payload,
        )?;
    }
    for (i, frame) in frames.iter().enumerate() {
        // frame_decoder: the first byte chooses the split point.
        let mut seed = vec![(i * 7) as u8];
        seed.extend_from_slice(frame);
        seed.extend_from_slice(frame);
        std::fs::write(dir.join("frame_decoder").join(format!("seed-{i:02}")), seed)?;
        std::fs::write(dir.join("dispatch").join(format!("seed-{i:02}")), frame)?;
    }
    // A whole session's worth of requests, pipelined.
    let all: Vec<u8> = frames.concat();
    std::fs::write(dir.join("dispatch").join("seed-all"), &all)?;
    Ok(())
}
