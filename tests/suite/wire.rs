//! The wire contract, spoken in raw bytes to the real `executor` binary.

use executor_protocol::limits::Limits;
use executor_protocol::types::session::ClientInfo;
use executor_protocol::types::Empty;
use executor_tests::*;
use rmpv::Value;

#[tokio::test]
async fn preamble_then_initialize_reports_every_field() {
    let mut a = RawAgent::spawn().await; // checks the 16-byte preamble
    let r = a
        .request(1, executor_protocol::methods::INITIALIZE, &init_params())
        .await;
    let res = get(&r, "result").expect("result");
    assert_eq!(
        get(res, "protocol_version").and_then(|v| v.as_u64()),
        Some(1)
    );
    assert_eq!(
        path(res, "agent.name").and_then(|v| v.as_str()),
        Some("executor")
    );
    for key in ["session_id", "resume_token"] {
        let s = get(res, key).and_then(|v| v.as_str()).expect(key);
        assert_eq!(s.len(), 32, "{key} is 128 bits of hex");
        assert!(s.bytes().all(|b| b.is_ascii_hexdigit()));
    }
    assert_ne!(get(res, "session_id"), get(res, "resume_token"));
    assert_eq!(get(res, "resumed").and_then(|v| v.as_bool()), Some(false));
    let methods: Vec<&str> = get(res, "methods")
        .and_then(|v| v.as_array())
        .expect("methods")
        .iter()
        .filter_map(|m| m.as_str())
        .collect();
    assert!(methods.contains(&"environment/info") && methods.contains(&"tools/list"));
    assert!(!methods.contains(&"initialize"));
    // Every limit of the table, with its default.
    let limits: Limits = rmpv::ext::from_value(get(res, "limits").unwrap().clone()).unwrap();
    assert_eq!(limits, Limits::default());
    let limit_keys = get(res, "limits").unwrap().as_map().unwrap().len();
    // 19 bounds of the protocol and `job`, the jobs' default limits.
    assert_eq!(limit_keys, 20);
    assert_eq!(
        path(res, "limits.job.processes").and_then(|v| v.as_u64()),
        Some(executor_protocol::limits::JOB_PROCESSES)
    );
    assert_eq!(
        path(res, "platform.os").and_then(|v| v.as_str()),
        Some(std::env::consts::OS)
    );
    assert_eq!(
        path(res, "platform.arch").and_then(|v| v.as_str()),
        Some(std::env::consts::ARCH)
    );
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(
        path(res, "platform.hostname").and_then(|v| v.as_str()),
        Some(host.trim())
    );
    // Sandbox capabilities probed from this kernel.
    let abi = executor_sys::landlock_abi().ok().map(u64::from);
    assert_eq!(
        path(res, "sandbox.landlock_abi").and_then(|v| v.as_u64()),
        abi
    );
    assert!(path(res, "sandbox.enforceable")
        .and_then(|v| v.as_bool())
        .is_some());
    assert!(path(res, "sandbox.network_rules")
        .and_then(|v| v.as_bool())
        .is_some());
    assert!(path(res, "sandbox.mechanisms")
        .and_then(|v| v.as_array())
        .is_some());
    assert_eq!(a.close_and_wait().await.code(), Some(0));
}

#[tokio::test]
async fn every_listed_method_is_served_and_every_other_is_method_not_found() {
    let mut a = RawAgent::initialized().await;
    let init = a
        .request(1, executor_protocol::methods::ENVIRONMENT_INFO, &Empty {})
        .await;
    assert!(get(&init, "result").is_some());
    let mut b = RawAgent::spawn().await;
    let r = b
        .request(1, executor_protocol::methods::INITIALIZE, &init_params())
        .await;
    let listed: Vec<String> = path(&r, "result.methods")
        .and_then(|v| v.as_array())
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap().to_string())
        .collect();
    for (i, m) in executor_protocol::methods::ALL_REQUESTS.iter().enumerate() {
        let r = b.request(100 + i as u64, m, &Empty {}).await;
        let code = error_code(&r);
        if listed.iter().any(|l| l == m) {
            assert_ne!(
                code,
                Some("method_not_found"),
                "{m} is listed but not served"
            );
        } else {
            assert_eq!(code, Some("method_not_found"), "{m} is not listed: {r:?}");
            assert_eq!(
                path(&r, "error.data.method").and_then(|v| v.as_str()),
                Some(*m)
            );
        }
    }
}

