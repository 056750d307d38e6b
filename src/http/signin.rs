//! Signing the page in without pasting the admin token: `serve` prints a one-time link
//! (`/login?code=…`), valid for ten minutes and once; opening it sets an `HttpOnly`,
//! `SameSite=Strict` cookie that counts as the admin token for twelve hours, so the page stays
//! signed in across reloads. The admin token itself is never in a URL or a log line. The
//! cookie is the expiry and a keyed BLAKE3 hash of it under a key derived from `session.key`
//! and the admin token (a new admin token ends every sign-in): nothing is stored per cookie,
//! and it holds across restarts and nodes. Its name carries the key's fingerprint, so two
//! servers on one host do not take each other's. A request that changes something on the
//! cookie alone must be a same-origin JSON request (a cross-site form cannot send one).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse};
use rand::RngCore as _;
use serde::Deserialize;

/// How long a printed link can be used (once).
const CODE_TTL: Duration = Duration::from_secs(10 * 60);
/// How long the page stays signed in.
const COOKIE_TTL: Duration = Duration::from_secs(12 * 60 * 60);
const COOKIE: &str = "openprogram_admin";

/// The one-time codes handed out, and the key cookies are signed with.
pub struct SignIn {
    codes: Mutex<HashMap<blake3::Hash, Instant>>,
    key: [u8; 32],
    /// `openprogram_admin_` and the key's fingerprint.
    name: String,
}

impl std::fmt::Debug for SignIn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SignIn { .. }")
    }
}

impl SignIn {
    /// Cookies under `session_key` and the admin token's hash `admin`.
    pub fn new(session_key: &[u8; 32], admin: &blake3::Hash) -> Self {
        let material = [&session_key[..], admin.as_bytes()].concat();
        let key = blake3::derive_key("openprogram 2026 page sign-in cookie", &material);
        let fingerprint = blake3::hash(&key).to_hex();
        Self {
            codes: Mutex::default(),
            key,
            name: format!("{COOKIE}_{}", &fingerprint[..12]),
        }
    }

    /// A new one-time code, valid for `CODE_TTL`.
    pub fn code(&self) -> String {
        let mut bytes = [0u8; 16];
        rand::rngs::OsRng.fill_bytes(&mut bytes);
        let code: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
        let mut codes = self.codes.lock().unwrap_or_else(PoisonError::into_inner);
        codes.retain(|_, issued| issued.elapsed() < CODE_TTL);
        codes.insert(blake3::hash(code.as_bytes()), Instant::now());
        code
    }

    /// Whether `code` was handed out, is still fresh and was not used: it is used now.
    fn redeem(&self, code: &str) -> bool {
        let mut codes = self.codes.lock().unwrap_or_else(PoisonError::into_inner);
        let issued = codes.remove(&blake3::hash(code.as_bytes()));
        issued.is_some_and(|issued| issued.elapsed() < CODE_TTL)
    }

    /// The cookie's value for a sign-in until `expires_ms` (wall clock).
    fn cookie(&self, expires_ms: u64) -> String {
        let signature = blake3::keyed_hash(&self.key, &expires_ms.to_be_bytes());
        format!("{expires_ms}.{}", signature.to_hex())
    }

    /// Whether `request` carries a valid, unexpired sign-in cookie, and, if it changes
    /// something, comes from the page itself.
    pub fn admits(&self, request: &HttpRequest) -> bool {
        if !reads_only(request) && !from_the_page(request) {
            return false;
        }
        let cookies = request.headers().get_all(header::COOKIE);
        let values = cookies.filter_map(|value| value.to_str().ok());
        let mut ours = values.flat_map(|value| value.split(';')).filter_map(|pair| {
            let (name, value) = pair.trim().split_once('=')?;
            (name == self.name).then_some(value)
        });
        ours.any(|value| {
            let Some((expires, signature)) = value.split_once('.') else {
                return false;
            };
            let (Ok(expires_ms), Ok(given)) =
                (expires.parse::<u64>(), blake3::Hash::from_hex(signature))
            else {
                return false;
            };
            // Equality of two hashes is constant-time.
            let expected = blake3::keyed_hash(&self.key, &expires_ms.to_be_bytes());
            given == expected && now_ms() < expires_ms
        })
    }
}

