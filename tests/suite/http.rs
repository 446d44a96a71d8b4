//! `http/request` against real HTTP servers on loopback (tests/src/http.rs),
//! through the real agent.

use executor_client::http::{HttpRequest, HttpResponse};
use executor_client::{Client, ErrorCode};
use executor_protocol::types::sandbox::{NetworkIntent, SandboxIntent};
use executor_tests::http::{TestCa, TestServer};
use executor_tests::{
    client_with_config, executor_bin, in_private_netns, local_client, prerequisite_missing, remote,
    status_kib, unique_tempdir,
};
use std::time::{Duration, Instant};

fn data_str<'a>(e: &'a executor_protocol::WireError, key: &str) -> Option<&'a str> {
    e.data_get(key).and_then(|v| v.as_str())
}

async fn fails(c: &Client, r: HttpRequest) -> executor_protocol::WireError {
    remote(c.http_request(r).await.expect_err("the request must fail"))
}

fn values<'a>(r: &'a HttpResponse, name: &'a str) -> Vec<&'a str> {
    r.header_values(name).collect()
}

#[tokio::test]
async fn get_and_post_echo_binary_bodies_and_repeated_headers() {
    let server = TestServer::start().await;
    let c = local_client().await;
    let body: Vec<u8> = (0..=255u8).cycle().take(4096).collect();
    let r = c
        .http_request(
            HttpRequest::new("POST", server.url("/echo"))
                .header("x-rep", "one")
                .header("X-Rep", "two")
                .header("x-rep", "three")
                .body(body.clone()),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(values(&r, "x-method"), ["POST"]);
    assert_eq!(values(&r, "x-version"), ["HTTP/1.1"]);
    assert_eq!(values(&r, "x-rep-echo"), ["one", "two", "three"]);
    assert_eq!(values(&r, "set-cookie"), ["a=1", "b=2"]);
    assert_eq!(r.url, server.url("/echo"));
    assert_eq!(r.body.bytes().await.unwrap(), body);

    let r = c
        .http_request(HttpRequest::get(server.url("/echo")))
        .await
        .unwrap();
    assert_eq!(values(&r, "x-method"), ["GET"]);
    assert!(r.body.bytes().await.unwrap().is_empty());
    c.close().await.unwrap();
}

/// A TLS test server with a certificate from a fresh test CA, and an agent
/// configured to trust that CA.
async fn tls_server_and_trusting_agent(tag: &str) -> (TestServer, Client) {
    let ca = TestCa::new(&unique_tempdir(tag));
    let server = TestServer::start_tls(&ca).await;
    let c = client_with_config(&format!(
        "[http]\nextra_ca_file = {:?}\n",
        ca.pem_path.to_str().unwrap()
    ))
    .await;
    (server, c)
}

#[tokio::test]
async fn https_uses_the_configured_ca_and_negotiates_http2() {
    let (server, c) = tls_server_and_trusting_agent("http-tls").await;
    // Without the test CA the certificate is not trusted.
    let plain = local_client().await;
    let e = fails(&plain, HttpRequest::get(server.url("/echo"))).await;
    assert_eq!(e.code, ErrorCode::HttpError, "{e:?}");
    assert_eq!(data_str(&e, "kind"), Some("tls"), "{e:?}");
    plain.close().await.unwrap();

    let r = c
        .http_request(HttpRequest::new("PUT", server.url("/echo")).body(&b"over tls"[..]))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(values(&r, "x-version"), ["HTTP/2.0"], "ALPN must pick h2");
    assert_eq!(r.body.bytes().await.unwrap(), b"over tls");
    // A URL with a fragment works over HTTP/2 too (the fragment stays local).
    let r = c
        .http_request(HttpRequest::get(server.url("/echo?q=1#section")))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    // Streamed over HTTP/2 as well.
    let mut r = c
        .http_request(HttpRequest::get(server.url("/chunks?n=50&size=3000")).stream(true))
        .await
        .unwrap();
    let mut got = Vec::new();
    while let Some(chunk) = r.body.next_chunk().await {
        got.extend_from_slice(&chunk.unwrap());
    }
    assert_eq!(got.len(), 150_000);
    c.close().await.unwrap();
}

#[tokio::test]
async fn a_streamed_chunked_body_arrives_in_order_and_complete() {
    let server = TestServer::start().await;
    let c = local_client().await;
    let mut r = c
        .http_request(
            HttpRequest::get(server.url("/chunks?n=300&size=10007&delay_ms=0")).stream(true),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert!(r.body.stream_id().is_some());
    let mut got = Vec::new();
    // The client checks every delta's seq; a gap or a reorder is an error.
    while let Some(chunk) = r.body.next_chunk().await {
        got.extend_from_slice(&chunk.unwrap());
    }
    let expected: Vec<u8> = (0..300u64)
        .flat_map(|i| std::iter::repeat_n((i % 251) as u8, 10007))
        .collect();
    assert_eq!(got.len(), expected.len());
    assert!(got == expected, "body content differs");
    c.close().await.unwrap();
}

#[tokio::test]
async fn bodies_over_the_limit_are_limit_exceeded() {
    let server = TestServer::start().await;
    let c = local_client().await;
    // Positive control: exactly at the limit.
    let r = c
        .http_request(HttpRequest::get(server.url("/bytes?n=1000")).max_response_bytes(1000))
        .await
        .unwrap();
    assert_eq!(r.body.bytes().await.unwrap().len(), 1000);
    // Over it, announced by content-length.
    let e = fails(
        &c,
        HttpRequest::get(server.url("/bytes?n=1001")).max_response_bytes(1000),
    )
    .await;
    assert_eq!(e.code, ErrorCode::LimitExceeded, "{e:?}");
    assert_eq!(data_str(&e, "limit"), Some("max_http_body_bytes"));
    // Over the default 8 MiB, chunked (no length: counted while reading).
    let e = fails(&c, HttpRequest::get(server.url("/bytes-chunked?n=9000000"))).await;
    assert_eq!(e.code, ErrorCode::LimitExceeded, "{e:?}");
    // Asking for more than the agent's cap.
    let e = fails(
        &c,
        HttpRequest::get(server.url("/bytes?n=1")).max_response_bytes(64 << 20),
    )
    .await;
    assert_eq!(e.code, ErrorCode::LimitExceeded, "{e:?}");
    assert_eq!(
        e.data_get("requested").and_then(|v| v.as_u64()),
        Some(64 << 20)
    );
    // Streamed: the stream ends with a limit_exceeded delta.
    let mut r = c
        .http_request(
            HttpRequest::get(server.url("/bytes-chunked?n=1000000"))
                .stream(true)
                .max_response_bytes(100_000),
        )
        .await
        .unwrap();
    let mut last = None;
    while let Some(chunk) = r.body.next_chunk().await {
        if let Err(e) = chunk {
            last = Some(remote(e));
        }
    }
    assert_eq!(last.expect("an error delta").code, ErrorCode::LimitExceeded);
    // The connection survives all of this.
    c.call(&executor_protocol::types::session::EnvironmentInfoParams {})
        .await
        .unwrap();
    c.close().await.unwrap();
}

#[tokio::test]
async fn a_slow_server_times_out_at_the_requested_deadline() {
    let server = TestServer::start().await;
    let c = local_client().await;
    let start = Instant::now();
    let e = fails(
        &c,
        HttpRequest::get(server.url("/slow?ms=10000")).timeout_ms(400),
    )
    .await;
    let took = start.elapsed();
    assert_eq!(e.code, ErrorCode::Timeout, "{e:?}");
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_secs(5),
        "timed out after {took:?}"
    );
    // Streamed: an idle gap past timeout_ms ends the stream with `timeout`.
    let mut r = c
        .http_request(
            HttpRequest::get(server.url("/chunks?n=3&size=10&delay_ms=3000"))
                .stream(true)
                .timeout_ms(500),
        )
        .await
        .unwrap();
    let first = r.body.next_chunk().await.unwrap().unwrap();
    assert_eq!(first.len(), 10);
    let e = remote(r.body.next_chunk().await.unwrap().unwrap_err());
    assert_eq!(e.code, ErrorCode::Timeout, "{e:?}");
    assert!(r.body.next_chunk().await.is_none());
    c.close().await.unwrap();
}

#[tokio::test]
async fn redirects_are_followed_only_when_asked() {
    let server = TestServer::start().await;
    let c = local_client().await;
    let to_echo = server.url("/redirect?code=302&to=/echo");
    let r = c.http_request(HttpRequest::get(&to_echo)).await.unwrap();
    assert_eq!(r.status, 302, "follow_redirects 0 returns the redirect");
    assert_eq!(values(&r, "location"), ["/echo"]);
    let r = c
        .http_request(HttpRequest::get(&to_echo).follow_redirects(1))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.url, server.url("/echo"));
    // Two hops with one allowed: the second redirect is the answer.
    let twice = server.url(&format!("/redirect?code=301&to={to_echo}"));
    let r = c
        .http_request(HttpRequest::get(&twice).follow_redirects(1))
        .await
        .unwrap();
    assert_eq!(r.status, 302);
    // 303 after POST becomes GET without body; 307 keeps both.
    for (code, method, body) in [(303, "GET", &b""[..]), (307, "POST", &b"form"[..])] {
        let r = c
            .http_request(
                HttpRequest::new(
                    "POST",
                    server.url(&format!("/redirect?code={code}&to=/echo")),
                )
                .body(&b"form"[..])
                .follow_redirects(1),
            )
            .await
            .unwrap();
        assert_eq!(values(&r, "x-method"), [method], "{code}");
        assert_eq!(r.body.bytes().await.unwrap(), body, "{code}");
    }
    c.close().await.unwrap();
}

