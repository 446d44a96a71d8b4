//! Dispatch: an `initialize` frame, then the fuzz input as the rest of the
//! byte stream, into a real agent (`executor_agent::serve`) running in
//! this process over in-memory pipes. The agent runs under a profile that
//! refuses every method with outside effects (processes, HTTP, writes) and
//! confines fs reads to a temporary tree, so millions of runs are cheap
//! and harmless. The agent must answer and end (no hang, no panic) for any
//! input.
#![no_main]

use executor_fuzz::agent::{confined_config, initialize_frame};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    })
}

fuzz_target!(|data: &[u8]| {
    let config = confined_config();
    runtime().block_on(async move {
        let (mut to_agent, agent_in) = tokio::io::duplex(256 * 1024);
        let (agent_out, mut from_agent) = tokio::io::duplex(256 * 1024);
        let agent = tokio::spawn(executor_agent::serve(agent_in, agent_out, config));
        let input = [initialize_frame(), data.to_vec()].concat();
        let feed = async move {
            // The agent may stop reading (bad framing): ignore write errors.
            let _ = to_agent.write_all(&input).await;
            let _ = to_agent.shutdown().await;
        };
        let drain = async move {
            let mut sink = Vec::new();
            let _ = from_agent.read_to_end(&mut sink).await;
            sink
        };
        let run = async { tokio::join!(feed, drain, agent) };
        let (_, out, ended) = tokio::time::timeout(Duration::from_secs(20), run)
            .await
            .expect("the agent hung on this input");
        ended
            .expect("the agent task panicked")
            .expect("serve failed");
        assert!(out.starts_with(executor_protocol::PREAMBLE), "no preamble");
    });
});
