//! # executor-agent
//!
//! The `executor` agent: serves one connection of the executor wire protocol
//! (see the `executor-protocol` crate and docs/PROTOCOL.md) on a byte
//! stream, normally its own stdin/stdout under `ssh devbox executor`.
//!
//! ## Layers
//!
//! Each layer imports only from the layers below it (`agent/tests/layers.rs`
//! checks this and that the module graph has no cycle), bottom first:
//!
//! 0. [`limits`]: a job's limits and account (its cgroup, or rlimits),
//!    below everything that starts or lists jobs.
//! 1. [`outbound`]: frames out. [`outbound::Reply`] (what a handler answers:
//!    a value, a value with a zero-copy tail, a stream's head), the one
//!    place replies, errors and notifications are encoded, and
//!    [`outbound::Outbound`], where a session's notifications go (typed
//!    `notify_output`, `notify_body_delta`).
//! 2. [`tables`]: the session's state: jobs and their output
//!    ([`tables::jobs`]), open file handles ([`tables::handles`]), HTTP
//!    streams ([`tables::streams`]).
//! 3. Support used by the session and the handlers: [`config`] (profiles,
//!    limits), [`audit`], [`destinations`] (the HTTP destination policy),
//!    [`http_client`] (one HTTP exchange), [`sandbox_gate`] (a request's
//!    intent to a sandbox plan), [`forced`], [`login_env`] (the login
//!    shell's environment a job may start from).
//! 4. [`session`]: one session (identity, limits, profile, the tables),
//!    `initialize` and `environment/info`.
//! 5. Handlers, one module per method family: [`process`], [`exec`],
//!    [`fs`], [`http`], [`tools`]. A handler takes `&Arc<Session>` and its
//!    typed params, returns its typed result (or a `Reply`); it never sees
//!    bytes or frames.
//! 6. [`dispatch`]: the method table, one line a method: the handler of any
//!    method is one hop from there.
//! 7. [`conn`]: one connection: framing, admission (`admit`, `reserve`),
//!    concurrency and flow control, the audit record of each request.
//! 8. [`host`]: detached sessions: the session host (`host/mod.rs`) and the
//!    stdio relay in front of it (`host/relay.rs`).
//!
//! ## One request, from the client's call to `execve`
//!
//! `client.call(&ProcessStartParams { .. })` (executor-client): the params
//! type names its method through the protocol's table
//! (`impl Request for ProcessStartParams`, `METHOD = "process/start"`); the
//! client frames it (`message::encode_request`) and writes it to the ssh
//! channel. On the host, `main` hands stdin/stdout to
//! [`host::serve_stdio`], which serves the connection in-process with
//! [`conn::serve_on`] (or relays it to a session host that does the same).
//! There the frame is cut (`FrameDecoder`, within `max_frame_bytes` and the
//! in-flight byte budget), decoded (`Incoming::decode`) and admitted:
//! initialized, not taken over, allowed by the profile, an in-flight slot
//! free, its id not in use. It runs in its own task (`run_request`):
//! [`dispatch::dispatch`] finds `m::PROCESS_START => process::handle_start`
//! and decodes `ProcessStartParams`; [`process::start`] checks argv, cwd and
//! sizes, reserves a `max_processes` slot in the session's
//! [`tables::jobs::ProcessTable`], turns the intent (and the profile's)
//! into a plan ([`sandbox_gate::gate`] → `executor_sandbox::plan`), and
//! [`process::spawn::spawn`] resolves the program, seals the job spec in a
//! memfd and asks the spawner ([`process::spawner`], the small
//! single-threaded `executor sandbox-exec --spawner` started with the
//! agent) for the job's supervisor, handing it the job's stdio, the
//! lifeline, the status pipe, the spec (and, with egress by name, the
//! socket for the proxy's listener) by `SCM_RIGHTS`; the spawner passes
//! them on to the supervisor it forked ahead (its standby) or forks one.
//! The supervisor runs the trampoline
//! (`executor_sandbox::trampoline::run`), which applies the plan
//! (namespaces, the new root, Landlock, seccomp: `executor_sandbox::linux`)
//! and starts the program with a `vfork` and `execve`; it reports
//! `Status::Started { pid }` on the status pipe. The
//! job is registered, its output pumps start, and the handler's
//! `ProcessStartResult` goes back up: dispatch makes it a `Reply`, `conn`
//! frames it with [`outbound::reply_frame`] and queues it for the one
//! writer task, whose in-flight slot is released once written. The client
//! matches the id and decodes `P::Result`. The job's output then arrives
//! as `process/output` notifications: pump → `Proc::append` →
//! `Outbound::notify_output` → the writer. A sandboxed job with egress by
//! name reaches the network only through its [`egress`] proxy, which the
//! agent serves on a listener the trampoline made inside the job's
//! network namespace.
//!
//! ## Dependencies
//!
//! `executor-protocol` (the wire), `executor-sandbox` (probe, plan,
//! trampoline, spawner) and `executor-sys` for the few raw system calls the
//! agent makes itself (descriptor passing, `splice` relays, a PTY's window
//! size, the host's addresses): this crate has no `unsafe`.
#![forbid(unsafe_code)]

pub mod audit;
pub mod codex;
pub mod config;
pub mod conn;
pub mod destinations;
pub mod dispatch;
pub mod egress;
pub mod exec;
pub mod forced;
pub mod fs;
pub mod host;
pub mod http;
pub mod http_client;
pub mod limits;
pub mod login_env;
pub mod outbound;
pub mod process;
pub mod sandbox_gate;
pub mod session;
pub mod tables;
pub mod tools;

pub use conn::serve;
