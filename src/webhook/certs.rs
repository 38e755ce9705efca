//! The webhook's serving certificate, made and rotated by the controller
//! itself: a CA and a leaf signed by it, kept in one Secret of the
//! controller's namespace (shared by every replica), and the CA patched into
//! the MutatingWebhookConfiguration's `caBundle`.
//!
//! - The CA lives ten years; the leaf ninety days and is renewed once less
//!   than a third of that is left, when the names it must carry changed, or
//!   when the Secret is annotated `zkgate.io/rotate`. The CA stays, so the
//!   `caBundle` the API server trusts does not change with the leaf:
//!   admission keeps working across a rotation, whichever replica answers.
//! - Replicas race to make or renew the Secret; a write conditioned on the
//!   resourceVersion wins once, the others read what won.
//!
//! With cert-manager (`--webhook-cert-dir`), none of this runs: the leaf is
//! read from the mounted Secret and cert-manager's CA injector fills the
//! `caBundle`.

use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use k8s_openapi::ByteString;
use kube::api::{Api, PostParams};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use tracing::{info, warn};

/// Set on the webhook's certificate Secret to have the leaf made again.
pub const ROTATE_CERTIFICATE_ANNOTATION: &str = "zkgate.io/rotate";
/// The Secret's keys.
pub const CA_CERT: &str = "ca.crt";
const CA_KEY: &str = "ca.key";
/// The leaf certificate (PEM).
pub const TLS_CERT: &str = "tls.crt";
/// The leaf's key (PEM).
pub const TLS_KEY: &str = "tls.key";
/// When the leaf expires (RFC 3339), so that no replica parses X.509 to know.
const NOT_AFTER_ANNOTATION: &str = "zkgate.io/not-after";
/// The names the leaf was made for, comma-separated.
const NAMES_ANNOTATION: &str = "zkgate.io/names";
const CA_NAME: &str = "zkgate webhook CA";
const CA_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// How long a leaf lives.
pub const LEAF_LIFETIME: Duration = Duration::from_secs(90 * 24 * 3600);

/// Why the certificate could not be made or published.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// Generating or signing failed.
    #[error("cannot make the webhook certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// The API server refused or failed.
    #[error("cannot keep the webhook certificate Secret or caBundle: {0}")]
    Kube(#[from] kube::Error),
    /// The Secret holds something unreadable where a key should be.
    #[error("the webhook certificate Secret's {0} is not valid")]
    Unreadable(&'static str),
}

/// A serving certificate: the PEMs a TLS server and its clients need.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Serving {
    /// The CA the clients trust (the `caBundle`).
    pub ca: String,
    /// The leaf certificate.
    pub cert: String,
    /// The leaf's private key.
    pub key: String,
}

/// Where the certificate lives and what it must name.
#[derive(Clone, Debug)]
pub struct SelfManaged {
    /// The Secret (in the controller's namespace).
    pub secret: Api<Secret>,
    /// Its name.
    pub secret_name: String,
    /// The MutatingWebhookConfiguration whose `caBundle` is kept, if any.
    pub configuration: Option<String>,
    /// The names the API server reaches the webhook by (the Service's DNS
    /// names; an IP for a URL like `https://127.0.0.1:9443`).
    pub names: Vec<String>,
}