#[tokio::test]
async fn credentials_are_dropped_on_a_cross_origin_redirect_only() {
    let server = TestServer::start().await;
    let c = local_client().await;
    let port = server.addr.port();
    let send = |url: String| {
        HttpRequest::get(url)
            .header("Authorization", "Bearer s3cret")
            .header("Cookie", "session=abc")
            .follow_redirects(1)
    };
    // Same origin: kept.
    let r = c
        .http_request(send(server.url("/redirect?code=302&to=/headers")))
        .await
        .unwrap();
    let text = String::from_utf8(r.body.bytes().await.unwrap()).unwrap();
    assert!(text.contains("authorization: Bearer s3cret"), "{text}");
    assert!(text.contains("cookie: session=abc"), "{text}");
    // Another origin (localhost is another host than 127.0.0.1): dropped.
    let r = c
        .http_request(send(server.url(&format!(
            "/redirect?code=302&to=http://localhost:{port}/headers"
        ))))
        .await
        .unwrap();
    assert_eq!(r.url, format!("http://localhost:{port}/headers"));
    let text = String::from_utf8(r.body.bytes().await.unwrap()).unwrap();
    assert!(!text.contains("authorization"), "{text}");
    assert!(!text.contains("cookie"), "{text}");
    c.close().await.unwrap();
}

