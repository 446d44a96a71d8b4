//! Every message type survives the codec: encode as a frame, split the bytes
//! anywhere, decode, and get the same typed value back.

use bytes::BytesMut;
use executor_protocol::codec::FrameDecoder;
use executor_protocol::limits::Limits;
use executor_protocol::message::{encode_notification, encode_response, from_params, Incoming};
use executor_protocol::types::exec::*;
use executor_protocol::types::fs::*;
use executor_protocol::types::http::*;
use executor_protocol::types::process::*;
use executor_protocol::types::sandbox::*;
use executor_protocol::types::session::*;
use executor_protocol::types::Empty;
use executor_protocol::{message::encode_request, ErrorCode, WireError, WirePath};
use proptest::collection::{btree_map, vec};
use proptest::option::of;
use proptest::prelude::*;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_bytes::ByteBuf;
use std::fmt::Debug;

const MAX: usize = 16 << 20;

/// Encode `v` as request params, response result and notification params;
/// decode each through the frame decoder fed in two pieces split at `split`.
fn roundtrip<T: Serialize + DeserializeOwned + PartialEq + Debug>(v: &T, split: usize) {
    let mut wire = Vec::new();
    encode_request(&mut wire, 42, "m", v, MAX).unwrap();
    encode_response(&mut wire, Some(43), v, MAX).unwrap();
    encode_notification(&mut wire, "n", v, MAX).unwrap();
    let split = split % (wire.len() + 1);
    let mut dec = FrameDecoder::new(MAX);
    let mut buf = BytesMut::from(&wire[..split]);
    let mut frames = Vec::new();
    while let Some(f) = dec.decode(&mut buf).unwrap() {
        frames.push(f);
    }
    buf.extend_from_slice(&wire[split..]);
    while let Some(f) = dec.decode(&mut buf).unwrap() {
        frames.push(f);
    }
    assert!(buf.is_empty());
    assert_eq!(frames.len(), 3);
    for f in frames {
        let value = match Incoming::decode(&f).unwrap() {
            Incoming::Request { id, method, params } => {
                assert_eq!((id, method.as_str()), (42, "m"));
                params
            }
            Incoming::Response { id, result } => {
                assert_eq!(id, Some(43));
                result.unwrap()
            }
            Incoming::Notification { method, params } => {
                assert_eq!(method, "n");
                params
            }
        };
        let back: T = from_params(value).unwrap();
        assert_eq!(&back, v);
    }
}

fn s() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9 ._/-]{0,12}"
}
fn bytes() -> impl Strategy<Value = ByteBuf> {
    vec(any::<u8>(), 0..64).prop_map(ByteBuf::from)
}
fn wpath() -> impl Strategy<Value = WirePath> {
    prop_oneof![
        s().prop_map(|p| WirePath::from(format!("/{p}"))),
        vec(any::<u8>(), 1..16).prop_map(WirePath::from_bytes),
    ]
}
fn env() -> impl Strategy<Value = std::collections::BTreeMap<String, String>> {
    btree_map("[A-Z_]{1,6}", s(), 0..4)
}
fn intent() -> impl Strategy<Value = SandboxIntent> {
    (
        prop_oneof![
            Just(ReadRoots::All),
            vec(wpath(), 0..3).prop_map(ReadRoots::Paths)
        ],
        vec(wpath(), 0..3),
        vec(wpath(), 0..2),
        vec(wpath(), 0..2),
        prop_oneof![
            Just(NetworkIntent::Deny),
            Just(NetworkIntent::Allow),
            vec(any::<u16>(), 0..3).prop_map(NetworkIntent::AllowTcpConnect),
            (
                vec("[a-z*.:0-9]{1,12}", 0..3),
                any::<bool>(),
                0..=600_000u64
            )
                .prop_map(|(allow_hosts, ask, ask_timeout_ms)| {
                    NetworkIntent::AllowHosts(executor_protocol::types::sandbox::EgressIntent {
                        allow_hosts,
                        ask,
                        ask_timeout_ms,
                    })
                })
        ],
        any::<bool>(),
        proptest::option::of(vec(wpath(), 0..3)),
    )
        .prop_map(
            |(read, write, deny_read, deny_write, network, required, workspace_roots)| {
                SandboxIntent {
                    filesystem: FilesystemIntent {
                        read,
                        write,
                        deny_read,
                        deny_write,
                    },
                    network,
                    required,
                    workspace_roots,
                }
            },
        )
}
fn code() -> impl Strategy<Value = ErrorCode> {
    (0..ErrorCode::ALL.len()).prop_map(|i| ErrorCode::ALL[i])
}
fn werr() -> impl Strategy<Value = WireError> {
    (code(), s(), of(s())).prop_map(|(c, m, f)| match f {
        Some(f) => WireError::invalid_params(&f, m).with("x", 1u64).tap(c),
        None => WireError::new(c, m),
    })
}
trait Tap {
    fn tap(self, c: ErrorCode) -> Self;
}
impl Tap for WireError {
    fn tap(mut self, c: ErrorCode) -> Self {
        self.code = c;
        self
    }
}
fn stream() -> impl Strategy<Value = OutputStream> {
    (0..OutputStream::ALL.len()).prop_map(|i| OutputStream::ALL[i])
}
fn kind() -> impl Strategy<Value = FileKind> {
    (0..FileKind::ALL.len()).prop_map(|i| FileKind::ALL[i])
}