impl SelfManaged {
    /// Makes sure the Secret holds a CA and a leaf good for a while yet
    /// for [`SelfManaged::names`], renewing what is due, and returns them.
    pub async fn ensure(&self) -> Result<Serving, CertError> {
        loop {
            let existing = self.secret.get_opt(&self.secret_name).await?;
            let now = Timestamp::now();
            let wanted = match &existing {
                Some(secret) => match self.due(secret, now) {
                    None => return serving(secret),
                    Some(why) => {
                        info!(secret = %self.secret_name, why, "renewing the webhook's serving certificate");
                        let ca = ca_of(secret);
                        self.issue(ca, now)?
                    }
                },
                None => {
                    info!(secret = %self.secret_name, "making the webhook's CA and serving certificate");
                    self.issue(None, now)?
                }
            };
            let written = match existing {
                // Conditioned on what was read: a replica that renewed it
                // first wins, and this one reads what it wrote.
                Some(old) => {
                    let mut new = wanted;
                    new.metadata.resource_version = old.metadata.resource_version;
                    self.secret
                        .replace(&self.secret_name, &PostParams::default(), &new)
                        .await
                }
                None => self.secret.create(&PostParams::default(), &wanted).await,
            };
            match written {
                Ok(secret) => return serving(&secret),
                Err(kube::Error::Api(e)) if e.code == 409 => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Why the Secret's leaf must be renewed, if it must.
    fn due(&self, secret: &Secret, now: Timestamp) -> Option<&'static str> {
        let annotations = secret.metadata.annotations.clone().unwrap_or_default();
        if serving(secret).is_err() || ca_of(secret).is_none() {
            return Some("the Secret is incomplete");
        }
        if annotations.contains_key(ROTATE_CERTIFICATE_ANNOTATION) {
            return Some("asked for (annotation zkgate.io/rotate)");
        }
        if annotations.get(NAMES_ANNOTATION) != Some(&self.names.join(",")) {
            return Some("the names it must carry changed");
        }
        renewal_due(&annotations, now).then_some("it expires within a third of its lifetime")
    }

    /// A Secret with a new leaf, signed by `ca` (its certificate and key
    /// PEMs) or by a new CA.
    fn issue(&self, ca: Option<(String, String)>, now: Timestamp) -> Result<Secret, CertError> {
        let (ca_pem, ca_key) = match ca {
            Some(ca) => ca,
            None => {
                let key = KeyPair::generate()?;
                let cert = ca_params(now)?.self_signed(&key)?;
                (cert.pem(), key.serialize_pem())
            }
        };
        let ca_key_pair = KeyPair::from_pem(&ca_key)?;
        // The issuer's name and key are all a signature needs of the CA.
        let issuer = Issuer::new(ca_params(now)?, ca_key_pair);
        let mut leaf = CertificateParams::default();
        leaf.distinguished_name = DistinguishedName::new();
        leaf.distinguished_name.push(
            DnType::CommonName,
            self.names.first().cloned().unwrap_or_default(),
        );
        leaf.subject_alt_names = self
            .names
            .iter()
            .map(|n| match n.parse::<IpAddr>() {
                Ok(ip) => Ok(SanType::IpAddress(ip)),
                Err(_) => Ok(SanType::DnsName(n.clone().try_into()?)),
            })
            .collect::<Result<_, rcgen::Error>>()?;
        leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let (not_before, not_after) = validity(now, LEAF_LIFETIME)?;
        leaf.not_before = not_before;
        leaf.not_after = not_after;
        let key = KeyPair::generate()?;
        let cert = leaf.signed_by(&key, &issuer)?;
        let until = leaf_not_after(now);
        Ok(Secret {
            metadata: ObjectMeta {
                name: Some(self.secret_name.clone()),
                labels: Some(crate::workload::managed_by()),
                annotations: Some(
                    [
                        (NOT_AFTER_ANNOTATION.to_owned(), until.to_string()),
                        (NAMES_ANNOTATION.to_owned(), self.names.join(",")),
                    ]
                    .into(),
                ),
                ..Default::default()
            },
            type_: Some("Opaque".to_owned()),
            data: Some(
                [
                    (CA_CERT, ca_pem),
                    (CA_KEY, ca_key),
                    (TLS_CERT, cert.pem()),
                    (TLS_KEY, key.serialize_pem()),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), ByteString(v.into_bytes())))
                .collect(),
            ),
            ..Default::default()
        })
    }

    /// Puts `ca` into every webhook's `caBundle` of the configuration, when
    /// one is named and it holds another: the MutatingWebhookConfiguration
    /// of that name (pods), and the ValidatingWebhookConfiguration of that
    /// name (Barriers) where there is one.
    pub async fn publish_ca(&self, client: &kube::Client, ca: &str) -> Result<(), CertError> {
        let Some(name) = &self.configuration else {
            return Ok(());
        };
        let bundle = ByteString(ca.as_bytes().to_vec());
        let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
        publish_in(&mutating, name, &bundle, |c| {
            c.webhooks
                .iter_mut()
                .flatten()
                .map(|w| &mut w.client_config)
                .collect()
        })
        .await?;
        // The Barriers' configuration is optional (advice, failurePolicy
        // Ignore; RBAC written for a chart without it may not grant it): a
        // failure there is a warning, never the pods' webhook's.
        let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
        let published = match validating.get_opt(name).await {
            Ok(Some(_)) => {
                publish_in(&validating, name, &bundle, |c| {
                    c.webhooks
                        .iter_mut()
                        .flatten()
                        .map(|w| &mut w.client_config)
                        .collect()
                })
                .await
            }
            Ok(None) => Ok(()),
            Err(e) => Err(e.into()),
        };
        if let Err(e) = published {
            warn!(configuration = %name, error = %e, "cannot publish the webhook's CA in the Barriers' ValidatingWebhookConfiguration: Barriers written by hand are not checked at admission (the controller still fails a cycle)");
        }
        Ok(())
    }
}

