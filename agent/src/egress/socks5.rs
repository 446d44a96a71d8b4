//! The SOCKS5 side of a job's proxy (RFC 1928): no authentication,
//! `CONNECT` only, to a domain name, an IPv4 or an IPv6 address.
//!
//! Replies: `0x00` connected; `0x01` past `max_egress_connections`; `0x02`
//! not allowed (by the intent, the client, or the destination policy; an
//! invalid name too); `0x04` the name did not resolve; `0x05` the
//! connection was refused; `0x07` a command other than `CONNECT`; `0x08`
//! an unknown address type.

use super::{relay, Ctx, Refused, HANDSHAKE_TIMEOUT};
use executor_protocol::types::network::EgressProtocol;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub(super) const VERSION: u8 = 0x05;
const NO_AUTH: u8 = 0x00;
const NO_ACCEPTABLE: u8 = 0xff;
const CONNECT: u8 = 0x01;

fn reply(code: u8) -> [u8; 10] {
    [VERSION, code, 0, 0x01, 0, 0, 0, 0, 0, 0]
}

fn code_of(r: &Refused) -> u8 {
    match r {
        Refused::Limit(_) => 0x01,
        Refused::NotAllowed
        | Refused::Policy(_)
        | Refused::Invalid(_)
        | Refused::HostMismatch(_) => 0x02,
        Refused::Unresolved(_) => 0x04,
        Refused::ConnectFailed(_) => 0x05,
    }
}

/// The destination of a CONNECT request: host text and port; `Err` is the
/// reply code to send.
async fn read_request(s: &mut TcpStream) -> std::io::Result<Result<(String, u16), u8>> {
    let mut greeting = [0u8; 2];
    s.read_exact(&mut greeting).await?;
    let mut methods = vec![0u8; usize::from(greeting[1])];
    s.read_exact(&mut methods).await?;
    if !methods.contains(&NO_AUTH) {
        s.write_all(&[VERSION, NO_ACCEPTABLE]).await?;
        return Ok(Err(NO_ACCEPTABLE));
    }
    s.write_all(&[VERSION, NO_AUTH]).await?;
    let mut head = [0u8; 4];
    s.read_exact(&mut head).await?;
    if head[0] != VERSION {
        return Ok(Err(0x01));
    }
    let host = match head[3] {
        0x01 => {
            let mut a = [0u8; 4];
            s.read_exact(&mut a).await?;
            Ipv4Addr::from(a).to_string()
        }
        0x03 => {
            let mut len = [0u8; 1];
            s.read_exact(&mut len).await?;
            let mut name = vec![0u8; usize::from(len[0])];
            s.read_exact(&mut name).await?;
            match String::from_utf8(name) {
                Ok(n) => n,
                Err(_) => return Ok(Err(0x02)),
            }
        }
        0x04 => {
            let mut a = [0u8; 16];
            s.read_exact(&mut a).await?;
            format!("[{}]", Ipv6Addr::from(a))
        }
        _ => return Ok(Err(0x08)),
    };
    let mut port = [0u8; 2];
    s.read_exact(&mut port).await?;
    if head[1] != CONNECT {
        return Ok(Err(0x07));
    }
    Ok(Ok((host, u16::from_be_bytes(port))))
}

pub(super) async fn serve(ctx: &Arc<Ctx>, mut job: TcpStream, over_limit: bool) {
    let asked = match tokio::time::timeout(HANDSHAKE_TIMEOUT, read_request(&mut job)).await {
        Ok(Ok(r)) => r,
        _ => return,
    };
    let (host, port) = match asked {
        Ok(d) => d,
        Err(NO_ACCEPTABLE) => return,
        Err(code) => {
            let _ = job.write_all(&reply(code)).await;
            return;
        }
    };
    if over_limit {
        let _ = job.write_all(&reply(0x01)).await;
        return;
    }
    match ctx.open(&host, port, EgressProtocol::Socks5).await {
        Ok(upstream) => {
            let mut ok = reply(0x00);
            if let Ok(std::net::SocketAddr::V4(local)) = upstream.local_addr() {
                ok[4..8].copy_from_slice(&local.ip().octets());
                ok[8..10].copy_from_slice(&local.port().to_be_bytes());
            }
            if job.write_all(&ok).await.is_ok() {
                relay::run(job, upstream, &[]).await;
            }
        }
        Err((canon, refused)) => {
            tracing::debug!(process_id = %ctx.job.process_id, reason = %refused.text(&canon.to_string(), port), "socks5 refused");
            let _ = job.write_all(&reply(code_of(&refused))).await;
        }
    }
}
