//! `executor-client`: drive an executor agent from the command line.
#![forbid(unsafe_code)]

use anyhow::Context;
use clap::{Parser, Subcommand};
use executor_client::{Client, ClientOptions, Target};
use std::io::Write;

/// Drive an executor agent, locally or over ssh.
#[derive(Debug, Parser)]
#[command(name = "executor-client", version, about)]
struct Cli {
    /// `local` (the executor next to this binary), `ssh://[user@]host[:port]`, or a host.
    #[arg(long, short, default_value = "local", global = true)]
    target: String,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Show the agent's initialize answer and environment as JSON.
    Info,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let target = Target::parse(&cli.target).map_err(anyhow::Error::msg)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let code = match rt.block_on(run(target, cli.command)) {
        Ok(code) => code,
        // Like ripgrep: a closed stdout (`| head`) is a clean exit.
        Err(e) if is_broken_pipe(&e) => 0,
        Err(e) => return Err(e),
    };
    std::process::exit(code);
}

async fn run(target: Target, cmd: Cmd) -> anyhow::Result<i32> {
    let client = Client::connect_target(&target, ClientOptions::default())
        .await
        .with_context(|| format!("connecting to {target:?}"))?;
    let code = match cmd {
        Cmd::Info => {
            let init = client.initialize_result();
            let mut init_json = serde_json::to_value(init)?;
            init_json["resume_token"] = serde_json::Value::String("<redacted>".into());
            let env = client.environment_info().await?;
            let out = serde_json::json!({ "initialize": init_json, "environment": env });
            let mut stdout = std::io::stdout().lock();
            serde_json::to_writer_pretty(&mut stdout, &out)?;
            writeln!(stdout)?;
            0
        }
    };
    client.close().await?;
    Ok(code)
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            || c.downcast_ref::<serde_json::Error>()
                .and_then(|j| j.io_error_kind())
                .is_some_and(|k| k == std::io::ErrorKind::BrokenPipe)
    })
}
