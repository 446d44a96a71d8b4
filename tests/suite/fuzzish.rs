//! Hostile input to the real agent: it answers or closes, and never panics.

use executor_protocol::methods::ALL_REQUESTS;
use executor_protocol::types::Empty;
use executor_tests::*;
use rmpv::Value;

fn random_value(r: &mut Rng, depth: u32) -> Value {
    match r.below_u64(if depth > 3 { 6 } else { 9 }) {
        0 => Value::Nil,
        1 => Value::Boolean(r.below_u64(2) == 0),
        2 => Value::from(r.next_u64() as i64),
        3 => Value::from(r.below_u64(300)),
        4 => Value::F64(r.next_u64() as f64),
        5 => {
            // Short non-path strings: never an absolute path, so no random
            // request can touch the real filesystem.
            let n = r.below_u64(8) as usize;
            Value::from(
                (0..n)
                    .map(|_| (b'a' + r.below_u64(26) as u8) as char)
                    .collect::<String>(),
            )
        }
        6 => Value::Binary((0..r.below_u64(16)).map(|_| r.next_u64() as u8).collect()),
        7 => Value::Array(
            (0..r.below_u64(4))
                .map(|_| random_value(r, depth + 1))
                .collect(),
        ),
        _ => {
            const KEYS: &[&str] = &[
                "path",
                "argv",
                "handle",
                "id",
                "process_id",
                "cwd",
                "env",
                "x",
                "data",
            ];
            Value::Map(
                (0..r.below_u64(5))
                    .map(|_| {
                        let k = KEYS[r.below_u64(KEYS.len() as u64) as usize];
                        (Value::from(k), random_value(r, depth + 1))
                    })
                    .collect(),
            )
        }
    }
}

#[tokio::test]
async fn thousands_of_hostile_frames_never_panic_the_agent() {
    let mut a = RawAgent::initialized().await;
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    for i in 0..3000u64 {
        let payload = match r.below_u64(4) {
            // Random bytes.
            0 => (0..1 + r.below_u64(64))
                .map(|_| r.next_u64() as u8)
                .collect::<Vec<u8>>(),
            // A random value.
            1 => {
                let mut p = Vec::new();
                rmpv::encode::write_value(&mut p, &random_value(&mut r, 0)).unwrap();
                p
            }
            // A request to a real method with random params.
            _ => {
                let method = ALL_REQUESTS[r.below_u64(ALL_REQUESTS.len() as u64) as usize];
                let mut p = Vec::new();
                let v = Value::Map(vec![
                    ("id".into(), Value::from(10_000 + i)),
                    ("method".into(), method.into()),
                    ("params".into(), random_value(&mut r, 0)),
                ]);
                rmpv::encode::write_value(&mut p, &v).unwrap();
                p
            }
        };
        a.send_frame(&payload).await;
    }
    // Still serving, and in order of arrival it still answers new requests.
    let ok = a
        .request(1, executor_protocol::methods::TOOLS_LIST, &Empty {})
        .await;
    assert!(get(&ok, "result").is_some(), "{ok:?}");
    assert_eq!(a.close_and_wait().await.code(), Some(0));
    let err = a.stderr().await;
    assert!(!err.contains("panicked"), "agent panicked: {err}");
}
