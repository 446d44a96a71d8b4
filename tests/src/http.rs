//! A real HTTP server on loopback for the HTTP suite: HTTP/1.1 and HTTP/2
//! (ALPN) on hyper, optionally TLS with a certificate from a test CA.
//!
//! Routes (query parameters are `k=v` pairs; `to` must come last):
//! - `/echo`: the request body back; `x-method`, `x-version`, each `x-rep`
//!   request header echoed as `x-rep-echo` (in order), two `set-cookie`s.
//! - `/headers`: the request headers, one `name: value` line each.
//! - `/bytes?n=N`: N bytes with a `content-length`; `/bytes-chunked?n=N`
//!   the same, chunked (no length).
//! - `/chunks?n=N&size=S&delay_ms=D`: N chunks of S bytes (chunk i is all
//!   `i % 251`), D ms apart.
//! - `/slow?ms=N`: the head after N ms.
//! - `/redirect?code=C&to=URL`: a redirect.
//! - `/sse?events=N&interval_ms=M`: `text/event-stream`, `data: i` events.

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

type Body = BoxBody<Bytes, Infallible>;

/// A CA for the test, and a server certificate for `localhost`/127.0.0.1.
#[derive(Debug)]
pub struct TestCa {
    /// The CA certificate (PEM), for the agent's `http.extra_ca_file`.
    pub pem_path: PathBuf,
    server: Arc<rustls::ServerConfig>,
}

impl TestCa {
    pub fn new(dir: &std::path::Path) -> TestCa {
        TestCa::with_names(dir, &["localhost", "127.0.0.1"])
    }

    /// A CA whose server certificate is for `names` (DNS names or
    /// addresses).
    pub fn with_names(dir: &std::path::Path, names: &[&str]) -> TestCa {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
        };
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "executor test CA");
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca.self_signed(&ca_key).expect("self-sign the CA");
        let issuer = Issuer::new(ca, ca_key);
        let leaf_key = KeyPair::generate().expect("leaf key");
        let leaf = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .expect("leaf params");
        let leaf_cert = leaf.signed_by(&leaf_key, &issuer).expect("sign the leaf");
        let pem_path = dir.join("test-ca.pem");
        std::fs::write(&pem_path, ca_cert.pem()).expect("write the CA");
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into());
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(vec![leaf_cert.der().clone()], key)
            .expect("server certificate");
        server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        TestCa {
            pem_path,
            server: Arc::new(server),
        }
    }
}

/// A running server; stops when dropped.
#[derive(Debug)]
pub struct TestServer {
    pub addr: SocketAddr,
    /// Body bytes the server has handed to its connections so far (a
    /// streamed body is produced only as fast as the peer reads it).
    pub sent: Arc<AtomicU64>,
    tls: bool,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestServer {
    /// Plain HTTP on 127.0.0.1.
    pub async fn start() -> TestServer {
        TestServer::bind("127.0.0.1:0", None).await
    }

    /// Plain HTTP on `addr` (`[::]:0`: every local address, IPv4 and IPv6,
    /// on one port); `url` still names 127.0.0.1.
    pub async fn start_on(addr: &str) -> TestServer {
        TestServer::bind(addr, None).await
    }

    /// HTTPS on 127.0.0.1 with a certificate from `ca` (for `localhost`).
    pub async fn start_tls(ca: &TestCa) -> TestServer {
        TestServer::bind(
            "127.0.0.1:0",
            Some(tokio_rustls::TlsAcceptor::from(ca.server.clone())),
        )
        .await
    }

    async fn bind(addr: &str, tls: Option<tokio_rustls::TlsAcceptor>) -> TestServer {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .expect("bind the test server");
        let addr = listener.local_addr().expect("local addr");
        let is_tls = tls.is_some();
        let sent = Arc::new(AtomicU64::new(0));
        let counter = sent.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let tls = tls.clone();
                let counter = counter.clone();
                tokio::spawn(async move {
                    let builder =
                        hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    let service =
                        hyper::service::service_fn(move |req| route(req, counter.clone()));
                    let _ = match tls {
                        Some(acceptor) => match acceptor.accept(tcp).await {
                            Ok(s) => builder.serve_connection(TokioIo::new(s), service).await,
                            Err(_) => return,
                        },
                        None => builder.serve_connection(TokioIo::new(tcp), service).await,
                    };
                });
            }
        });
        TestServer {
            addr,
            sent,
            tls: is_tls,
            task,
        }
    }

    /// `http://127.0.0.1:PORT/path`, or `https://localhost:PORT/path`.
    pub fn url(&self, path: &str) -> String {
        if self.tls {
            format!("https://localhost:{}{path}", self.addr.port())
        } else {
            format!("http://127.0.0.1:{}{path}", self.addr.port())
        }
    }
}

