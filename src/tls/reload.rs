//! The certificate, key and CA a process holds, swapped whole when the
//! files change. rustls asks for them on every handshake (the resolvers and
//! verifiers below), so a swap reaches every new connection at once.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ResolvesClientCert, WebPkiServerVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};

use super::{Expect, Identity};

/// The three files a process's TLS comes from.
#[derive(Debug, Clone)]
pub struct Files {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

/// What one load of the files gave.
struct Material {
    key: Arc<CertifiedKey>,
    clients: Arc<dyn ClientCertVerifier>,
    servers: Arc<WebPkiServerVerifier>,
    /// The certificate's `notAfter`, Unix seconds.
    not_after: i64,
}

/// A process's TLS: its certificate and the CA, reloadable.
pub struct Tls {
    files: Files,
    me: Identity,
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<Material>>,
    /// The files' (modified, length) when last loaded or last tried, so a
    /// broken edit is reported once, not every poll.
    seen: Mutex<Vec<Option<(SystemTime, u64)>>>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("me", &self.me)
            .field("cert", &self.files.cert)
            .finish_non_exhaustive()
    }
}

/// The crypto every Meridian connection uses (ring; TLS 1.2 and 1.3).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

fn read(what: &str, path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("--tls-{what} {}: {e}", path.display()))
}

/// The identity and expiry in a certificate.
pub fn describe(cert: &CertificateDer<'_>) -> Result<(Identity, i64), String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref())
        .map_err(|e| format!("not an X.509 certificate ({e})"))?;
    let mut uris = Vec::new();
    if let Ok(Some(san)) = parsed.subject_alternative_name() {
        for name in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::URI(uri) = name {
                uris.push(*uri);
            }
        }
    }
    let identity = Identity::from_uris(uris)?;
    Ok((identity, parsed.validity().not_after.timestamp()))
}

impl Material {
    fn load(
        files: &Files,
        me: &Identity,
        provider: &Arc<CryptoProvider>,
    ) -> Result<Material, String> {
        let cert_pem = read("cert", &files.cert)?;
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<_, _>>()
            .map_err(|e| format!("--tls-cert {}: {e}", files.cert.display()))?;
        let leaf = chain
            .first()
            .ok_or_else(|| format!("--tls-cert {}: holds no certificate", files.cert.display()))?;
        let (identity, not_after) =
            describe(leaf).map_err(|e| format!("--tls-cert {}: {e}", files.cert.display()))?;
        if identity != *me {
            return Err(format!(
                "--tls-cert {}: names {identity}, but this process is {me}",
                files.cert.display()
            ));
        }
        let key_pem = read("key", &files.key)?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem)
            .map_err(|e| format!("--tls-key {}: {e}", files.key.display()))?;
        let key = CertifiedKey::from_der(chain, key, provider).map_err(|e| {
            format!(
                "--tls-key {} does not go with --tls-cert {}: {e}",
                files.key.display(),
                files.cert.display()
            )
        })?;
        let ca_pem = read("ca", &files.ca)?;
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&ca_pem) {
            let cert = cert.map_err(|e| format!("--tls-ca {}: {e}", files.ca.display()))?;
            roots
                .add(cert)
                .map_err(|e| format!("--tls-ca {}: {e}", files.ca.display()))?;
        }
        if roots.is_empty() {
            return Err(format!(
                "--tls-ca {}: holds no certificate",
                files.ca.display()
            ));
        }
        let roots = Arc::new(roots);
        let clients =
            WebPkiClientVerifier::builder_with_provider(Arc::clone(&roots), Arc::clone(provider))
                .build()
                .map_err(|e| format!("--tls-ca {}: {e}", files.ca.display()))?;
        let servers = WebPkiServerVerifier::builder_with_provider(roots, Arc::clone(provider))
            .build()
            .map_err(|e| format!("--tls-ca {}: {e}", files.ca.display()))?;
        Ok(Material {
            key: Arc::new(key),
            clients,
            servers,
            not_after,
        })
    }
}

impl Tls {
    /// Loads the files, which must hold a certificate naming `me`.
    pub fn load(files: Files, me: Identity) -> Result<Arc<Tls>, String> {
        let provider = provider();
        let seen = [&files.cert, &files.key, &files.ca]
            .map(|p| stamp(p))
            .to_vec();
        let material = Material::load(&files, &me, &provider)?;
        record_expiry(material.not_after);
        Ok(Arc::new(Tls {
            files,
            me,
            provider,
            current: RwLock::new(Arc::new(material)),
            seen: Mutex::new(seen),
        }))
    }

