//! The native SSH transport (`--features native-ssh`): russh on `ring`, for
//! orchestrators without an OpenSSH client. Host keys are verified against
//! a `known_hosts` file: an unknown host or a changed key is refused, never
//! accepted silently. Authentication is by a private key file.

use crate::{Client, ClientOptions, Error};
use russh::keys::{PrivateKeyWithHashAlg, PublicKeyOrCertificate};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// Where and how to connect.
#[derive(Debug, Clone)]
pub struct NativeSshOptions {
    pub user: String,
    pub port: u16,
    /// The private key (OpenSSH format, unencrypted).
    pub identity: PathBuf,
    /// Known host keys; default `~/.ssh/known_hosts`.
    pub known_hosts: Option<PathBuf>,
    /// The remote command (a plain path; the default `executor` starts the
    /// bootstrapped copy when the host has one, as with the OpenSSH
    /// transport), or the subsystem name.
    pub remote_command: String,
    /// Request the subsystem `remote_command` instead of running it.
    pub subsystem: bool,
}

struct Verifier {
    host: String,
    port: u16,
    known_hosts: PathBuf,
    /// Why the host key was refused, for the error.
    refusal: Arc<Mutex<Option<String>>>,
}

impl russh::client::Handler for Verifier {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        key: &PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        let PublicKeyOrCertificate::PublicKey { key, .. } = key else {
            *self.refusal.lock().expect("refusal lock") =
                Some("host certificates are not supported by the native transport".into());
            return Ok(false);
        };
        let verdict =
            russh::keys::check_known_hosts_path(&self.host, self.port, key, &self.known_hosts);
        let why = match verdict {
            Ok(true) => return Ok(true),
            Ok(false) => format!(
                "the host key of {}:{} is not in {} (unknown host: add it with ssh-keyscan after checking it)",
                self.host,
                self.port,
                self.known_hosts.display()
            ),
            Err(russh::keys::Error::KeyChanged { line }) => format!(
                "THE HOST KEY OF {}:{} CHANGED (it differs from {} line {line}): refusing to connect",
                self.host,
                self.port,
                self.known_hosts.display()
            ),
            Err(e) => format!("cannot check {}: {e}", self.known_hosts.display()),
        };
        *self.refusal.lock().expect("refusal lock") = Some(why);
        Ok(false)
    }
}

fn closed(what: String) -> Error {
    Error::Closed(what)
}

impl Client {
    /// Connect over SSH without an OpenSSH client (russh): verify the host
    /// key, authenticate with `identity`, run the agent, then `initialize`.
    pub async fn connect_native_ssh(
        host: &str,
        ssh: &NativeSshOptions,
        options: ClientOptions,
    ) -> Result<Client, Error> {
        let known_hosts = match &ssh.known_hosts {
            Some(p) => p.clone(),
            None => std::env::var_os("HOME")
                .map(|h| PathBuf::from(h).join(".ssh/known_hosts"))
                .ok_or_else(|| closed("no known_hosts file and no $HOME".into()))?,
        };
        let refusal = Arc::new(Mutex::new(None));
        let verifier = Verifier {
            host: host.to_string(),
            port: ssh.port,
            known_hosts,
            refusal: refusal.clone(),
        };
        let config = Arc::new(russh::client::Config::default());
        let mut handle = match russh::client::connect(config, (host, ssh.port), verifier).await {
            Ok(h) => h,
            Err(e) => {
                let why = refusal.lock().expect("refusal lock").take();
                return Err(closed(match why {
                    Some(why) => why,
                    None => format!("ssh to {host}:{}: {e}", ssh.port),
                }));
            }
        };
        let key = russh::keys::load_secret_key(&ssh.identity, None).map_err(|e| {
            closed(format!(
                "cannot load the key {}: {e}",
                ssh.identity.display()
            ))
        })?;
        let hash = handle
            .best_supported_rsa_hash()
            .await
            .map_err(|e| closed(format!("ssh: {e}")))?
            .flatten();
        let auth = handle
            .authenticate_publickey(
                ssh.user.clone(),
                PrivateKeyWithHashAlg::new(Arc::new(key), hash),
            )
            .await
            .map_err(|e| closed(format!("ssh authentication: {e}")))?;
        if !auth.success() {
            return Err(closed(format!(
                "ssh: {}@{host} refused the key {}",
                ssh.user,
                ssh.identity.display()
            )));
        }
        let command = crate::target::remote_command_text(&ssh.remote_command, ssh.subsystem)?;
        let channel = handle
            .channel_open_session()
            .await
            .map_err(|e| closed(format!("ssh channel: {e}")))?;
        if ssh.subsystem {
            channel.request_subsystem(true, command).await
        } else {
            channel.exec(true, command).await
        }
        .map_err(|e| closed(format!("ssh: starting {:?}: {e}", ssh.remote_command)))?;
        let (reader, writer) = tokio::io::split(channel.into_stream());
        let client = Client::connect(reader, writer, options).await?;
        // The session lives as long as the client.
        client.keep_alive(Box::new(handle));
        Ok(client)
    }
}