#[tokio::test]
async fn an_https_to_http_redirect_is_refused() {
    let (tls, c) = tls_server_and_trusting_agent("http-downgrade").await;
    let plain = TestServer::start().await;
    let down = tls.url(&format!("/redirect?code=302&to={}", plain.url("/echo")));
    let e = fails(&c, HttpRequest::get(&down).follow_redirects(3)).await;
    assert_eq!(e.code, ErrorCode::PolicyDenied, "{e:?}");
    assert!(e.message.contains("https to http"), "{}", e.message);
    // Positive control: https to https is followed.
    let up = tls.url("/redirect?code=302&to=/echo");
    let r = c
        .http_request(HttpRequest::get(&up).follow_redirects(3))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    c.close().await.unwrap();
}

#[tokio::test]
async fn bad_urls_methods_and_headers_are_invalid_params() {
    let c = local_client().await;
    for (req, field) in [
        (HttpRequest::get("ftp://127.0.0.1/file"), "url"),
        (HttpRequest::get("not a url"), "url"),
        (HttpRequest::get("file:///etc/passwd"), "url"),
        (HttpRequest::get("http://user:pw@127.0.0.1/"), "url"),
        (HttpRequest::new("GE T", "http://127.0.0.1/"), "method"),
        (
            HttpRequest::get("http://127.0.0.1/").header("bad name", "v"),
            "headers.0",
        ),
        (
            HttpRequest::get("http://127.0.0.1/").header("x", "a\r\nb"),
            "headers.0",
        ),
        // Pseudo-headers are not header names: `:authority` comes from the URL.
        (
            HttpRequest::get("http://127.0.0.1/").header(":authority", "evil.example"),
            "headers.0",
        ),
        (
            HttpRequest::get("http://127.0.0.1/")
                .header("Host", "127.0.0.1")
                .header("host", "127.0.0.1"),
            "headers.1",
        ),
        (
            HttpRequest::get("http://127.0.0.1/").timeout_ms(0),
            "timeout_ms",
        ),
        (
            HttpRequest::get("http://127.0.0.1/").follow_redirects(1000),
            "follow_redirects",
        ),
    ] {
        let e = fails(&c, req).await;
        assert_eq!(e.code, ErrorCode::InvalidParams, "{field}: {e:?}");
        assert_eq!(data_str(&e, "field"), Some(field), "{e:?}");
    }
    let e = fails(&c, HttpRequest::get("ftp://127.0.0.1/file")).await;
    assert!(e.message.contains("ftp"), "{}", e.message);
    c.close().await.unwrap();
}

#[tokio::test]
async fn a_closed_port_is_http_error_connect() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let c = local_client().await;
    let e = fails(&c, HttpRequest::get(format!("http://127.0.0.1:{port}/"))).await;
    assert_eq!(e.code, ErrorCode::HttpError, "{e:?}");
    assert_eq!(data_str(&e, "kind"), Some("connect"));
    assert_eq!(
        e.data_get("errno").and_then(|v| v.as_i64()),
        Some(libc_econnrefused())
    );
    c.close().await.unwrap();
}

fn libc_econnrefused() -> i64 {
    nix::errno::Errno::ECONNREFUSED as i64
}

#[tokio::test]
async fn the_request_sandbox_intent_limits_the_network() {
    let server = TestServer::start().await;
    let port = server.addr.port();
    let c = local_client().await;
    // network "deny" (the intent's default): refused before connecting.
    let e = fails(
        &c,
        HttpRequest::get(server.url("/echo")).sandbox(SandboxIntent::default()),
    )
    .await;
    assert_eq!(e.code, ErrorCode::SandboxDenied, "{e:?}");
    assert_eq!(data_str(&e, "host"), Some("127.0.0.1"));
    assert!(data_str(&e, "rule").unwrap().contains("deny"), "{e:?}");
    // Only other ports allowed: refused, naming the port.
    let other = SandboxIntent {
        network: NetworkIntent::AllowTcpConnect(vec![port.wrapping_add(1)]),
        ..SandboxIntent::default()
    };
    let e = fails(&c, HttpRequest::get(server.url("/echo")).sandbox(other)).await;
    assert_eq!(e.code, ErrorCode::SandboxDenied, "{e:?}");
    assert!(e.message.contains(&port.to_string()), "{}", e.message);
    // Positive controls: this port allowed, and network "allow".
    let this = SandboxIntent {
        network: NetworkIntent::AllowTcpConnect(vec![port]),
        ..SandboxIntent::default()
    };
    let r = c
        .http_request(HttpRequest::get(server.url("/echo")).sandbox(this))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let open = SandboxIntent {
        network: NetworkIntent::Allow,
        ..SandboxIntent::default()
    };
    let r = c
        .http_request(HttpRequest::get(server.url("/echo")).sandbox(open))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    // A redirect to a port outside allow_tcp_connect is refused on the hop.
    let other_server = TestServer::start().await;
    let hop = SandboxIntent {
        network: NetworkIntent::AllowTcpConnect(vec![port]),
        ..SandboxIntent::default()
    };
    let e = fails(
        &c,
        HttpRequest::get(server.url(&format!(
            "/redirect?code=302&to={}",
            other_server.url("/echo")
        )))
        .follow_redirects(1)
        .sandbox(hop),
    )
    .await;
    assert_eq!(e.code, ErrorCode::SandboxDenied, "{e:?}");
    c.close().await.unwrap();
}

/// Accepts connections and counts them; answers nothing useful.
async fn counting_listener() -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = seen.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            drop(s);
        }
    });
    (port, seen)
}

/// A minimal CONNECT proxy; counts tunnels.
async fn connect_proxy() -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let count = count.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                while !head.ends_with(b"\r\n\r\n") {
                    head.push(s.read_u8().await.unwrap());
                }
                let text = String::from_utf8(head).unwrap();
                let target = text.split_whitespace().nth(1).unwrap().to_string();
                assert!(text.starts_with("CONNECT "), "{text}");
                let mut up = tokio::net::TcpStream::connect(&target).await.unwrap();
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                s.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    .await
                    .unwrap();
                let _ = tokio::io::copy_bidirectional(&mut s, &mut up).await;
            });
        }
    });
    (port, seen)
}

