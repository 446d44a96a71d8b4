//! The confined agent the dispatch target drives.

use executor_agent::config::{Config, Profile};
use executor_protocol::message::encode_request;
use executor_protocol::types::sandbox::{
    FilesystemIntent, NetworkIntent, ReadRoots, SandboxIntent,
};
use executor_protocol::types::session::{ClientInfo, InitializeParams};
use executor_protocol::WirePath;
use std::path::PathBuf;
use std::sync::OnceLock;

/// A small tree the fuzzed requests may read: files, a subdirectory, a
/// symlink pointing out of it.
pub fn root() -> &'static PathBuf {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        // A fixed path, so that the seed corpus can name files in it.
        let root = std::env::temp_dir().join("executor-fuzz-root");
        let _ = std::fs::create_dir_all(root.join("sub/deeper"));
        let _ = std::fs::write(root.join("a.txt"), b"hello fuzz\n");
        let _ = std::fs::write(root.join("sub/b.bin"), vec![7u8; 70_000]);
        let _ = std::os::unix::fs::symlink("/etc/passwd", root.join("out"));
        root
    })
}

/// No processes, no HTTP, no writes (`read_only`: only the methods the
/// protocol's table marks read-only); reads beneath [`root`] only.
pub fn confined_config() -> Config {
    let root = root();
    Config {
        profile: Profile {
            name: Some("fuzz".into()),
            read_only: true,
            workspace_roots: vec![root.clone()],
            sandbox: Some(SandboxIntent {
                filesystem: FilesystemIntent {
                    read: ReadRoots::Paths(vec![WirePath::from(root.as_path())]),
                    ..Default::default()
                },
                network: NetworkIntent::Deny,
                required: true,
                workspace_roots: None,
            }),
            ..Profile::default()
        },
        ..Config::default()
    }
}

/// The `initialize` request every run starts with.
pub fn initialize_frame() -> Vec<u8> {
    let params = InitializeParams {
        protocol_version: executor_protocol::PROTOCOL_VERSION,
        client: ClientInfo {
            name: "fuzz".into(),
            version: "0".into(),
        },
        session: None,
        capabilities: None,
    };
    let mut out = Vec::new();
    encode_request(&mut out, 0, "initialize", &params, 1 << 24).expect("encode initialize");
    out
}
