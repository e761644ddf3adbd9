//! Certificates from an ACME authority (RFC 8555): an account kept in the
//! ACME folder, an order for the names valve serves, HTTP-01 proven through
//! `Challenges` (answered on the plain-HTTP port), the certificate and its
//! key saved beside the account, and a renewal when a third of its life is
//! left. A renewal that fails is tried again with a growing pause while the
//! old certificate serves on, and is said in the log and on the status page.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use instant_acme::{
    Account, AccountCredentials, AuthorizationStatus, ChallengeType, Identifier, NewAccount, NewOrder, OrderStatus,
    RetryPolicy,
};

use super::certs::{self, Pair};
use super::Store;

/// The answers to HTTP-01 checks under way: token to key authorization.
#[derive(Default, Debug)]
pub struct Challenges(Mutex<HashMap<String, String>>);

impl Challenges {
    /// What `/.well-known/acme-challenge/TOKEN` answers, if that check is under way.
    pub fn answer(&self, token: &str) -> Option<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).get(token).cloned()
    }

    fn put(&self, token: String, answer: String) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).insert(token, answer);
    }

    fn clear(&self) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

/// Who valve asks, for which names, and where it keeps what it gets.
#[derive(Clone, Debug)]
pub struct Settings {
    pub domains: Vec<String>,
    pub contact: Vec<String>,
    pub directory: String,
    pub ca: Option<PathBuf>,
    pub dir: PathBuf,
}

/// The ACME side of one valve.
pub struct Authority {
    settings: Settings,
    pub challenges: Arc<Challenges>,
}

const CERT: &str = "certificate.pem";
const KEY: &str = "key.pem";
const ACCOUNT: &str = "account.json";

/// The longest one order may take, from asking to the certificate.
const ORDER_TIMEOUT: Duration = Duration::from_secs(120);
/// The first pause after a failed renewal; doubled after each, up to `RETRY_MOST`.
const RETRY_FIRST: Duration = Duration::from_secs(5);
const RETRY_MOST: Duration = Duration::from_secs(3600);

impl Authority {
    pub fn new(settings: Settings) -> Arc<Authority> {
        Arc::new(Authority { settings, challenges: Arc::new(Challenges::default()) })
    }

    /// The certificate kept from an earlier run, if it is for these names
    /// and has more than a third of its life left.
    pub fn kept(&self) -> Option<(Pair, SystemTime)> {
        let (cert, key) = (self.settings.dir.join(CERT), self.settings.dir.join(KEY));
        let pair = certs::load(&cert, &key).ok()?;
        let issued = std::fs::metadata(&cert).and_then(|m| m.modified()).ok()?;
        let covers = self.settings.domains.iter().all(|d| pair.names.iter().any(|n| n == d));
        (covers && renew_at(issued, pair.not_after) > SystemTime::now()).then_some((pair, issued))
    }

    /// Asks the authority for a certificate for the names and saves it.
    pub async fn issue(&self) -> Result<Pair, String> {
        let r = tokio::time::timeout(ORDER_TIMEOUT, self.order()).await;
        self.challenges.clear();
        match r {
            Ok(r) => r,
            Err(_) => Err(format!("the authority did not issue within {} s", ORDER_TIMEOUT.as_secs())),
        }
    }

    async fn order(&self) -> Result<Pair, String> {
        let s = &self.settings;
        let account = self.account().await?;
        let ids: Vec<Identifier> = s.domains.iter().map(|d| Identifier::Dns(d.clone())).collect();
        let mut order = account.new_order(&NewOrder::new(&ids)).await.map_err(|e| format!("new order: {e}"))?;
        let mut authorizations = order.authorizations();
        while let Some(authz) = authorizations.next().await {
            let mut authz = authz.map_err(|e| format!("authorization: {e}"))?;
            if authz.status == AuthorizationStatus::Valid {
                continue;
            }
            let Some(mut challenge) = authz.challenge(ChallengeType::Http01) else {
                return Err("the authority offers no HTTP-01 check for these names".into());
            };
            let answer = challenge.key_authorization().as_str().to_string();
            self.challenges.put(challenge.token.clone(), answer);
            challenge.set_ready().await.map_err(|e| format!("challenge: {e}"))?;
        }
        let patience = RetryPolicy::new().timeout(ORDER_TIMEOUT);
        let status = order.poll_ready(&patience).await.map_err(|e| format!("waiting for the checks: {e}"))?;
        if status != OrderStatus::Ready {
            let why = order
                .refresh()
                .await
                .ok()
                .and_then(|st| st.error.as_ref().map(|p| p.to_string()))
                .unwrap_or_else(|| format!("the order is {status:?}"));
            return Err(format!(
                "the authority could not check the names ({why}): it must reach http://NAME/.well-known/acme-challenge/ on the plain-HTTP port (80)"
            ));
        }
        let key_pem = order.finalize().await.map_err(|e| format!("finalize: {e}"))?;
        let chain_pem = order.poll_certificate(&patience).await.map_err(|e| format!("certificate: {e}"))?;
        let pair = certs::from_pem(
            chain_pem.as_bytes(),
            key_pem.as_bytes(),
            Path::new(&s.directory),
            Path::new("the new key"),
        )
        .map_err(|e| e.to_string())?;
        save(&s.dir.join(KEY), key_pem.as_bytes())
            .map_err(|e| format!("saving the key in {}: {e}", s.dir.display()))?;
        save(&s.dir.join(CERT), chain_pem.as_bytes())
            .map_err(|e| format!("saving the certificate in {}: {e}", s.dir.display()))?;
        Ok(pair)
    }

