//! Every bound of the protocol, as named constants, each with why it is that
//! number. The agent enforces them; [`Limits`] is what `initialize` reports.

use serde::{Deserialize, Serialize};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// 16 MiB: a 1 MiB block plus envelope fits many times over, while one frame
/// can never claim more than a small, fixed share of the agent's memory.
pub const MAX_FRAME_BYTES: u64 = 16 * MIB;
/// Far more concurrency than an orchestrator needs; bounds the per-request
/// task memory of a client that pipelines without reading answers.
pub const MAX_REQUESTS_IN_FLIGHT: u64 = 4096;
/// Payload bytes of requests being handled at once, per connection (their
/// frames as received): past it the agent stops reading the transport until
/// handlers finish (back-pressure; answers and notifications keep flowing).
/// Without it the bound would be `max_requests_in_flight` × `max_frame_bytes`.
pub const MAX_INFLIGHT_REQUEST_BYTES: u64 = 64 * MIB;
/// Per session: a runaway orchestrator cannot fork-bomb the host through us.
pub const MAX_PROCESSES: u64 = 1024;
/// Retained output per process by default: enough for a long build log tail.
pub const OUTPUT_BUFFER_BYTES: u64 = MIB;
/// The most a request may ask for per process (`output_buffer_bytes`).
pub const MAX_OUTPUT_BUFFER_BYTES: u64 = 64 * MIB;
/// One `process/output` chunk: a pipe read's worth, small enough to interleave.
pub const MAX_OUTPUT_CHUNK_BYTES: u64 = 64 * KIB;
/// Open file handles per session, like a conservative `ulimit -n` share.
pub const MAX_OPEN_FILES: u64 = 128;
/// One `fs/readBlock`/`fs/writeBlock`: big enough for full pipe throughput
/// with a few in flight, 1/16 of a frame.
pub const MAX_BLOCK_BYTES: u64 = MIB;
/// Bytes one `fs/readStream` may have sent ahead of the client's
/// `fs/readCredit` (its window): 16 blocks, enough to hide a round trip at
/// wire speed, while the data a stream keeps queued stays a small share of
/// the agent's memory.
pub const MAX_READ_CREDIT_BYTES: u64 = 16 * MIB;
/// Concurrent `fs/readStream`s per session: each holds an open file and up
/// to its credit of queued data, so at most 32 × 16 MiB.
pub const MAX_READ_STREAMS: u64 = 32;
/// `fs/readFile` answers in one frame; bigger files stream via `fs/open`.
pub const MAX_READ_FILE_BYTES: u64 = 8 * MIB;
/// Entries in one `fs/walk` answer (continue with `next_cursor`).
pub const MAX_WALK_ENTRIES: u64 = 100_000;
/// Encoded bytes of one `fs/walk` answer: below the frame limit with margin.
pub const MAX_WALK_RESPONSE_BYTES: u64 = 12 * MIB;
/// Directories read per `fs/walk` request: bounds the time of one request.
pub const MAX_WALK_DIRECTORIES: u64 = 10_000;
/// File bytes one `fs/copy` copies: it holds a blocking thread until done
/// (it runs to its end), so a few seconds to a minute of disk time.
pub const MAX_COPY_BYTES: u64 = 4 * 1024 * MIB;
/// Directory levels one `fs/copy` descends: it holds two descriptors per
/// level, far below the descriptor limit.
pub const MAX_COPY_DEPTH: u64 = 128;
/// `idempotency_key`s of `process/start` a session remembers (the oldest
/// is forgotten first); each costs about 300 bytes.
pub const MAX_START_KEYS: usize = 4096;
/// `write_id`s of `process/write` a process remembers (the oldest is
/// forgotten first), as the Codex exec-server does; each costs about 100
/// bytes, less than a job's output buffer.
pub const MAX_WRITE_IDS: usize = 4096;
/// Bytes of an `idempotency_key` or a `write_id`.
pub const MAX_IDEMPOTENCY_KEY_BYTES: usize = 128;
/// Buffered HTTP body: must fit one frame with headers.
pub const MAX_HTTP_BODY_BYTES: u64 = 8 * MIB;
/// Concurrent streamed HTTP responses per session.
pub const MAX_HTTP_STREAMS: u64 = 64;
/// A detached session lives at most a day.
pub const MAX_DETACH_TTL_MS: u64 = 24 * 60 * 60 * 1000;
/// Session hosts of one user alive at once: each keeps its jobs and their
/// output for up to a day, so a client that detaches in a loop must not
/// pile them up; a person or an orchestrator rarely needs more than a few.
pub const MAX_DETACHED_SESSIONS: u64 = 64;
/// Open proxied connections of one job (egress by name): each holds two
/// sockets and at most 2 × [`EGRESS_BUFFER_BYTES`], so a job's egress costs
/// the agent at most 32 MiB of buffers and 512 descriptors.
pub const MAX_EGRESS_CONNECTIONS: u64 = 256;
/// What one relayed connection buffers per direction: a slow reader slows
/// the other side instead of growing the agent.
pub const EGRESS_BUFFER_BYTES: usize = 64 * KIB as usize;
/// MessagePack values in one incoming message: a decoded value costs up to
/// 32 bytes, so this caps one message's decoded form near 32 MiB.
pub const MAX_VALUES_PER_MESSAGE: u64 = 1 << 20;
/// Nesting depth of one incoming message; no method needs more than a few.
pub const MAX_NESTING: usize = 64;