    fn current(&self) -> Arc<Material> {
        Arc::clone(&self.current.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Reloads when a file changed since the last try. `Ok(true)` when the
    /// new files are in use; an error keeps the previous ones.
    pub fn reload_if_changed(&self) -> Result<bool, String> {
        let now = [&self.files.cert, &self.files.key, &self.files.ca]
            .map(|p| stamp(p))
            .to_vec();
        {
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            if *seen == now {
                return Ok(false);
            }
            *seen = now;
        }
        let material = Material::load(&self.files, &self.me, &self.provider)?;
        record_expiry(material.not_after);
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(material);
        Ok(true)
    }

    /// Polls the files every [`super::RELOAD_POLL`] and reloads them when they
    /// change. A half-written or mismatched set (cert replaced, key not yet)
    /// is reported and retried at the next change; the old set stays.
    pub async fn watch(self: Arc<Self>) {
        let mut tick = tokio::time::interval(super::RELOAD_POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match self.reload_if_changed() {
                Ok(false) => {}
                Ok(true) => {
                    metrics::counter!("meridian_tls_reloads_total").increment(1);
                    tracing::info!(cert = %self.files.cert.display(), "TLS certificate, key and CA reloaded");
                }
                Err(e) => {
                    metrics::counter!("meridian_tls_reload_failures_total").increment(1);
                    tracing::error!(error = %e, "TLS files changed but do not load; keeping the previous ones");
                }
            }
        }
    }

    /// For servers: a client certificate from the CA is required.
    pub fn server_config(
        self: &Arc<Self>,
        alpn: &[&[u8]],
    ) -> Result<Arc<rustls::ServerConfig>, String> {
        self.server_config_with(alpn, true)
    }

    /// For the admin API: TLS without client certificates (the admin token
    /// authenticates), so curl and browsers can call it.
    pub fn server_config_without_client_auth(
        self: &Arc<Self>,
        alpn: &[&[u8]],
    ) -> Result<Arc<rustls::ServerConfig>, String> {
        self.server_config_with(alpn, false)
    }

    fn server_config_with(
        self: &Arc<Self>,
        alpn: &[&[u8]],
        client_auth: bool,
    ) -> Result<Arc<rustls::ServerConfig>, String> {
        let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&self.provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS server settings: {e}"))?;
        let mut config = if client_auth {
            builder
                .with_client_cert_verifier(Arc::new(ClientVerifier(Arc::clone(self))))
                .with_cert_resolver(Arc::new(Resolver(Arc::clone(self))))
        } else {
            builder
                .with_no_client_auth()
                .with_cert_resolver(Arc::new(Resolver(Arc::clone(self))))
        };
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(Arc::new(config))
    }

    /// For clients: presents this process's certificate and requires the
    /// server's to chain to the CA, match the host dialled and name `expect`.
    pub fn client_config(
        self: &Arc<Self>,
        expect: Expect,
    ) -> Result<Arc<rustls::ClientConfig>, String> {
        let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&self.provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS client settings: {e}"))?;
        let mut config = builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(ServerVerifier {
                tls: Arc::clone(self),
                expect,
            }))
            .with_client_cert_resolver(Arc::new(Resolver(Arc::clone(self))));
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(config))
    }
}

/// Handshake signatures, checked the same way for clients and servers:
/// they depend on the crypto provider only, not on the CA that may reload.
impl Tls {
    fn verify_tls12(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls12_signature(message, cert, dss, algorithms)
    }

    fn verify_tls13(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(message, cert, dss, algorithms)
    }

    fn schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

fn record_expiry(not_after: i64) {
    metrics::gauge!("meridian_tls_certificate_expiry_timestamp_seconds").set(not_after as f64);
}

fn refuse(reason: &'static str, detail: String) -> rustls::Error {
    metrics::counter!("meridian_tls_handshakes_refused_total", "reason" => reason).increment(1);
    tracing::warn!(%detail, reason, "TLS peer refused");
    rustls::Error::InvalidCertificate(rustls::CertificateError::ApplicationVerificationFailure)
}

/// Hands rustls the current certificate, as server and as client.
#[derive(Debug)]
struct Resolver(Arc<Tls>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.0.current().key))
    }
}

impl ResolvesClientCert for Resolver {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.0.current().key))
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// A client certificate must chain to the current CA and name a holder.
#[derive(Debug)]
struct ClientVerifier(Arc<Tls>);

impl ClientCertVerifier for ClientVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // Hints are optional; the CA can change under us, so send none.
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .0
            .current()
            .clients
            .verify_client_cert(end_entity, intermediates, now)
            .map_err(|e| refuse("untrusted", e.to_string()))?;
        describe(end_entity).map_err(|e| refuse("no identity", e))?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.schemes()
    }
}

/// A server certificate must chain to the current CA, match the host and
/// name the node the client meant to reach.
#[derive(Debug)]
struct ServerVerifier {
    tls: Arc<Tls>,
    expect: Expect,
}

impl ServerCertVerifier for ServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verified = self.tls.current().servers.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp,
            now,
        )?;
        let (identity, _) = describe(end_entity).map_err(|e| refuse("no identity", e))?;
        if !self.expect.admits(&identity) {
            return Err(refuse(
                "wrong holder",
                format!(
                    "{server_name:?} presented {identity}, expected {:?}",
                    self.expect
                ),
            ));
        }
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.tls.verify_tls12(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.tls.verify_tls13(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.tls.schemes()
    }
}
