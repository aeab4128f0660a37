//! Certificates for TLS tests, made by `meridian certs` (the command an
//! operator runs), and clients that present them: tonic channels for the
//! gRPC side, reqwest for the admin API.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// A CA in a temp dir and the certificates issued from it.
pub struct Pki {
    pub dir: PathBuf,
}

fn certs(args: &[&str]) {
    let out = Command::new(super::meridian_bin())
        .arg("certs")
        .args(args)
        .output()
        .expect("run meridian certs");
    assert!(
        out.status.success(),
        "meridian certs {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Pki {
    /// A new CA in `dir` (created).
    pub fn new(dir: &Path) -> Pki {
        let dir = dir.to_path_buf();
        certs(&["ca", "--dir", dir.to_str().expect("utf-8 path")]);
        Pki { dir }
    }

    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// Issues (again: rotation) node `id`'s certificate for 127.0.0.1.
    pub fn issue_node(&self, id: u64) -> String {
        let dir = self.dir.to_str().expect("utf-8 path");
        certs(&[
            "issue",
            "--dir",
            dir,
            "--node",
            &id.to_string(),
            "--host",
            "127.0.0.1",
            "--host",
            "localhost",
        ]);
        format!("node-{id}")
    }

    /// Issues (again: rotation) a certificate for `region`'s limiters.
    pub fn issue_region(&self, region: &str) -> String {
        let dir = self.dir.to_str().expect("utf-8 path");
        certs(&["issue", "--dir", dir, "--region", region]);
        format!("region-{region}")
    }

    /// `--tls-cert … --tls-key … --tls-ca …` for the certificate `stem`
    /// (`node-1`, `region-mumbai`).
    pub fn flags(&self, stem: &str) -> Vec<String> {
        let path = |p: PathBuf| p.to_str().expect("utf-8 path").to_string();
        vec![
            "--tls-cert".into(),
            path(self.dir.join(format!("{stem}.pem"))),
            "--tls-key".into(),
            path(self.dir.join(format!("{stem}-key.pem"))),
            "--tls-ca".into(),
            path(self.ca()),
        ]
    }

    /// A client config trusting the CA, presenting `stem`'s certificate
    /// when given (and none otherwise).
    pub fn client_config(&self, stem: Option<&str>) -> rustls::ClientConfig {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut roots = rustls::RootCertStore::empty();
        let ca = std::fs::read(self.ca()).expect("read ca.pem");
        for cert in CertificateDer::pem_slice_iter(&ca) {
            roots.add(cert.expect("CA PEM")).expect("CA certificate");
        }
        let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
        let mut config = match stem {
            Some(stem) => {
                let cert = std::fs::read(self.dir.join(format!("{stem}.pem"))).expect("cert");
                let key = std::fs::read(self.dir.join(format!("{stem}-key.pem"))).expect("key");
                let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert)
                    .collect::<Result<_, _>>()
                    .expect("cert PEM");
                let key = PrivateKeyDer::from_pem_slice(&key).expect("key PEM");
                builder
                    .with_client_auth_cert(chain, key)
                    .expect("client certificate")
            }
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        config
    }

    /// A lazily connecting gRPC channel to `addr` (`host:port`) over TLS,
    /// presenting `stem`'s certificate (or none).
    pub fn channel(&self, addr: &str, stem: Option<&str>) -> tonic::transport::Channel {
        let config = Arc::new(self.client_config(stem));
        let connector = tower::service_fn(move |uri: tonic::transport::Uri| {
            let connector = tokio_rustls::TlsConnector::from(Arc::clone(&config));
            async move {
                let host = uri.host().unwrap_or("127.0.0.1").to_string();
                let port = uri.port_u16().unwrap_or(443);
                let tcp = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
                let name = ServerName::try_from(host)
                    .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
                let tls = connector.connect(name, tcp).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
            }
        });
        tonic::transport::Endpoint::from_shared(format!("https://{addr}"))
            .expect("gRPC URL")
            .connect_with_connector_lazy(connector)
    }

    /// An HTTP client trusting the CA (the admin API needs no client cert).
    pub fn http(&self) -> reqwest::Client {
        let mut config = self.client_config(None);
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        reqwest::Client::builder()
            .use_preconfigured_tls(config)
            .timeout(std::time::Duration::from_secs(30))
            .build()
            .expect("HTTPS client")
    }
}