/// The limits in force for a session, as `initialize` reports them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Limits {
    pub max_frame_bytes: u64,
    pub max_requests_in_flight: u64,
    pub max_inflight_request_bytes: u64,
    pub max_processes: u64,
    pub output_buffer_bytes: u64,
    pub max_output_chunk_bytes: u64,
    pub max_open_files: u64,
    pub max_block_bytes: u64,
    pub max_read_file_bytes: u64,
    pub max_read_credit_bytes: u64,
    pub max_read_streams: u64,
    pub max_walk_entries: u64,
    pub max_walk_response_bytes: u64,
    /// File bytes one `fs/copy` copies (its entries are bounded by
    /// `max_walk_entries`).
    pub max_copy_bytes: u64,
    pub max_http_body_bytes: u64,
    pub max_http_streams: u64,
    pub max_detach_ttl_ms: u64,
    /// Per user, not per session: the live session hosts of the agent's
    /// user, counted when a new `initialize` asks for `detach_ttl_ms`.
    pub max_detached_sessions: u64,
    /// Per job with egress by name (docs/PROTOCOL.md §8).
    pub max_egress_connections: u64,
    /// The limits a job gets where neither its request nor the profile
    /// sets them (docs/PROTOCOL.md §3.1); the profile's own are reported
    /// here when it has some.
    #[serde(default)]
    pub job: crate::types::process::JobLimits,
}

/// Processes of one job at once by default: a fork bomb stops there,
/// far above what a build (`make -j`, a test runner) starts.
pub const JOB_PROCESSES: u64 = 4096;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_frame_bytes: MAX_FRAME_BYTES,
            max_requests_in_flight: MAX_REQUESTS_IN_FLIGHT,
            max_inflight_request_bytes: MAX_INFLIGHT_REQUEST_BYTES,
            max_processes: MAX_PROCESSES,
            output_buffer_bytes: OUTPUT_BUFFER_BYTES,
            max_output_chunk_bytes: MAX_OUTPUT_CHUNK_BYTES,
            max_open_files: MAX_OPEN_FILES,
            max_block_bytes: MAX_BLOCK_BYTES,
            max_read_file_bytes: MAX_READ_FILE_BYTES,
            max_read_credit_bytes: MAX_READ_CREDIT_BYTES,
            max_read_streams: MAX_READ_STREAMS,
            max_walk_entries: MAX_WALK_ENTRIES,
            max_walk_response_bytes: MAX_WALK_RESPONSE_BYTES,
            max_copy_bytes: MAX_COPY_BYTES,
            max_http_body_bytes: MAX_HTTP_BODY_BYTES,
            max_http_streams: MAX_HTTP_STREAMS,
            max_detach_ttl_ms: MAX_DETACH_TTL_MS,
            max_detached_sessions: MAX_DETACHED_SESSIONS,
            max_egress_connections: MAX_EGRESS_CONNECTIONS,
            job: crate::types::process::JobLimits {
                processes: Some(JOB_PROCESSES),
                ..Default::default()
            },
        }
    }
}