    /// The account kept in the folder for this directory, else a new one (kept).
    async fn account(&self) -> Result<Account, String> {
        let s = &self.settings;
        let builder = || match &s.ca {
            Some(ca) => Account::builder_with_root(ca).map_err(|e| format!("tls_acme_ca {}: {e}", ca.display())),
            None => Account::builder().map_err(|e| format!("the system's root certificates: {e}")),
        };
        let path = s.dir.join(ACCOUNT);
        if let Ok(text) = std::fs::read_to_string(&path) {
            if let Ok(kept) = serde_json::from_str::<KeptAccount>(&text) {
                if kept.directory == s.directory {
                    return builder()?
                        .from_credentials(kept.credentials)
                        .await
                        .map_err(|e| format!("the account in {}: {e}", path.display()));
                }
            }
        }
        let contact: Vec<&str> = s.contact.iter().map(String::as_str).collect();
        let new = NewAccount { contact: &contact, terms_of_service_agreed: true, only_return_existing: false };
        let (account, credentials) = builder()?
            .create(&new, s.directory.clone(), None)
            .await
            .map_err(|e| format!("creating an account at {}: {e}", s.directory))?;
        let kept = KeptAccount { directory: s.directory.clone(), credentials };
        let text = serde_json::to_vec_pretty(&kept).map_err(|e| e.to_string())?;
        save(&path, &text).map_err(|e| format!("saving the account in {}: {e}", s.dir.display()))?;
        Ok(account)
    }

    /// Renews the certificate in `store` when a third of its life is left,
    /// for as long as valve runs.
    pub fn keep_renewed(self: Arc<Self>, store: Arc<Store>, mut issued: SystemTime) {
        tokio::spawn(async move {
            let mut pause = RETRY_FIRST;
            loop {
                let due = renew_at(issued, store.shown().not_after);
                if let Ok(wait) = due.duration_since(SystemTime::now()) {
                    tokio::time::sleep(wait).await;
                }
                match self.issue().await {
                    Ok(pair) => {
                        tracing::info!(names = ?pair.names, expires = %httpdate::fmt_http_date(pair.not_after),
                            "TLS certificate renewed by the ACME authority");
                        store.replace(pair);
                        issued = SystemTime::now();
                        pause = RETRY_FIRST;
                    }
                    Err(why) => {
                        let left = super::certs::days_left(store.shown().not_after);
                        tracing::warn!(error = %why, days_left = format!("{left:.2}"), retry_s = pause.as_secs(),
                            "TLS certificate not renewed: the current one serves on");
                        store.failed(why);
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(RETRY_MOST);
                    }
                }
            }
        });
    }
}

/// An account as kept: its directory and credentials.
#[derive(serde::Serialize, serde::Deserialize)]
struct KeptAccount {
    directory: String,
    credentials: AccountCredentials,
}

/// When a certificate issued at `issued` and valid until `not_after` is
/// renewed: once a third of its life is left (30 days of Let's Encrypt's 90).
pub fn renew_at(issued: SystemTime, not_after: SystemTime) -> SystemTime {
    let life = not_after.duration_since(issued).unwrap_or_default();
    not_after - life / 3
}

/// Writes `bytes` to `path` whole (a temporary file renamed into place), private to valve's user.
fn save(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = path.with_extension("partial");
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_is_renewed_with_a_third_of_its_life_left() {
        let issued = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let ninety = issued + Duration::from_secs(90 * 86400);
        assert_eq!(renew_at(issued, ninety), issued + Duration::from_secs(60 * 86400));
        assert_eq!(renew_at(issued, issued + Duration::from_secs(30)), issued + Duration::from_secs(20));
    }
}