/// Puts `bundle` into the `caBundle`s (`configs` of it) of the webhook
/// configuration `name`, when it holds another; retried on a conflict.
async fn publish_in<K>(
    api: &Api<K>,
    name: &str,
    bundle: &ByteString,
    configs: for<'a> fn(&'a mut K) -> Vec<&'a mut WebhookClientConfig>,
) -> Result<(), CertError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    loop {
        let mut config = api.get(name).await?;
        let mut changed = false;
        for client_config in configs(&mut config) {
            if client_config.ca_bundle.as_ref() != Some(bundle) {
                client_config.ca_bundle = Some(bundle.clone());
                changed = true;
            }
        }
        if !changed {
            return Ok(());
        }
        match api.replace(name, &PostParams::default(), &config).await {
            Ok(_) => {
                info!(configuration = %name, "published the webhook's CA in its caBundle");
                return Ok(());
            }
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// The CA's parameters: the same each time, so a stored CA key signs as
/// the CA it made.
fn ca_params(now: Timestamp) -> Result<CertificateParams, CertError> {
    let mut ca = CertificateParams::default();
    ca.distinguished_name = DistinguishedName::new();
    ca.distinguished_name.push(DnType::CommonName, CA_NAME);
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let (not_before, not_after) = validity(now, CA_LIFETIME)?;
    ca.not_before = not_before;
    ca.not_after = not_after;
    Ok(ca)
}

/// Whether the leaf whose expiry [`NOT_AFTER_ANNOTATION`] (among
/// `annotations`) gives has a third of its lifetime or less left at `now`
/// (or says nothing readable).
fn renewal_due(annotations: &std::collections::BTreeMap<String, String>, now: Timestamp) -> bool {
    let renew_at = annotations
        .get(NOT_AFTER_ANNOTATION)
        .and_then(|t| t.parse::<Timestamp>().ok())
        .and_then(|t| {
            t.checked_sub(k8s_openapi::jiff::SignedDuration::try_from(LEAF_LIFETIME / 3).ok()?)
                .ok()
        });
    renew_at.is_none_or(|at| now >= at)
}

/// When a leaf made `now` expires, for its annotation.
fn leaf_not_after(now: Timestamp) -> Timestamp {
    now.checked_add(k8s_openapi::jiff::SignedDuration::try_from(LEAF_LIFETIME).unwrap_or_default())
        .unwrap_or(now)
}

/// From an hour ago (clocks differ a little) for `lifetime`.
fn validity(
    now: Timestamp,
    lifetime: Duration,
) -> Result<(time::OffsetDateTime, time::OffsetDateTime), CertError> {
    let start = time::OffsetDateTime::from_unix_timestamp(now.as_second() - 3600)
        .map_err(|_| CertError::Unreadable("clock"))?;
    Ok((start, start + lifetime + Duration::from_secs(3600)))
}

fn field(secret: &Secret, key: &'static str) -> Result<String, CertError> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
        .filter(|s| s.contains("-----BEGIN"))
        .ok_or(CertError::Unreadable(key))
}

fn ca_of(secret: &Secret) -> Option<(String, String)> {
    let cert = field(secret, CA_CERT).ok()?;
    let key = field(secret, CA_KEY).ok()?;
    KeyPair::from_pem(&key).ok()?;
    Some((cert, key))
}

fn serving(secret: &Secret) -> Result<Serving, CertError> {
    Ok(Serving {
        ca: field(secret, CA_CERT)?,
        cert: field(secret, TLS_CERT)?,
        key: field(secret, TLS_KEY)?,
    })
}

/// The CA the namespaces' participant client certificates are issued from
/// (`--participant-ca-cert`/`--participant-ca-key`): each namespace gets a
/// certificate of its own, which names it (`CN=zkgate-participant.<ns>`),
/// so a namespace's pods never hold the controller's identity, and one
/// namespace's certificate says nothing of another's.
#[derive(Clone)]
pub struct ParticipantCa {
    cert: String,
    key: String,
    /// Names this CA in logs (a hash of its certificate).
    fingerprint: String,
}

impl std::fmt::Debug for ParticipantCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParticipantCa")
            .field("fingerprint", &self.fingerprint)
            .finish_non_exhaustive()
    }
}

/// A participant certificate and its key.
pub struct Issued {
    /// The certificate (PEM).
    pub cert: String,
    /// Its key (PEM).
    pub key: String,
}

impl ParticipantCa {
    /// The CA from its certificate and key (PEM); refused when they cannot
    /// sign.
    pub fn new(cert: String, key: String) -> Result<ParticipantCa, rcgen::Error> {
        use std::hash::{Hash, Hasher};
        let ca = ParticipantCa {
            fingerprint: {
                let mut h = std::collections::hash_map::DefaultHasher::new();
                cert.hash(&mut h);
                format!("{:016x}", h.finish())
            },
            cert,
            key,
        };
        ca.issue("check")?;
        Ok(ca)
    }

    /// A new client certificate for `namespace`'s participants.
    pub fn issue(&self, namespace: &str) -> Result<Issued, rcgen::Error> {
        let issuer = Issuer::from_ca_cert_pem(&self.cert, KeyPair::from_pem(&self.key)?)?;
        let now = Timestamp::now();
        let mut leaf = CertificateParams::default();
        leaf.distinguished_name = DistinguishedName::new();
        leaf.distinguished_name.push(
            DnType::CommonName,
            format!("zkgate-participant.{namespace}"),
        );
        leaf.distinguished_name
            .push(DnType::OrganizationName, "zkgate");
        leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let (not_before, not_after) =
            validity(now, LEAF_LIFETIME).map_err(|_| rcgen::Error::Time)?;
        leaf.not_before = not_before;
        leaf.not_after = not_after;
        let key = KeyPair::generate()?;
        let cert = leaf.signed_by(&key, &issuer)?;
        Ok(Issued {
            cert: cert.pem(),
            key: key.serialize_pem(),
        })
    }
}