macro_rules! rt {
    ($name:ident, $strategy:expr) => {
        proptest! {
            #![proptest_config(ProptestConfig::with_cases(48))]
            #[test]
            fn $name(v in $strategy, split in any::<usize>()) {
                roundtrip(&v, split);
            }
        }
    };
}

rt!(
    initialize_params,
    (
        any::<u32>(),
        s(),
        s(),
        of((of((s(), s())), of(any::<u64>())))
    )
        .prop_map(|(pv, n, ver, sess)| InitializeParams {
            protocol_version: pv,
            client: ClientInfo {
                name: n,
                version: ver
            },
            session: sess.map(|(r, ttl)| SessionParams {
                resume: r.map(|(session_id, token)| ResumeParams { session_id, token }),
                detach_ttl_ms: ttl
            }),
            capabilities: None,
        })
);
rt!(
    initialize_result,
    (
        s(),
        s(),
        vec(s(), 0..5),
        any::<bool>(),
        of(any::<u32>()),
        of(s())
    )
        .prop_map(
            |(id, tok, methods, resumed, abi, reason)| InitializeResult {
                protocol_version: 1,
                agent: AgentInfo {
                    name: "executor".into(),
                    version: "1".into()
                },
                session_id: id,
                resume_token: tok,
                resumed,
                methods,
                limits: Limits::default(),
                platform: Platform {
                    os: "linux".into(),
                    arch: "x86_64".into(),
                    hostname: "h".into()
                },
                sandbox: SandboxCapabilities {
                    enforceable: resumed,
                    mechanisms: vec!["landlock".into()],
                    landlock_abi: abi,
                    network_rules: !resumed,
                    reason
                },
            }
        )
);
rt!(
    environment_info,
    (s(), any::<u32>(), s()).prop_map(|(user, uid, cwd)| EnvironmentInfo {
        os: "linux".into(),
        arch: "aarch64".into(),
        hostname: "h".into(),
        user,
        uid,
        home: "/root".into(),
        cwd,
        shell: ShellInfo {
            path: "/bin/bash".into(),
            name: "bash".into()
        },
        path_separator: "/".into(),
        agent_version: "0".into(),
        sandbox: SandboxCapabilities {
            enforceable: false,
            mechanisms: vec![],
            landlock_abi: None,
            network_rules: false,
            reason: None
        },
        login_env: Some(executor_protocol::types::session::LoginEnvInfo {
            taken: true,
            duration_ms: Some(u64::from(uid)),
            error: None,
        }),
    })
);
rt!(
    tools_list,
    vec((s(), s()), 0..3).prop_map(|t| ToolsListResult {
        tools: t
            .into_iter()
            .map(|(name, description)| ToolSpec {
                name,
                description,
                input_schema: rmpv::Value::Map(vec![("type".into(), "object".into())])
            })
            .collect()
    })
);
rt!(cancel, any::<u64>().prop_map(|id| CancelParams { id }));
rt!(empty, Just(Empty {}));
rt!(wire_error, werr());
fn job_limits() -> impl Strategy<Value = JobLimits> {
    (
        of(any::<u64>()),
        of(any::<u64>()),
        of(any::<u64>()),
        of(any::<u64>()),
        of(any::<bool>()),
    )
        .prop_map(
            |(memory_bytes, processes, cpu_millis_per_sec, tmp_bytes, required)| JobLimits {
                memory_bytes,
                processes,
                cpu_millis_per_sec,
                tmp_bytes,
                required,
            },
        )
}

