//! `-v`/`-q`/`--log-json`: the client's logs on stderr (colours only on a
//! terminal, and never with NO_COLOR), and the level passed to the agent.

/// Logging flags.
#[derive(Debug, Default, clap::Args)]
pub struct LogArgs {
    /// More logs on stderr (repeatable: -v info, -vv debug, -vvv trace);
    /// the agent is asked for the same level.
    #[arg(short = 'v', long = "verbose", action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    /// Errors only.
    #[arg(short = 'q', long = "quiet", global = true, conflicts_with = "verbose")]
    pub quiet: bool,
    /// Logs as JSON lines (one object per event, fields as JSON values).
    #[arg(long, global = true)]
    pub log_json: bool,
}

impl LogArgs {
    fn level(&self) -> &'static str {
        match (self.quiet, self.verbose) {
            (true, _) => "error",
            (false, 0) => "warn",
            (false, 1) => "info",
            (false, 2) => "debug",
            _ => "trace",
        }
    }

    /// The level a flag asked for.
    fn flag_level(&self) -> Option<&'static str> {
        (self.quiet || self.verbose > 0).then(|| self.level())
    }

    /// The agent's environment for the same logs: `RUST_LOG` (when a flag
    /// set the level) and `EXECUTOR_LOG_JSON`.
    pub fn remote_env(&self) -> Vec<(&'static str, &'static str)> {
        let mut env = Vec::new();
        if let Some(level) = self.flag_level() {
            env.push(("RUST_LOG", level));
        }
        if self.log_json {
            env.push(("EXECUTOR_LOG_JSON", "1"));
        }
        env
    }
}

/// Start logging: a flag wins over `RUST_LOG`, which wins over `warn`.
pub fn init(args: &LogArgs) {
    use tracing_subscriber::EnvFilter;
    let filter = match args.flag_level() {
        Some(level) => EnvFilter::new(level),
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")),
    };
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colour && !args.log_json);
    if args.log_json {
        builder.json().init();
    } else {
        builder.init();
    }
}