#[tokio::test]
async fn request_before_initialize_is_not_initialized() {
    let mut a = RawAgent::spawn().await;
    let r = a
        .request(5, executor_protocol::methods::ENVIRONMENT_INFO, &Empty {})
        .await;
    assert_eq!(error_code(&r), Some("not_initialized"));
    // The connection goes on: initialize now works.
    let r = a
        .request(6, executor_protocol::methods::INITIALIZE, &init_params())
        .await;
    assert!(get(&r, "result").is_some());
    // A second initialize is invalid_request.
    let r = a
        .request(7, executor_protocol::methods::INITIALIZE, &init_params())
        .await;
    assert_eq!(error_code(&r), Some("invalid_request"));
}

#[tokio::test]
async fn unknown_method_then_the_connection_still_works() {
    let mut a = RawAgent::initialized().await;
    let r = a.request(9, "no/such", &Empty {}).await;
    assert_eq!(error_code(&r), Some("method_not_found"));
    assert_eq!(
        path(&r, "error.data.method").and_then(|v| v.as_str()),
        Some("no/such")
    );
    let r = a
        .request(10, executor_protocol::methods::ENVIRONMENT_INFO, &Empty {})
        .await;
    assert!(path(&r, "result.hostname").is_some());
}

#[tokio::test]
async fn invalid_params_name_the_field() {
    let mut a = RawAgent::spawn().await;
    #[derive(serde::Serialize)]
    struct Partial {
        protocol_version: u32,
        client: Value,
    }
    let r = a
        .request(
            1,
            executor_protocol::methods::INITIALIZE,
            &Partial {
                protocol_version: 1,
                client: Value::Map(vec![("name".into(), "x".into())]),
            },
        )
        .await;
    assert_eq!(error_code(&r), Some("invalid_params"));
    assert_eq!(
        path(&r, "error.data.field").and_then(|v| v.as_str()),
        Some("client.version")
    );
    let msg = path(&r, "error.message").and_then(|v| v.as_str()).unwrap();
    assert!(msg.contains("version"), "{msg}");
    // Wrong type: named too.
    let r = a
        .request(
            2,
            executor_protocol::methods::INITIALIZE,
            &Partial {
                protocol_version: 1,
                client: Value::from("not a map"),
            },
        )
        .await;
    assert_eq!(
        path(&r, "error.data.field").and_then(|v| v.as_str()),
        Some("client")
    );
    // Params that are not a map.
    a.send_value(&Value::Map(vec![
        ("id".into(), 3.into()),
        ("method".into(), "initialize".into()),
        ("params".into(), Value::Array(vec![])),
    ]))
    .await;
    let r = a.response(3).await;
    assert_eq!(
        path(&r, "error.data.field").and_then(|v| v.as_str()),
        Some("params")
    );
    // Unsupported version names both sides.
    let r = a
        .request(
            4,
            executor_protocol::methods::INITIALIZE,
            &executor_protocol::types::session::InitializeParams {
                protocol_version: 2,
                client: ClientInfo {
                    name: "t".into(),
                    version: "0".into(),
                },
                session: None,
                capabilities: None,
            },
        )
        .await;
    assert_eq!(error_code(&r), Some("unsupported_version"));
    assert_eq!(
        path(&r, "error.data.client").and_then(|v| v.as_u64()),
        Some(2)
    );
    let r = a
        .request(5, executor_protocol::methods::INITIALIZE, &init_params())
        .await;
    assert!(get(&r, "result").is_some(), "connection survived: {r:?}");
}

#[tokio::test]
async fn non_map_messages_are_errors_and_the_connection_survives() {
    let mut a = RawAgent::initialized().await;
    a.send_value(&Value::Array(vec![1.into(), "environment/info".into()]))
        .await;
    let r = a.recv().await.unwrap();
    assert_eq!(error_code(&r), Some("invalid_request"));
    assert_eq!(get(&r, "id"), Some(&Value::Nil));
    // Not msgpack at all: parse_error.
    a.send_frame(&[0xc1]).await;
    let r = a.recv().await.unwrap();
    assert_eq!(error_code(&r), Some("parse_error"));
    // A string id: invalid_request, answered with id nil.
    a.send_value(&Value::Map(vec![
        ("id".into(), "seven".into()),
        ("method".into(), "tools/list".into()),
    ]))
    .await;
    let r = a.recv().await.unwrap();
    assert_eq!(error_code(&r), Some("invalid_request"));
    assert_eq!(get(&r, "id"), Some(&Value::Nil));
    // A method that is not a string: invalid_request with the id.
    a.send_value(&Value::Map(vec![
        ("id".into(), 8.into()),
        ("method".into(), 5.into()),
    ]))
    .await;
    let r = a.response(8).await;
    assert_eq!(error_code(&r), Some("invalid_request"));
    let r = a
        .request(11, executor_protocol::methods::TOOLS_LIST, &Empty {})
        .await;
    assert!(get(&r, "result").is_some());
}