fn reads_only(request: &HttpRequest) -> bool {
    matches!(request.method().as_str(), "GET" | "HEAD")
}

/// A JSON request the browser did not send for another site: a cross-site form cannot set
/// that content type, and a cross-origin script that does must pass a preflight this server
/// never answers.
fn from_the_page(request: &HttpRequest) -> bool {
    let header = |name| request.headers().get(name).and_then(|value| value.to_str().ok());
    let json = header(header::CONTENT_TYPE).is_some_and(|kind| kind.starts_with("application/json"));
    let site = header(header::HeaderName::from_static("sec-fetch-site"));
    json && site.is_none_or(|site| site == "same-origin")
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
}

#[derive(Debug, Deserialize)]
pub struct LoginQuery {
    code: String,
}

/// `GET /login?code=…`: a fresh, unused code signs the page in (a cookie) and opens it.
pub fn login(sign_in: &SignIn, query: &LoginQuery) -> HttpResponse {
    if !sign_in.redeem(&query.code) {
        return HttpResponse::Unauthorized().json(serde_json::json!({
            "code": "sign_in_link_used",
            "message": "this sign-in link was used already or is older than ten minutes: \
                        serve prints a new one when it starts, or paste the admin token",
        }));
    }
    let expires_ms = now_ms() + COOKIE_TTL.as_millis() as u64;
    let cookie = format!(
        "{}={}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}",
        sign_in.name,
        sign_in.cookie(expires_ms),
        COOKIE_TTL.as_secs()
    );
    HttpResponse::SeeOther()
        .insert_header((header::LOCATION, "/"))
        .insert_header((header::SET_COOKIE, cookie))
        .finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_cookie(sign_in: &SignIn, value: &str) -> actix_web::test::TestRequest {
        let cookie = format!("other=1; {}={value}", sign_in.name);
        actix_web::test::TestRequest::default().insert_header((header::COOKIE, cookie))
    }

    #[test]
    fn x2_a_sign_in_code_works_once_and_its_cookie_only_as_signed_and_until_it_expires() {
        let admin = blake3::hash(b"admin");
        let sign_in = SignIn::new(&[7; 32], &admin);
        let with_cookie = |value: &str| with_cookie(&sign_in, value).to_http_request();
        let code = sign_in.code();
        assert!(sign_in.redeem(&code));
        assert!(!sign_in.redeem(&code), "once");
        assert!(!sign_in.redeem("0123"), "only a code handed out");
        let valid = sign_in.cookie(now_ms() + 60_000);
        assert!(sign_in.admits(&with_cookie(&valid)));
        let expired = sign_in.cookie(now_ms() - 1);
        assert!(!sign_in.admits(&with_cookie(&expired)));
        let (expires, signature) = valid.split_once('.').expect("two parts");
        let later = format!("{}.{signature}", expires.parse::<u64>().expect("ms") + 1);
        assert!(!sign_in.admits(&with_cookie(&later)), "the expiry is signed");
        let other_key = SignIn::new(&[8; 32], &admin);
        let other = |value: &str| self::with_cookie(&other_key, value).to_http_request();
        assert!(!other_key.admits(&other(&valid)), "another server's key");
        let new_admin = SignIn::new(&[7; 32], &blake3::hash(b"replaced"));
        let again = |value: &str| self::with_cookie(&new_admin, value).to_http_request();
        assert!(!new_admin.admits(&again(&valid)), "a new admin token ends it");
    }

    #[test]
    fn x2_a_change_on_the_cookie_alone_must_come_from_the_page() {
        let sign_in = SignIn::new(&[7; 32], &blake3::hash(b"admin"));
        let valid = sign_in.cookie(now_ms() + 60_000);
        let post = |kind: &str, site: Option<&str>| {
            let mut request = with_cookie(&sign_in, &valid)
                .method(actix_web::http::Method::POST)
                .insert_header((header::CONTENT_TYPE, kind));
            if let Some(site) = site {
                request = request.insert_header(("sec-fetch-site", site));
            }
            sign_in.admits(&request.to_http_request())
        };
        assert!(post("application/json", Some("same-origin")));
        assert!(post("application/json", None), "a client that sends no fetch metadata");
        assert!(!post("text/plain", Some("same-origin")), "a form's body");
        assert!(!post("application/json", Some("same-site")), "another port of the host");
    }
}