#[tokio::test]
async fn proxy_variables_of_the_agent_are_ignored_and_a_configured_proxy_is_used() {
    use std::sync::atomic::Ordering;
    let server = TestServer::start().await;
    let (trap, trapped) = counting_listener().await;
    let mut cmd = tokio::process::Command::new(executor_bin());
    let proxy = format!("http://127.0.0.1:{trap}");
    for var in [
        "HTTP_PROXY",
        "http_proxy",
        "HTTPS_PROXY",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
    ] {
        cmd.env(var, &proxy);
    }
    let c = Client::spawn(cmd, Default::default()).await.unwrap();
    let r = c
        .http_request(HttpRequest::get(server.url("/echo")))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    c.close().await.unwrap();
    assert_eq!(trapped.load(Ordering::SeqCst), 0, "HTTP_PROXY was used");

    // Positive control: a proxy named in the configuration is used.
    let (p, tunnels) = connect_proxy().await;
    let c = client_with_config(&format!("[http]\nproxy = \"http://127.0.0.1:{p}\"\n")).await;
    let r = c
        .http_request(HttpRequest::get(server.url("/echo")))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(tunnels.load(Ordering::SeqCst), 1);
    c.close().await.unwrap();
}

#[tokio::test]
async fn the_configured_allow_list_admits_only_its_destinations() {
    let server = TestServer::start().await;
    let port = server.addr.port();
    let c = client_with_config(&format!("[http]\nallow = [\"localhost:{port}\"]\n")).await;
    let r = c
        .http_request(HttpRequest::get(format!("http://localhost:{port}/echo")))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let e = fails(&c, HttpRequest::get(server.url("/echo"))).await;
    assert_eq!(e.code, ErrorCode::PolicyDenied, "{e:?}");
    assert_eq!(data_str(&e, "host"), Some("127.0.0.1"));
    assert!(
        data_str(&e, "rule").unwrap().contains("http.allow"),
        "{e:?}"
    );
    c.close().await.unwrap();

    let c = client_with_config("[http]\nallow = [\"127.0.0.0/8\"]\n").await;
    let r = c
        .http_request(HttpRequest::get(server.url("/echo")))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    c.close().await.unwrap();
}

/// Inside a network namespace of its own (only `lo`): metadata, link-local
/// and unspecified destinations, by address, mapped address, numeric form,
/// host name (an /etc/hosts entry in the agent's mount namespace) and
/// redirect, are refused at once, never attempted.
#[test]
fn metadata_and_link_local_destinations_are_refused_quickly() {
    let ran = in_private_netns(|| async {
        let server = TestServer::start().await;
        let c = agent_with_hosts(
            "http-hosts",
            "127.0.0.1 localhost\n169.254.169.254 metadata.test\n::ffff:169.254.169.254 mapped.test\n",
        )
        .await;
        // Positive control: loopback in this namespace works.
        let r = c
            .http_request(HttpRequest::get(server.url("/echo")))
            .await
            .unwrap();
        assert_eq!(r.status, 200);
        let port = server.addr.port();
        for url in [
            "http://169.254.169.254/latest/meta-data/".to_string(),
            "http://[::ffff:169.254.169.254]/".to_string(),
            "http://[::ffff:a9fe:a9fe]/".to_string(),
            "http://0xA9FEA9FE/".to_string(),
            "http://2852039166/".to_string(),
            "http://metadata.test/".to_string(),
            "http://mapped.test/".to_string(),
            "http://169.254.1.1/".to_string(),
            "http://[fe80::1]/".to_string(),
            "http://[fd00:ec2::254]/".to_string(),
            "http://100.100.100.200/".to_string(),
            format!("http://0.0.0.0:{port}/echo"),
            format!("http://[::]:{port}/echo"),
            server.url("/redirect?code=302&to=http://169.254.169.254/latest"),
            server.url("/redirect?code=302&to=http://metadata.test/"),
        ] {
            let start = Instant::now();
            let e = fails(
                &c,
                HttpRequest::get(&url)
                    .timeout_ms(20_000)
                    .follow_redirects(2),
            )
            .await;
            assert_eq!(e.code, ErrorCode::PolicyDenied, "{url}: {e:?}");
            assert!(data_str(&e, "rule").is_some(), "{url}: {e:?}");
            assert!(
                start.elapsed() < Duration::from_secs(3),
                "{url} took {:?}",
                start.elapsed()
            );
        }
        // A name neither in the hosts file nor resolvable here (no network):
        // `http_error` kind `dns`, quickly.
        let start = Instant::now();
        let e = fails(&c, HttpRequest::get("http://no-such-host.invalid/")).await;
        assert_eq!(e.code, ErrorCode::HttpError, "{e:?}");
        assert_eq!(data_str(&e, "kind"), Some("dns"), "{e:?}");
        assert!(start.elapsed() < Duration::from_secs(10));
        c.close().await.unwrap();
    });
    if !ran {
        prerequisite_missing("no network namespace (not root)");
    }
}

/// An agent whose `/etc/hosts` is `hosts` (bound over it in a mount
/// namespace of the agent's own), in the caller's network namespace.
async fn agent_with_hosts(tag: &str, hosts: &str) -> Client {
    let path = unique_tempdir(tag).join("hosts");
    std::fs::write(&path, hosts).unwrap();
    let mut cmd = tokio::process::Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg("mount --bind \"$0\" /etc/hosts && exec \"$1\"")
        .arg(&path)
        .arg(executor_bin());
    Client::spawn(cmd, Default::default()).await.unwrap()
}

