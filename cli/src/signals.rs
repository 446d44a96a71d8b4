//! SIGINT, SIGTERM and SIGHUP, caught for the whole run: a verb decides
//! what they mean (the first Ctrl-C of `run` interrupts the job, a transfer
//! stops and removes its temp files).

use tokio::signal::unix::{signal, Signal, SignalKind};

/// A caught signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caught {
    Interrupt,
    Terminate,
    Hangup,
}

impl Caught {
    /// 128 + the signal number, as a shell reports it.
    pub fn exit_code(self) -> i32 {
        128 + match self {
            Caught::Interrupt => 2,
            Caught::Terminate => 15,
            Caught::Hangup => 1,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Caught::Interrupt => "SIGINT",
            Caught::Terminate => "SIGTERM",
            Caught::Hangup => "SIGHUP",
        }
    }
}

/// The handlers.
#[derive(Debug)]
pub struct Signals {
    int: Signal,
    term: Signal,
    hup: Signal,
}

impl Signals {
    pub fn install() -> anyhow::Result<Signals> {
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    /// The next signal.
    pub async fn recv(&mut self) -> Caught {
        tokio::select! {
            _ = self.int.recv() => Caught::Interrupt,
            _ = self.term.recv() => Caught::Terminate,
            _ = self.hup.recv() => Caught::Hangup,
        }
    }
}