fn job_usage() -> impl Strategy<Value = JobUsage> {
    vec(of(any::<u64>()), 6..=6).prop_map(|v| JobUsage {
        cpu_user_us: v[0],
        cpu_system_us: v[1],
        peak_memory_bytes: v[2],
        processes_peak: v[3],
        memory_bytes: v[4],
        processes: v[5],
    })
}

fn limit_hit() -> impl Strategy<Value = Option<LimitHit>> {
    of(prop_oneof![
        Just(LimitHit::Memory),
        Just(LimitHit::Processes)
    ])
}

rt!(
    process_start,
    (
        vec(s(), 1..4),
        wpath(),
        env(),
        of(s()),
        any::<bool>(),
        of((any::<u16>(), any::<u16>())),
        any::<bool>(),
        of(intent()),
        any::<bool>(),
        of(any::<u64>()),
        (of(s()), of(s()), of(job_limits()))
    )
        .prop_map(
            |(argv, cwd, env, arg0, tty, size, null, sandbox, notify, obb, (tag, key, limits))| {
                ProcessStartParams {
                    argv,
                    cwd,
                    env,
                    arg0,
                    tty,
                    pty_size: size.map(|(rows, cols)| PtySize { rows, cols }),
                    stdin: if null {
                        StdinMode::Null
                    } else {
                        StdinMode::Pipe
                    },
                    sandbox,
                    notify,
                    output_buffer_bytes: obb,
                    tag,
                    env_base: Default::default(),
                    idempotency_key: key,
                    limits,
                }
            }
        )
);
rt!(
    process_start_result,
    (
        s(),
        any::<u32>(),
        of(vec(s(), 0..3)),
        of(s()),
        of(vec(s(), 0..3))
    )
        .prop_map(
            |(process_id, pid, sandbox_degraded, proxy, limits_degraded)| ProcessStartResult {
                process_id,
                pid,
                sandbox_degraded,
                egress: proxy.map(|proxy| executor_protocol::types::network::EgressInfo { proxy }),
                limits_degraded,
            }
        )
);
rt!(
    process_output,
    (s(), any::<u64>(), stream(), bytes()).prop_map(|(process_id, seq, stream, data)| {
        ProcessOutput {
            process_id,
            seq,
            stream,
            data,
        }
    })
);
rt!(
    process_exited,
    (
        s(),
        of(any::<i32>()),
        of(s()),
        of(any::<i32>()),
        of(any::<u64>()),
        (of(any::<bool>()), of(job_usage()), limit_hit())
    )
        .prop_map(
            |(
                process_id,
                exit_code,
                signal,
                signal_number,
                final_seq,
                (sandbox_denied, usage, limit_hit),
            )| {
                ProcessExited {
                    process_id,
                    exit_code,
                    signal,
                    signal_number,
                    final_seq,
                    sandbox_denied,
                    usage,
                    limit_hit,
                }
            }
        )
);
rt!(
    process_lagged,
    (s(), any::<u64>()).prop_map(|(process_id, next_seq)| ProcessLagged {
        process_id,
        next_seq
    })
);
rt!(
    process_read,
    (s(), of(any::<u64>()), of(any::<u64>()), of(any::<u64>())).prop_map(
        |(process_id, after_seq, max_bytes, wait_ms)| ProcessReadParams {
            process_id,
            after_seq,
            max_bytes,
            wait_ms
        }
    )
);
rt!(
    process_read_result,
    (
        vec((any::<u64>(), stream(), bytes()), 0..4),
        any::<u64>(),
        of((of(any::<i32>()), of(s()), of(job_usage()), limit_hit())),
        of(any::<u64>())
    )
        .prop_map(
            |(chunks, next_seq, exited, dropped_before)| ProcessReadResult {
                chunks: chunks
                    .into_iter()
                    .map(|(seq, stream, data)| OutputChunk { seq, stream, data })
                    .collect(),
                next_seq,
                exited: exited.map(|(exit_code, signal, usage, limit_hit)| ExitInfo {
                    exit_code,
                    signal,
                    usage,
                    limit_hit
                }),
                dropped_before
            }
        )
);
rt!(
    process_write,
    (s(), bytes(), any::<bool>(), of(s())).prop_map(|(process_id, data, close_stdin, write_id)| {
        ProcessWriteParams {
            process_id,
            data,
            close_stdin,
            write_id,
        }
    })
);
rt!(
    process_signal,
    (s(), 0..SignalName::ALL.len()).prop_map(|(process_id, i)| ProcessSignalParams {
        process_id,
        signal: SignalName::ALL[i]
    })
);
rt!(
    process_resize,
    (s(), any::<u16>(), any::<u16>()).prop_map(|(process_id, rows, cols)| ProcessResizeParams {
        process_id,
        rows,
        cols
    })
);
rt!(
    process_list,
    vec(
        (
            s(),
            any::<u32>(),
            vec(s(), 0..3),
            of(s()),
            any::<bool>(),
            of(job_usage())
        ),
        0..4
    )
    .prop_map(|p| ProcessListResult {
        processes: p
            .into_iter()
            .map(|(process_id, pid, argv, tag, running, usage)| ProcessInfo {
                process_id,
                pid,
                argv,
                tag,
                running,
                usage
            })
            .collect()
    })
);
rt!(
    exec_command,
    (
        vec(s(), 1..3),
        wpath(),
        env(),
        any::<bool>(),
        any::<u64>(),
        any::<u64>(),
        of(intent()),
        of(intent()),
        any::<bool>(),
        (of(s()), of(job_limits()))
    )
        .prop_map(
            |(
                command,
                cwd,
                env,
                tty,
                yield_time_ms,
                max_output_tokens,
                sandbox_permissions,
                additional_permissions,
                pre,
                (justification, limits),
            )| ExecCommandParams {
                command,
                cwd,
                env,
                tty,
                yield_time_ms,
                max_output_tokens,
                sandbox_permissions,
                additional_permissions,
                additional_permissions_preapproved: pre,
                justification,
                exec_approval_requirement: None,
                env_base: Default::default(),
                limits,
            }
        )
);
rt!(
    write_stdin,
    (s(), s(), any::<u64>(), any::<u64>()).prop_map(
        |(process_id, input, yield_time_ms, max_output_tokens)| WriteStdinParams {
            process_id,
            input,
            yield_time_ms,
            max_output_tokens
        }
    )
);
rt!(
    exec_result,
    (
        s(),
        any::<u64>(),
        any::<bool>(),
        of(any::<i32>()),
        of(s()),
        any::<u64>(),
        of(any::<bool>()),
        (
            of(vec(s(), 0..2)),
            of(vec(s(), 0..2)),
            of(job_usage()),
            limit_hit()
        )
    )
        .prop_map(
            |(
                output,
                original_token_count,
                truncated,
                exit_code,
                process_id,
                wall_time_ms,
                sandbox_denied,
                (sandbox_degraded, limits_degraded, usage, limit_hit),
            )| ExecResult {
                output,
                original_token_count,
                truncated,
                exit_code,
                process_id,
                wall_time_ms,
                sandbox_denied,
                sandbox_degraded,
                egress: None,
                limits_degraded,
                usage,
                limit_hit,
            }
        )
);
rt!(
    fs_stat,
    (wpath(), any::<bool>(), of(intent()), of(wpath())).prop_map(
        |(path, follow_symlinks, sandbox, cwd)| StatParams {
            path,
            follow_symlinks,
            sandbox,
            cwd
        }
    )
);
rt!(
    fs_stat_result,
    (
        kind(),
        any::<u64>(),
        any::<u32>(),
        any::<i64>(),
        any::<u32>(),
        any::<u32>()
    )
        .prop_map(|(kind, size, mode, mtime_ns, uid, gid)| StatResult {
            kind,
            size,
            mode,
            mtime_ns,
            uid,
            gid
        })
);
rt!(
    fs_canonicalize,
    (wpath(), of(wpath())).prop_map(|(path, cwd)| CanonicalizeParams {
        path,
        sandbox: None,
        cwd
    })
);
rt!(fs_path_result, wpath().prop_map(|path| PathResult { path }));
rt!(
    fs_read_file,
    (wpath(), of(any::<u64>()), of(any::<u64>())).prop_map(|(path, offset, length)| {
        ReadFileParams {
            path,
            offset,
            length,
            sandbox: None,
            cwd: None,
        }
    })
);
rt!(
    fs_read_file_result,
    (bytes(), any::<u64>()).prop_map(|(data, size)| ReadFileResult { data, size })
);
rt!(
    fs_write_file,
    (
        wpath(),
        bytes(),
        of(any::<u32>()),
        any::<bool>(),
        any::<bool>(),
        of(intent())
    )
        .prop_map(
            |(path, data, mode, create_parents, atomic, sandbox)| WriteFileParams {
                path,
                data,
                mode,
                create_parents,
                atomic,
                sandbox,
                cwd: None
            }
        )
);
rt!(
    fs_create_directory,
    (wpath(), any::<bool>(), proptest::option::of(0u32..0o10000)).prop_map(
        |(path, recursive, mode)| CreateDirectoryParams {
            path,
            recursive,
            mode,
            sandbox: None,
            cwd: None
        }
    )
);
rt!(
    fs_remove,
    (wpath(), any::<bool>()).prop_map(|(path, recursive)| RemoveParams {
        path,
        recursive,
        sandbox: None,
        cwd: None
    })
);
rt!(
    fs_rename,
    (wpath(), wpath()).prop_map(|(from, to)| RenameParams {
        from,
        to,
        sandbox: None,
        cwd: None
    })
);
rt!(
    fs_copy,
    (wpath(), wpath(), any::<bool>()).prop_map(|(source, destination, recursive)| CopyParams {
        source,
        destination,
        recursive,
        sandbox: None,
        cwd: None
    })
);
rt!(
    fs_walk,
    (
        wpath(),
        any::<u32>(),
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        any::<bool>(),
        of(bytes())
    )
        .prop_map(
            |(
                root,
                max_depth,
                max_entries,
                max_directories,
                max_response_bytes,
                include_hidden,
                cursor,
            )| WalkParams {
                root,
                max_depth,
                max_entries,
                max_directories,
                max_response_bytes,
                include_hidden,
                cursor,
                sandbox: None,
                cwd: None
            }
        )
);
rt!(
    fs_walk_result,
    (
        vec((wpath(), kind(), any::<u64>(), any::<i64>()), 0..4),
        vec((wpath(), code(), s()), 0..2),
        any::<bool>(),
        of(0..TruncatedBy::ALL.len()),
        of(bytes())
    )
        .prop_map(|(e, errs, truncated, tb, next_cursor)| WalkResult {
            entries: e
                .into_iter()
                .map(|(path, kind, size, mtime_ns)| WalkEntry {
                    path,
                    kind,
                    size,
                    mtime_ns
                })
                .collect(),
            errors: errs
                .into_iter()
                .map(|(path, code, message)| WalkErrorEntry {
                    path,
                    code,
                    message
                })
                .collect(),
            truncated,
            truncated_by: tb.map(|i| TruncatedBy::ALL[i]),
            next_cursor
        })
);
rt!(
    fs_open,
    wpath().prop_map(|path| OpenParams {
        path,
        sandbox: None,
        cwd: None
    })
);
rt!(
    fs_open_result,
    (any::<u64>(), any::<u64>()).prop_map(|(handle, size)| OpenResult { handle, size })
);
rt!(
    fs_read_block,
    (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(handle, offset, length)| {
        ReadBlockParams {
            handle,
            offset,
            length,
            sandbox: None,
            cwd: None,
        }
    })
);
rt!(
    fs_read_block_result,
    (bytes(), any::<bool>()).prop_map(|(data, eof)| ReadBlockResult { data, eof })
);
rt!(
    fs_open_write,
    (
        wpath(),
        of(any::<u32>()),
        any::<bool>(),
        of(any::<i64>()),
        of(any::<i64>())
    )
        .prop_map(|(path, mode, create_parents, mtime_ns, atime_ns)| {
            OpenWriteParams {
                path,
                mode,
                create_parents,
                mtime_ns,
                atime_ns,
                sandbox: None,
                cwd: None,
            }
        })
);
rt!(
    fs_read_link,
    wpath().prop_map(|path| ReadLinkParams {
        path,
        sandbox: None,
        cwd: None,
    })
);
rt!(
    fs_read_link_result,
    wpath().prop_map(|target| ReadLinkResult { target })
);
rt!(
    fs_create_symlink,
    (wpath(), wpath()).prop_map(|(path, target)| CreateSymlinkParams {
        path,
        target,
        sandbox: None,
        cwd: None,
    })
);
rt!(
    fs_handle_result,
    any::<u64>().prop_map(|handle| HandleResult { handle })
);
rt!(
    fs_write_block,
    (any::<u64>(), any::<u64>(), bytes()).prop_map(|(handle, offset, data)| WriteBlockParams {
        handle,
        offset,
        data,
        sandbox: None,
        cwd: None
    })
);
rt!(
    fs_handle,
    any::<u64>().prop_map(|handle| HandleParams {
        handle,
        sandbox: None,
        cwd: None
    })
);
rt!(
    fs_commit_result,
    any::<u64>().prop_map(|size| CommitResult { size })
);
rt!(
    http_request,
    (
        s(),
        s(),
        vec((s(), s()), 0..3),
        of(bytes()),
        any::<u64>(),
        any::<bool>(),
        of(any::<u64>()),
        any::<u32>(),
        of(intent()),
        vec((s(), s(), s()), 0..3)
    )
        .prop_map(
            |(
                method,
                url,
                headers,
                body,
                timeout_ms,
                stream,
                max_response_bytes,
                follow_redirects,
                sandbox,
                env,
            )| HttpRequestParams {
                method,
                url,
                headers,
                body,
                timeout_ms,
                stream,
                max_response_bytes,
                follow_redirects,
                sandbox,
                env_headers: env
                    .into_iter()
                    .map(|(name, env, prefix)| EnvHeader { name, env, prefix })
                    .collect(),
            }
        )
);
rt!(
    http_response,
    (any::<u16>(), vec((s(), s()), 0..3), bytes(), s()).prop_map(|(status, headers, body, url)| {
        HttpResponse {
            status,
            headers,
            body,
            url,
        }
    })
);
rt!(
    http_stream_head,
    (any::<u16>(), vec((s(), s()), 0..3), s(), any::<u64>()).prop_map(
        |(status, headers, url, stream_id)| HttpStreamHead {
            status,
            headers,
            url,
            stream_id
        }
    )
);
rt!(
    http_body_delta,
    (
        any::<u64>(),
        any::<u64>(),
        bytes(),
        any::<bool>(),
        of(werr())
    )
        .prop_map(|(stream_id, seq, data, done, error)| BodyDelta {
            stream_id,
            seq,
            data,
            done,
            error
        })
);
rt!(
    http_cancel,
    any::<u64>().prop_map(|stream_id| HttpCancelParams { stream_id })
);