#[tokio::test]
async fn zero_length_frame_closes_the_connection() {
    let mut a = RawAgent::initialized().await;
    a.send_raw(&[0, 0, 0, 0]).await;
    let r = a.recv().await.expect("$/error before closing");
    assert_eq!(get(&r, "method").and_then(|v| v.as_str()), Some("$/error"));
    assert_eq!(
        path(&r, "params.code").and_then(|v| v.as_str()),
        Some("frame_too_large")
    );
    assert_eq!(
        path(&r, "params.data.declared").and_then(|v| v.as_u64()),
        Some(0)
    );
    assert_eq!(a.recv().await, None, "connection closed");
    let status = a.wait().await;
    assert_eq!(status.code(), Some(2));
}

#[tokio::test]
async fn oversized_length_closes_without_allocating_it() {
    let mut a = RawAgent::initialized().await;
    let pid = a.child.id().unwrap();
    // 4 GiB - 1 declared; the agent must not try to buffer it.
    a.send_raw(&[0xff, 0xff, 0xff, 0xff, 1, 2, 3]).await;
    let r = a.recv().await.expect("$/error before closing");
    assert_eq!(
        path(&r, "params.code").and_then(|v| v.as_str()),
        Some("frame_too_large")
    );
    assert_eq!(
        path(&r, "params.data.declared").and_then(|v| v.as_u64()),
        Some(0xffff_ffff)
    );
    assert_eq!(
        path(&r, "params.data.max").and_then(|v| v.as_u64()),
        Some(16 << 20)
    );
    // Peak RSS while it was still alive stays small (read before it exits,
    // best effort: it may already be gone).
    if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
        let hwm = status
            .lines()
            .find(|l| l.starts_with("VmHWM:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|k| k.parse::<u64>().ok())
            .unwrap_or(0);
        assert!(hwm < 64 * 1024, "peak RSS {hwm} KiB");
    }
    assert_eq!(a.recv().await, None);
    assert_eq!(a.wait().await.code(), Some(2));
}

#[tokio::test]
async fn truncated_frame_then_eof_is_a_clean_exit() {
    let mut a = RawAgent::initialized().await;
    a.send_raw(&[0, 0, 0, 10, 0x80]).await;
    let status = a.close_and_wait().await;
    assert_eq!(status.code(), Some(0));
    let err = a.stderr().await;
    assert!(!err.contains("panicked"), "{err}");
}

#[tokio::test]
async fn eof_at_a_frame_boundary_exits_zero() {
    let mut a = RawAgent::initialized().await;
    assert_eq!(a.close_and_wait().await.code(), Some(0));
}

#[tokio::test]
async fn a_thousand_pipelined_requests_are_all_answered() {
    let mut a = RawAgent::initialized().await;
    let mut batch = Vec::new();
    for id in 1..=1000u64 {
        let method = if id % 2 == 0 {
            "tools/list"
        } else {
            "environment/info"
        };
        executor_protocol::message::encode_request(&mut batch, id, method, &Empty {}, 1 << 20)
            .unwrap();
    }
    a.send_raw(&batch).await;
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..1000 {
        let r = a.recv().await.expect("answer");
        let id = get(&r, "id").and_then(|v| v.as_u64()).expect("id");
        let res = get(&r, "result").unwrap_or_else(|| panic!("error for {id}: {r:?}"));
        // Each answer is the one for its own request.
        if id % 2 == 0 {
            assert!(get(res, "tools").is_some());
        } else {
            assert!(get(res, "hostname").is_some());
        }
        assert!(seen.insert(id), "id {id} answered twice");
    }
    assert_eq!(seen.len(), 1000);
    assert_eq!(seen.first(), Some(&1));
    assert_eq!(seen.last(), Some(&1000));
}

#[tokio::test]
async fn a_duplicate_in_flight_id_is_refused_not_confused() {
    // Not an ordering guarantee, only that the agent never answers twice
    // for the same in-flight id with two different results.
    let mut a = RawAgent::initialized().await;
    let mut batch = Vec::new();
    for _ in 0..2 {
        executor_protocol::message::encode_request(
            &mut batch,
            77,
            "tools/list",
            &Empty {},
            1 << 20,
        )
        .unwrap();
    }
    a.send_raw(&batch).await;
    let first = a.response(77).await;
    let second = a.response(77).await;
    let codes = [error_code(&first), error_code(&second)];
    // Either both succeeded (the first finished before the second arrived),
    // or one was refused as a duplicate.
    assert!(
        codes.iter().all(|c| c.is_none()) || codes.contains(&Some("invalid_request")),
        "{codes:?}"
    );
}
