//! Tokens: the admin token, valid everywhere, and session tokens, each valid for one
//! session. A session token is the hex of a keyed BLAKE3 hash of the session id under a 32-byte
//! secret in `DIR/session.key` (mode 0600, made on first start): nothing is stored per session, and
//! tokens stay valid across restarts while the key file does. Every comparison is between two
//! BLAKE3 hashes, whose equality is constant-time, so a wrong guess leaks no prefix through timing.
//! Routes decide what a token may reach (`authorize_session`, `authorize_admin`).

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

use actix_web::HttpRequest;
use openprogram_storage::SessionId;
use rand::RngCore as _;

use super::error::ApiError;

/// The secrets of one server.
#[derive(Clone)]
pub struct Tokens {
    admin_hash: blake3::Hash,
    session_key: [u8; 32],
    /// The page's sign-in links and cookies (`signin.rs`).
    sign_in: std::sync::Arc<super::signin::SignIn>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tokens { .. }")
    }
}

/// Bytes of entropy in a generated admin token.
const ADMIN_TOKEN_BYTES: usize = 32;

impl Tokens {
    pub fn new(admin_token: &str, session_key: [u8; 32]) -> Self {
        Self {
            admin_hash: blake3::hash(admin_token.as_bytes()),
            session_key,
            sign_in: std::sync::Arc::new(super::signin::SignIn::new(
                &session_key,
                &blake3::hash(admin_token.as_bytes()),
            )),
        }
    }

    /// The page's sign-in: one-time links, and the cookie that counts as the admin token.
    pub fn sign_in(&self) -> &super::signin::SignIn {
        &self.sign_in
    }

    /// The token of one session.
    pub fn session_token(&self, session_id: SessionId) -> String {
        self.session_hash(session_id).to_hex().to_string()
    }

    fn session_hash(&self, session_id: SessionId) -> blake3::Hash {
        blake3::keyed_hash(&self.session_key, session_id.as_bytes())
    }

    pub fn is_admin(&self, token: &str) -> bool {
        blake3::hash(token.as_bytes()) == self.admin_hash
    }

    /// Whether `token` may reach `session_id`: the admin token or that session's token.
    pub fn allows_session(&self, token: &str, session_id: SessionId) -> bool {
        let given = blake3::Hash::from_hex(token);
        self.is_admin(token) || given.is_ok_and(|given| given == self.session_hash(session_id))
    }

    pub fn authorize_session(
        &self,
        request: &HttpRequest,
        session_id: SessionId,
    ) -> Result<(), ApiError> {
        match bearer(request) {
            Some(token) if self.allows_session(token, session_id) => Ok(()),
            None if self.sign_in.admits(request) => Ok(()),
            _ => Err(ApiError::unauthorized()),
        }
    }

    pub fn authorize_admin(&self, request: &HttpRequest) -> Result<(), ApiError> {
        match bearer(request) {
            Some(token) if self.is_admin(token) => Ok(()),
            None if self.sign_in.admits(request) => Ok(()),
            _ => Err(ApiError::unauthorized()),
        }
    }
}

/// The token of `Authorization: Bearer TOKEN`, if any.
pub fn bearer(request: &HttpRequest) -> Option<&str> {
    let header = request
        .headers()
        .get(actix_web::http::header::AUTHORIZATION)?;
    let value = header.to_str().ok()?;
    let token = value.strip_prefix("Bearer ")?.trim();
    (!token.is_empty()).then_some(token)
}

/// The session key of `dir`, created (32 random bytes, hex, mode 0600) if absent.
pub fn load_or_create_session_key(dir: &Path) -> std::io::Result<[u8; 32]> {
    let path = dir.join("session.key");
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            let mut key = [0u8; 32];
            rand::rngs::OsRng.fill_bytes(&mut key);
            write_secret(&path, &hex(&key))?;
            return Ok(key);
        }
        Err(error) => return Err(error),
    };
    // Never replaced silently: a new key would invalidate every session token handed out.
    let invalid = || {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "{} is not 64 hex digits; restore it or delete it (every session token changes)",
                path.display()
            ),
        )
    };
    let hash = blake3::Hash::from_hex(text.trim()).map_err(|_| invalid())?;
    Ok(*hash.as_bytes())
}

/// The admin token: `given` (from `--token` or `OPENPROGRAM_TOKEN`), else the one in
/// `DIR/admin.token`, else a new one written there (mode 0600). Returns it and where it came from.
pub fn admin_token(dir: &Path, given: Option<String>) -> std::io::Result<(String, String)> {
    if let Some(token) = given.filter(|token| !token.trim().is_empty()) {
        return Ok((token.trim().to_string(), "given".into()));
    }
    let path = dir.join("admin.token");
    match std::fs::read_to_string(&path) {
        Ok(text) if !text.trim().is_empty() => {
            return Ok((text.trim().to_string(), path.display().to_string()))
        }
        Ok(_) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(error),
    }
    let mut bytes = [0u8; ADMIN_TOKEN_BYTES];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    let token = hex(&bytes);
    write_secret(&path, &token)?;
    Ok((token, path.display().to_string()))
}

/// Writes a secret readable by its owner only, whole or not at all (a temporary file
/// renamed into place).
pub(crate) fn write_secret(path: &Path, text: &str) -> std::io::Result<()> {
    let temporary = path.with_extension("tmp");
    let _ = std::fs::remove_file(&temporary);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&temporary)?;
    file.write_all(text.as_bytes())?;
    file.write_all(b"\n")?;
    file.sync_all()?;
    std::fs::rename(&temporary, path)
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}