/// Issue 14, item 7. Inside a network namespace of its own: every IPv6 form
/// that carries an IPv4 address is judged as that IPv4 address, whether the
/// URL writes it, a name resolves to it, or a redirect leads to it. Each
/// form of 169.254.169.254 is refused, naming the address and the IPv4 it
/// embeds; the same form of 127.0.0.1 (assigned to `lo` here, so a real
/// server answers on it) is reached.
#[test]
fn embedded_ipv4_forms_are_judged_as_the_ipv4_address_they_carry() {
    use std::net::IpAddr;
    let ran = in_private_netns(|| async {
        // (the form of 169.254.169.254, the same form of 127.0.0.1, data.embedding)
        let forms = [
            ("::ffff:169.254.169.254", "::ffff:127.0.0.1", "ipv4-mapped"),
            ("::ffff:0:a9fe:a9fe", "::ffff:0:7f00:1", "ipv4-translated"),
            ("::169.254.169.254", "::127.0.0.1", "ipv4-compatible"),
            ("64:ff9b::a9fe:a9fe", "64:ff9b::7f00:1", "nat64"),
            ("64:ff9b:1::a9fe:a9fe", "64:ff9b:1::7f00:1", "nat64-local"),
            ("2002:a9fe:a9fe::", "2002:7f00:1::1", "6to4"),
            // Teredo: the server is bits 32..64, the client the last 32
            // bits inverted (127.0.0.1 is 80ff:fffe, 169.254.169.254 is
            // 5601:5601).
            (
                "2001:0:a9fe:a9fe::80ff:fffe",
                "2001:0:7f00:1::80ff:fffe",
                "teredo-server",
            ),
            (
                "2001:0:7f00:1::5601:5601",
                "2001:0:7f00:1::80ff:fffe",
                "teredo-client",
            ),
        ];
        for (_, lo, _) in forms {
            // A mapped address is reached over IPv4; the others need `lo`
            // to hold them.
            if lo.starts_with("::ffff:127") {
                continue;
            }
            let st = std::process::Command::new("ip")
                .args(["-6", "addr", "replace", &format!("{lo}/128"), "dev", "lo"])
                .status()
                .expect("run ip (iproute2)");
            assert!(st.success(), "ip -6 addr replace {lo}/128 dev lo");
        }
        let server = TestServer::start_on("[::]:0").await;
        let port = server.addr.port();
        let mut hosts = String::from("127.0.0.1 localhost\n");
        for (i, (md, lo, _)) in forms.iter().enumerate() {
            hosts.push_str(&format!("{md} md{i}.test\n{lo} lo{i}.test\n"));
        }
        let c = agent_with_hosts("http-embedded", &hosts).await;
        for (i, (md, lo, embedding)) in forms.into_iter().enumerate() {
            let md_ip: IpAddr = md.parse().unwrap();
            for url in [
                format!("http://[{md}]:{port}/echo"),
                format!("http://md{i}.test:{port}/echo"),
                server.url(&format!(
                    "/redirect?code=302&to=http://md{i}.test:{port}/echo"
                )),
            ] {
                let e = fails(&c, HttpRequest::get(&url).follow_redirects(1)).await;
                assert_eq!(e.code, ErrorCode::PolicyDenied, "{url}: {e:?}");
                assert_eq!(
                    data_str(&e, "embedded_ipv4"),
                    Some("169.254.169.254"),
                    "{url}: {e:?}"
                );
                assert_eq!(data_str(&e, "embedding"), Some(embedding), "{url}: {e:?}");
                let address: IpAddr = data_str(&e, "address").unwrap().parse().unwrap();
                assert_eq!(address, md_ip, "{url}: {e:?}");
                assert!(
                    e.message
                        .contains(&format!("{md_ip} embeds 169.254.169.254")),
                    "{url}: {}",
                    e.message
                );
                assert!(
                    data_str(&e, "rule").unwrap().contains("cloud metadata"),
                    "{url}: {e:?}"
                );
            }
            // Positive control: the same form of loopback, by address and
            // by name, connects and is answered.
            for url in [
                format!("http://[{lo}]:{port}/echo"),
                format!("http://lo{i}.test:{port}/echo"),
            ] {
                let r = c
                    .http_request(HttpRequest::get(&url))
                    .await
                    .unwrap_or_else(|e| panic!("{url}: {e}"));
                assert_eq!(r.status, 200, "{url}");
            }
        }
        c.close().await.unwrap();
    });
    if !ran {
        eprintln!("skipped: no network namespace (not root)");
    }
}