/// Garbage and valid frames mixed, fed split at every byte boundary, decode
/// exactly as when fed whole.
#[test]
fn garbage_split_at_every_boundary_decodes_like_whole() {
    let mut wire = Vec::new();
    encode_request(&mut wire, 1, "fs/stat", &Empty {}, MAX).unwrap();
    for payload in [
        &[0xc1u8][..],
        b"\x92\x01\x02",
        b"\xa3abc",
        b"\x81\xa2id\xa1x",
        b"\xde\x00\x01",
        b"\x80\x00",
    ] {
        wire.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        wire.extend_from_slice(payload);
    }
    encode_notification(&mut wire, "$/cancel", &CancelParams { id: 9 }, MAX).unwrap();
    let decode = |chunks: &[&[u8]]| {
        let mut dec = FrameDecoder::new(MAX);
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for c in chunks {
            buf.extend_from_slice(c);
            while let Some(f) = dec.decode(&mut buf).unwrap() {
                out.push(Incoming::decode(&f).map_err(|e| e.error));
            }
        }
        assert!(buf.is_empty());
        out
    };
    let whole = decode(&[&wire]);
    assert_eq!(whole.len(), 8);
    assert!(whole[0].is_ok() && whole[7].is_ok());
    assert!(whole[1..7].iter().all(|r| r.is_err()));
    for split in 0..=wire.len() {
        assert_eq!(
            decode(&[&wire[..split], &wire[split..]]),
            whole,
            "split at {split}"
        );
    }
    // And one byte at a time.
    let bytes: Vec<&[u8]> = wire.chunks(1).collect();
    assert_eq!(decode(&bytes), whole);
}

proptest! {
    /// Arbitrary bytes never panic the decoders.
    #[test]
    fn arbitrary_bytes_never_panic(data in vec(any::<u8>(), 0..512)) {
        executor_protocol::internal::fuzz_decode(&data, 1 << 16);
    }
}
