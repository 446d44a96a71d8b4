//! Relaying a job's connection to its destination: both directions at
//! once, each through one buffer of [`EGRESS_BUFFER_BYTES`], so a slow
//! reader slows the other side down instead of growing the agent.

use executor_protocol::limits::EGRESS_BUFFER_BYTES;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// Send `early` (what the job sent past the proxy handshake) upstream, then
/// relay until both sides are done.
pub(super) async fn run(mut job: TcpStream, mut upstream: TcpStream, early: &[u8]) {
    if !early.is_empty() && upstream.write_all(early).await.is_err() {
        return;
    }
    let _ = tokio::io::copy_bidirectional_with_sizes(
        &mut job,
        &mut upstream,
        EGRESS_BUFFER_BYTES,
        EGRESS_BUFFER_BYTES,
    )
    .await;
}