/// Issue 14, item 7. A `Host` header (any case of the name) must name the
/// URL's authority, the host's case aside: another host or port is
/// `invalid_params` before any connection, with an allow list or without,
/// over HTTP/1.1 and HTTP/2.
#[tokio::test]
async fn a_host_header_naming_another_authority_is_refused_before_connecting() {
    use std::sync::atomic::Ordering;
    let (trap, trapped) = counting_listener().await;
    let c = client_with_config(&format!("[http]\nallow = [\"localhost:{trap}\"]\n")).await;
    let url = format!("http://localhost:{trap}/");
    for (name, value) in [
        ("Host", "evil.example".to_string()),
        ("host", format!("127.0.0.1:{trap}")),
        ("HOST", "localhost".to_string()),
        ("hOsT", format!("localhost:{}", trap.wrapping_add(1))),
    ] {
        let e = fails(&c, HttpRequest::get(&url).header(name, &value)).await;
        assert_eq!(e.code, ErrorCode::InvalidParams, "{name}: {value}: {e:?}");
        assert_eq!(data_str(&e, "field"), Some("headers.0"), "{e:?}");
        for part in [name, value.as_str(), &format!("localhost:{trap}")] {
            assert!(
                e.message.contains(&format!("{part:?}")),
                "{part}: {}",
                e.message
            );
        }
    }
    assert_eq!(trapped.load(Ordering::SeqCst), 0, "a connection was made");
    c.close().await.unwrap();

    // Positive control: the URL's authority, in another case, is sent as
    // given.
    let server = TestServer::start().await;
    let port = server.addr.port();
    let c = client_with_config(&format!("[http]\nallow = [\"localhost:{port}\"]\n")).await;
    let r = c
        .http_request(
            HttpRequest::get(format!("http://localhost:{port}/headers"))
                .header("host", format!("LocalHost:{port}")),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let text = String::from_utf8(r.body.bytes().await.unwrap()).unwrap();
    assert!(
        text.contains(&format!("host: LocalHost:{port}\n")),
        "{text}"
    );
    c.close().await.unwrap();

    // Without an allow list the rule holds too.
    let c = local_client().await;
    let e = fails(
        &c,
        HttpRequest::get(server.url("/headers")).header("Host", "metadata.google.internal"),
    )
    .await;
    assert_eq!(e.code, ErrorCode::InvalidParams, "{e:?}");
    let r = c
        .http_request(
            HttpRequest::get(server.url("/headers")).header("Host", format!("127.0.0.1:{port}")),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    c.close().await.unwrap();

    // HTTP/2 (`:authority` from the URL; a `Host` must agree with it).
    let (tls, c) = tls_server_and_trusting_agent("http-host-h2").await;
    let url = tls.url("/echo");
    let e = fails(&c, HttpRequest::get(&url).header("host", "evil.example")).await;
    assert_eq!(e.code, ErrorCode::InvalidParams, "{e:?}");
    let r = c
        .http_request(
            HttpRequest::get(&url).header("Host", format!("LOCALHOST:{}", tls.addr.port())),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(values(&r, "x-version"), ["HTTP/2.0"]);
    c.close().await.unwrap();
}

#[tokio::test]
async fn streams_are_bounded_per_session_and_can_be_cancelled() {
    let server = TestServer::start().await;
    let c = local_client().await;
    let max = c.initialize_result().limits.max_http_streams as usize;
    let mut open = Vec::new();
    for _ in 0..max {
        let r = c
            .http_request(
                HttpRequest::get(server.url("/chunks?n=100&size=10&delay_ms=1000")).stream(true),
            )
            .await
            .unwrap();
        open.push(r);
    }
    let e = fails(&c, HttpRequest::get(server.url("/echo")).stream(true)).await;
    assert_eq!(e.code, ErrorCode::LimitExceeded, "{e:?}");
    assert_eq!(data_str(&e, "limit"), Some("max_http_streams"));
    // A buffered request is not a stream: still served.
    let r = c
        .http_request(HttpRequest::get(server.url("/echo")))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    // Cancel one: its body ends with `cancelled`, and its slot is free.
    let mut first = open.remove(0);
    first.body.cancel().await.unwrap();
    let mut last = None;
    while let Some(chunk) = first.body.next_chunk().await {
        if let Err(e) = chunk {
            last = Some(remote(e));
        }
    }
    assert_eq!(last.expect("a final error").code, ErrorCode::Cancelled);
    let r = c
        .http_request(HttpRequest::get(server.url("/chunks?n=2&size=5")).stream(true))
        .await
        .unwrap();
    assert_eq!(r.body.bytes().await.unwrap().len(), 10);
    // Cancelling a stream that is gone is `unknown_stream`.
    let e = remote(
        c.request::<_, executor_protocol::types::Empty>(
            executor_protocol::methods::HTTP_CANCEL,
            &executor_protocol::types::http::HttpCancelParams { stream_id: 999_999 },
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code, ErrorCode::UnknownStream);
    drop(open);
    c.close().await.unwrap();
}

#[tokio::test]
async fn a_hundred_concurrent_streams_complete_with_bounded_agent_memory() {
    let server = TestServer::start().await;
    let c = client_with_config("[limits]\nmax_http_streams = 128\n").await;
    let pid = c.transport_pid().expect("agent pid");
    let mut tasks = Vec::new();
    for i in 0..100u64 {
        let c = c.clone();
        let url = server.url(&format!("/chunks?n={}&size=65536&delay_ms=1", 48 + i % 8));
        tasks.push(tokio::spawn(async move {
            let mut r = c
                .http_request(HttpRequest::get(url).stream(true))
                .await
                .unwrap();
            let mut total = 0usize;
            while let Some(chunk) = r.body.next_chunk().await {
                total += chunk.unwrap().len();
            }
            total
        }));
    }
    let mut sum = 0usize;
    for (i, t) in tasks.into_iter().enumerate() {
        let got = t.await.unwrap();
        assert_eq!(got, (48 + i % 8) * 65536, "stream {i}");
        sum += got;
    }
    let peak = status_kib(pid, "VmHWM");
    eprintln!(
        "100 streams, {} MiB in all: agent peak RSS {peak} KiB",
        sum >> 20
    );
    assert!(
        peak > 0 && peak < 96 * 1024,
        "agent peak RSS {peak} KiB for 100 concurrent streams"
    );
    c.close().await.unwrap();
}

/// A client that stops reading its side: the agent stops reading from the
/// server (the server produces little of the 1 GiB) and its memory stays
/// bounded; once the client reads again, the stream goes on in order.
#[tokio::test]
async fn a_client_that_stops_reading_slows_the_server_not_the_agents_memory() {
    use executor_tests::{get, RawAgent};
    use std::sync::atomic::Ordering;
    let server = TestServer::start().await;
    let mut a = RawAgent::initialized().await;
    let pid = a.child.id().unwrap();
    let params = executor_protocol::types::http::HttpRequestParams {
        method: "GET".into(),
        url: server.url(&format!("/bytes-chunked?n={}", 1u64 << 30)),
        headers: vec![],
        body: None,
        timeout_ms: 30_000,
        stream: true,
        max_response_bytes: None,
        follow_redirects: 0,
        sandbox: None,
        env_headers: vec![],
    };
    a.send_request(2, executor_protocol::methods::HTTP_REQUEST, &params)
        .await;
    // Read nothing for a while.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let produced = server.sent.load(Ordering::Relaxed);
    let rss = status_kib(pid, "VmRSS");
    eprintln!(
        "stalled client: server produced {} MiB, agent RSS {rss} KiB",
        produced >> 20
    );
    assert!(
        produced < 64 << 20,
        "server produced {produced} bytes for a stalled client"
    );
    assert!(rss > 0 && rss < 64 * 1024, "agent RSS {rss} KiB");
    // Read again: the head, then deltas in order.
    let head = a.response(2).await;
    let stream_id = get(get(&head, "result").unwrap(), "stream_id")
        .unwrap()
        .as_u64()
        .unwrap();
    let mut seq = 0;
    let mut got = 0u64;
    while got < 32 << 20 {
        let note = a.recv().await.expect("a delta");
        let params = get(&note, "params").unwrap();
        assert_eq!(get(params, "stream_id").unwrap().as_u64(), Some(stream_id));
        assert_eq!(get(params, "seq").unwrap().as_u64(), Some(seq));
        seq += 1;
        got += get(params, "data").unwrap().as_slice().unwrap().len() as u64;
    }
    assert!(
        server.sent.load(Ordering::Relaxed) > produced,
        "reading resumed the server"
    );
    a.close_and_wait().await;
}

#[tokio::test]
async fn an_sse_stream_outlives_its_idle_timeout_and_delivers_every_event() {
    let server = TestServer::start().await;
    let c = local_client().await;
    let mut r = c
        .http_request(
            HttpRequest::get(server.url("/sse?events=30&interval_ms=1000"))
                .stream(true)
                .timeout_ms(5000),
        )
        .await
        .unwrap();
    assert_eq!(values(&r, "content-type"), ["text/event-stream"]);
    let mut text = String::new();
    while let Some(chunk) = r.body.next_chunk().await {
        text.push_str(
            std::str::from_utf8(&chunk.expect("no error: the stream ends cleanly")).unwrap(),
        );
    }
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    let expected: Vec<String> = (0..30).map(|i| format!("data: {i}")).collect();
    assert_eq!(events, expected);
    c.close().await.unwrap();
}

#[tokio::test]
async fn the_cli_streams_a_body_to_stdout() {
    let server = TestServer::start().await;
    let dir = unique_tempdir("http-cli");
    let body = dir.join("body.bin");
    std::fs::write(&body, b"posted bytes\x00\xff").unwrap();
    let client_bin = executor_bin().with_file_name("executor-client");
    let out = tokio::process::Command::new(&client_bin)
        .args([
            "http", "-X", "POST", "-H", "x-rep: a", "-H", "x-rep: b", "-i", "--data",
        ])
        .arg(format!("@{}", body.display()))
        .arg(server.url("/echo"))
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, b"posted bytes\x00\xff");
    let head = String::from_utf8_lossy(&out.stderr);
    assert!(head.starts_with("200 "), "{head}");
    assert!(head.contains("x-rep-echo: a\nx-rep-echo: b\n"), "{head}");
    // A 404 exits 22 (curl's); a refused destination fails with the agent's message.
    let out = tokio::process::Command::new(&client_bin)
        .args(["http", &server.url("/nope")])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(22));
    let out = tokio::process::Command::new(&client_bin)
        .args(["http", "http://169.254.169.254/"])
        .env("RUST_BACKTRACE", "0")
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("policy_denied") && err.contains("169.254.169.254"),
        "{err}"
    );
}

/// `env_headers`: a header's value read from the agent's own environment
/// (the secret never crosses the wire). Without a configuration any
/// variable but the executor's own credentials (`policy_denied`, any case);
/// under a profile only what its `http.header_env` names (none without
/// it); a missing variable and a `Host` from a variable are
/// `invalid_params` that never echo a value. Each refusal comes before
/// any connection.
#[tokio::test]
async fn env_headers_read_the_agents_environment_under_the_configured_rule() {
    let server = TestServer::start().await;
    let dir = unique_tempdir("http-env-headers");
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        "[profiles.bare]\n[profiles.tokens.http]\nheader_env = [\"EXEC_T_TOK*\"]\n\
         [profiles.bound.http]\nheader_env = [{ env = \"EXEC_T_TOKEN\", to = [\"127.0.0.1\"] }]\n",
    )
    .unwrap();
    let secret = "s3cret-env-header";
    let agent = |profile: Option<&str>| {
        let mut cmd = tokio::process::Command::new(executor_bin());
        cmd.env("EXEC_T_TOKEN", secret)
            .env("EXEC_T_OTHER", "other-s3cret")
            .env("AWS_SECRET_ACCESS_KEY", "aws-s3cret")
            .env_remove("EXEC_T_MISSING");
        if let Some(p) = profile {
            cmd.arg("--config").arg(&config).args(["--profile", p]);
        }
        Client::spawn(cmd, executor_client::ClientOptions::default())
    };
    let get = |var: &str| {
        HttpRequest::get(server.url("/headers")).header_from_env("Authorization", var, "Bearer ")
    };
    let body = |r: HttpResponse| async move {
        String::from_utf8(r.body.bytes().await.unwrap().to_vec()).unwrap()
    };
    let c = agent(None).await.unwrap();
    let seen = body(c.http_request(get("EXEC_T_TOKEN")).await.unwrap()).await;
    assert!(
        seen.contains(&format!("authorization: Bearer {secret}\n")),
        "{seen}"
    );
    for var in [
        "AWS_SECRET_ACCESS_KEY",
        "aws_secret_access_key",
        "OPENAI_API_KEY",
    ] {
        let e = fails(&c, get(var)).await;
        assert_eq!(e.code, ErrorCode::PolicyDenied, "{var}: {e}");
        assert!(e.message.contains("the executor's own credentials"), "{e}");
    }
    let e = fails(&c, get("EXEC_T_MISSING")).await;
    assert_eq!(e.code, ErrorCode::InvalidParams, "{e}");
    assert!(e.message.contains("EXEC_T_MISSING"), "{e}");
    let e = fails(
        &c,
        HttpRequest::get(server.url("/headers")).header_from_env("Host", "EXEC_T_TOKEN", ""),
    )
    .await;
    assert_eq!(e.code, ErrorCode::InvalidParams, "{e}");
    assert!(!e.message.contains(secret), "{e}");
    // A header from the environment is a credential: a redirect to
    // another origin drops it (whatever its name), one to the same origin
    // keeps it (positive control).
    let other = TestServer::start().await;
    for (to, kept) in [
        (other.url("/headers"), false),
        (server.url("/headers"), true),
    ] {
        let r = c
            .http_request(
                HttpRequest::get(server.url(&format!("/redirect?code=302&to={to}")))
                    .header_from_env("X-Api-Key", "EXEC_T_TOKEN", "")
                    .follow_redirects(1),
            )
            .await
            .unwrap();
        assert_eq!(r.url, to);
        let seen = body(r).await;
        assert_eq!(seen.contains(secret), kept, "to {to}: {seen}");
    }
    c.close().await.unwrap();

    let c = agent(Some("bare")).await.unwrap();
    let e = fails(&c, get("EXEC_T_TOKEN")).await;
    assert_eq!(e.code, ErrorCode::PolicyDenied, "{e}");
    assert!(e.message.contains("profile bare names no variable"), "{e}");
    c.close().await.unwrap();

    let c = agent(Some("tokens")).await.unwrap();
    let seen = body(c.http_request(get("EXEC_T_TOKEN")).await.unwrap()).await;
    assert!(
        seen.contains(&format!("authorization: Bearer {secret}\n")),
        "{seen}"
    );
    let e = fails(&c, get("EXEC_T_OTHER")).await;
    assert_eq!(e.code, ErrorCode::PolicyDenied, "{e}");
    assert!(!e.message.contains("other-s3cret"), "{e}");
    c.close().await.unwrap();

    // Bound to its destinations: there (positive control), not to the
    // same server named otherwise.
    let c = agent(Some("bound")).await.unwrap();
    let seen = body(c.http_request(get("EXEC_T_TOKEN")).await.unwrap()).await;
    assert!(seen.contains(secret), "{seen}");
    let elsewhere = server.url("/headers").replace("127.0.0.1", "localhost");
    let e = fails(
        &c,
        HttpRequest::get(elsewhere).header_from_env("Authorization", "EXEC_T_TOKEN", "Bearer "),
    )
    .await;
    assert_eq!(e.code, ErrorCode::PolicyDenied, "{e}");
    assert!(e.message.contains("may not go to"), "{e}");
    c.close().await.unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A server on loopback that answers each connection with a chunked body
/// streamed forever (a chunk every 50 ms) and reports, for each, when the
/// peer closed the connection (its read side saw EOF or an error).
fn endless_stream_server() -> (String, std::sync::mpsc::Receiver<Instant>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/forever", listener.local_addr().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut reader = conn.try_clone().unwrap();
                let mut writer = conn;
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match reader.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                std::thread::spawn(move || {
                    let _ = writer.write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                          transfer-encoding: chunked\r\n\r\n",
                    );
                    while writer.write_all(b"8\r\ndata: x\n\r\n").is_ok() {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                });
                // The agent sends nothing more: a read returns at its close.
                loop {
                    match reader.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                }
                let _ = tx.send(Instant::now());
            });
        }
    });
    (url, rx)
}

