//! One integration-test binary (like ripgrep's): a module per capability,
//! shared helpers in `executor_tests` (`src/lib.rs`).

#[path = "suite/bootstrap.rs"]
mod bootstrap;
#[path = "suite/cli.rs"]
mod cli;
#[path = "suite/cli_detach.rs"]
mod cli_detach;
#[path = "suite/cli_env.rs"]
mod cli_env;
#[path = "suite/cli_files.rs"]
mod cli_files;
#[path = "suite/cli_flags.rs"]
mod cli_flags;
#[path = "suite/cli_jobs.rs"]
mod cli_jobs;
#[path = "suite/cli_quoting.rs"]
mod cli_quoting;
#[path = "suite/cli_readme.rs"]
mod cli_readme;
#[path = "suite/cli_terminal.rs"]
mod cli_terminal;
#[path = "suite/cli_ux.rs"]
mod cli_ux;
#[path = "suite/client.rs"]
mod client;
#[path = "suite/codex_catchup.rs"]
mod codex_catchup;
#[path = "suite/codex_cli.rs"]
mod codex_cli;
#[path = "suite/codex_dialect.rs"]
mod codex_dialect;
#[path = "suite/codex_diff.rs"]
mod codex_diff;
#[path = "suite/codex_fs.rs"]
mod codex_fs;
#[path = "suite/codex_http.rs"]
mod codex_http;
#[path = "suite/codex_mcp.rs"]
mod codex_mcp;
#[path = "suite/codex_sandbox.rs"]
mod codex_sandbox;
#[path = "suite/degraded.rs"]
mod degraded;
#[path = "suite/egress.rs"]
mod egress;
#[path = "suite/egress_policy.rs"]
mod egress_policy;
#[path = "suite/exec.rs"]
mod exec;
#[path = "suite/fs.rs"]
mod fs;
#[path = "suite/fs_copy.rs"]
mod fs_copy;
#[path = "suite/fuzzish.rs"]
mod fuzzish;
#[path = "suite/hardening.rs"]
mod hardening;
#[path = "suite/http.rs"]
mod http;
#[path = "suite/idempotency.rs"]
mod idempotency;
#[path = "suite/jobs_tmp.rs"]
mod jobs_tmp;
#[path = "suite/limits.rs"]
mod limits;
#[path = "suite/limits_systemd.rs"]
mod limits_systemd;
#[path = "suite/mcp_http.rs"]
mod mcp_http;
#[path = "suite/mcp_rmcp.rs"]
mod mcp_rmcp;
#[path = "suite/mcp_stdio.rs"]
mod mcp_stdio;
#[path = "suite/policy_table.rs"]
mod policy_table;
#[path = "suite/pool.rs"]
mod pool;
#[path = "suite/process.rs"]
mod process;
#[path = "suite/read_into.rs"]
mod read_into;
#[path = "suite/read_stream.rs"]
mod read_stream;
#[path = "suite/sandbox.rs"]
mod sandbox;
#[path = "suite/session.rs"]
mod session;
#[path = "suite/spawner.rs"]
mod spawner;
#[path = "suite/ssh.rs"]
mod ssh;
#[path = "suite/startup.rs"]
mod startup;
#[path = "suite/transports.rs"]
mod transports;
#[path = "suite/wire.rs"]
mod wire;