fn query<'a>(req: &'a Request<Incoming>, key: &str) -> Option<&'a str> {
    let q = req.uri().query()?;
    if key == "to" {
        return q.split_once("to=").map(|(_, v)| v);
    }
    q.split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

fn num(req: &Request<Incoming>, key: &str, default: u64) -> u64 {
    query(req, key)
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).boxed()
}

/// A body of `n` chunks made by `make(i)`, produced `delay` apart and only
/// when the connection asks for more; `sent` counts them.
fn chunked(
    n: u64,
    make: impl Fn(u64) -> Bytes + Send + Sync + 'static,
    delay: Duration,
    sent: Arc<AtomicU64>,
) -> Body {
    let make = Arc::new(make);
    let stream = futures_util::stream::unfold(0u64, move |i| {
        let make = make.clone();
        let sent = sent.clone();
        async move {
            if i >= n {
                return None;
            }
            if i > 0 && !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let chunk = make(i);
            sent.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            Some((Ok::<_, Infallible>(Frame::data(chunk)), i + 1))
        }
    });
    StreamBody::new(stream).boxed()
}

async fn route(req: Request<Incoming>, sent: Arc<AtomicU64>) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path().to_string();
    let response = match path.as_str() {
        "/echo" => {
            let mut r = Response::builder()
                .header("x-method", req.method().as_str())
                .header("x-version", format!("{:?}", req.version()));
            for v in req.headers().get_all("x-rep") {
                r = r.header("x-rep-echo", v.clone());
            }
            r = r.header("set-cookie", "a=1").header("set-cookie", "b=2");
            let body = req
                .into_body()
                .collect()
                .await
                .map(|c| c.to_bytes())
                .unwrap_or_default();
            r.body(full(body))
        }
        "/headers" => {
            let text: String = req
                .headers()
                .iter()
                .map(|(k, v)| format!("{k}: {}\n", String::from_utf8_lossy(v.as_bytes())))
                .collect();
            Response::builder().body(full(text))
        }
        "/bytes" => {
            let n = num(&req, "n", 0) as usize;
            Response::builder().body(full(vec![b'x'; n]))
        }
        "/bytes-chunked" => {
            let n = num(&req, "n", 0);
            let make = move |i: u64| Bytes::from(vec![b'y'; (n - i * 65536).min(65536) as usize]);
            Response::builder().body(chunked(n.div_ceil(65536), make, Duration::ZERO, sent))
        }
        "/chunks" => {
            let n = num(&req, "n", 10);
            let size = num(&req, "size", 1024) as usize;
            let delay = Duration::from_millis(num(&req, "delay_ms", 0));
            let make = move |i: u64| Bytes::from(vec![(i % 251) as u8; size]);
            Response::builder().body(chunked(n, make, delay, sent))
        }
        "/slow" => {
            tokio::time::sleep(Duration::from_millis(num(&req, "ms", 1000))).await;
            Response::builder().body(full("late"))
        }
        "/redirect" => {
            let to = query(&req, "to").unwrap_or("/").to_string();
            Response::builder()
                .status(num(&req, "code", 302) as u16)
                .header("location", to)
                .body(full("moved"))
        }
        "/sse" => {
            let n = num(&req, "events", 3);
            let interval = Duration::from_millis(num(&req, "interval_ms", 1000));
            let make = |i: u64| Bytes::from(format!("data: {i}\n\n"));
            Response::builder()
                .header("content-type", "text/event-stream")
                .body(chunked(n, make, interval, sent))
        }
        _ => Response::builder().status(404).body(full("no such route")),
    };
    Ok(response.expect("a valid response"))
}