#[tokio::test]
async fn a_streamed_body_dropped_before_its_end_closes_the_upstream_connection() {
    let (url, closed) = endless_stream_server();
    let c = client_with_config("[limits]\nmax_http_streams = 1\n").await;
    let mut r = c
        .http_request(HttpRequest::get(&url).stream(true))
        .await
        .unwrap();
    let first = r.body.next_chunk().await.unwrap().unwrap();
    assert_eq!(&first[..], b"data: x\n");
    // Held, the stream stays open (the control: nothing closes it by itself).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(closed.try_recv().is_err(), "the upstream closed early");
    let e = fails(&c, HttpRequest::get(&url).stream(true)).await;
    assert_eq!(data_str(&e, "limit"), Some("max_http_streams"), "{e:?}");
    let dropped = Instant::now();
    drop(r);
    let at = tokio::task::spawn_blocking(move || closed.recv_timeout(Duration::from_secs(10)))
        .await
        .unwrap()
        .expect("the upstream connection outlived the dropped body by 10 s");
    assert!(at - dropped < Duration::from_secs(10));
    // The stream's slot is free again.
    let mut again = c
        .http_request(HttpRequest::get(&url).stream(true))
        .await
        .expect("a stream after the dropped one");
    assert!(again.body.next_chunk().await.unwrap().is_ok());
    drop(again);
    c.close().await.unwrap();
}
