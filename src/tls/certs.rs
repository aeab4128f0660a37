//! `meridian certs`: a CA and the certificates a Meridian control plane
//! needs, made with rcgen. For a first cluster, the demo and the tests;
//! an operator with a PKI issues the same SAN URIs from it instead.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

use super::Identity;

/// A certificate and its private key, PEM.
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

/// CA file names inside a certs directory.
pub const CA_CERT: &str = "ca.pem";
pub const CA_KEY: &str = "ca-key.pem";

fn validity(params: &mut CertificateParams, days: u32) {
    let now = time::OffsetDateTime::now_utc();
    // A minute back: a peer whose clock is slightly behind still accepts it.
    params.not_before = now - time::Duration::minutes(1);
    params.not_after = now + time::Duration::days(i64::from(days));
}

/// A self-signed CA, valid for `days`.
pub fn new_ca(name: &str, days: u32) -> Result<Issued, String> {
    let key = KeyPair::generate().map_err(|e| format!("generating the CA key: {e}"))?;
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    validity(&mut params, days);
    let cert = params
        .self_signed(&key)
        .map_err(|e| format!("signing the CA certificate: {e}"))?;
    Ok(Issued {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// A certificate for `identity` signed by the CA. `hosts` (DNS names or IP
/// addresses) are the names it is dialled by: a node needs them, since
/// limiters and peers check the host they dialled; a region's limiters are
/// only clients and need none. Nodes may be both server and client;
/// regions only clients, so a region's key cannot pose as a coordinator.
pub fn issue(
    ca_cert_pem: &str,
    ca_key_pem: &str,
    identity: &Identity,
    hosts: &[String],
    days: u32,
) -> Result<Issued, String> {
    let ca_key = KeyPair::from_pem(ca_key_pem).map_err(|e| format!("the CA key: {e}"))?;
    let issuer = Issuer::from_ca_cert_pem(ca_cert_pem, ca_key)
        .map_err(|e| format!("the CA certificate: {e}"))?;
    let key = KeyPair::generate().map_err(|e| format!("generating a key: {e}"))?;
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(DnType::CommonName, identity.to_string());
    let uri = identity
        .uri()
        .try_into()
        .map_err(|e| format!("{identity}: not a URI ({e:?})"))?;
    params.subject_alt_names.push(SanType::URI(uri));
    for host in hosts {
        let san = match host.parse::<std::net::IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(
                host.clone()
                    .try_into()
                    .map_err(|e| format!("--host {host:?}: not a DNS name ({e:?})"))?,
            ),
        };
        params.subject_alt_names.push(san);
    }
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = match identity {
        Identity::Node(_) => vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
        Identity::Region(_) => vec![ExtendedKeyUsagePurpose::ClientAuth],
    };
    validity(&mut params, days);
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(|e| format!("signing the certificate: {e}"))?;
    Ok(Issued {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// The file stem for an identity's certificate: `node-3`, `region-mumbai`.
pub fn stem(identity: &Identity) -> String {
    match identity {
        Identity::Node(id) => format!("node-{id}"),
        Identity::Region(name) => format!("region-{name}"),
    }
}

/// Writes `data` to `path` through a temporary file and a rename, so a
/// process reloading the file never reads half of it; `private` files are
/// 0600 from the start.
pub fn write_atomic(path: &Path, data: &str, private: bool) -> Result<(), String> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp =
        tempfile::NamedTempFile::new_in(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = if private { 0o600 } else { 0o644 };
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(mode))
            .map_err(|e| format!("{}: {e}", tmp.path().display()))?;
    }
    tmp.write_all(data.as_bytes())
        .and_then(|()| tmp.as_file().sync_all())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    tmp.persist(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(())
}

/// Paths of a certificate and key written by [`write_pair`].
#[derive(Debug, Clone)]
pub struct Pair {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Writes `issued` as `DIR/STEM.pem` and `DIR/STEM-key.pem` (0600).
pub fn write_pair(dir: &Path, stem: &str, issued: &Issued) -> Result<Pair, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let pair = Pair {
        cert: dir.join(format!("{stem}.pem")),
        key: dir.join(format!("{stem}-key.pem")),
    };
    write_atomic(&pair.key, &issued.key_pem, true)?;
    write_atomic(&pair.cert, &issued.cert_pem, false)?;
    Ok(pair)
}

/// `meridian certs` options.
#[derive(clap::Args, Debug, Clone)]
pub struct CertsArgs {
    /// What to make.
    #[command(subcommand)]
    pub command: CertsCommand,
}

/// `meridian certs` subcommands.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum CertsCommand {
    /// Make a CA: DIR/ca.pem (give it to every process as --tls-ca) and
    /// DIR/ca-key.pem (0600; keep it off the servers).
    Ca {
        /// Directory for the CA's files (created if missing).
        #[arg(long)]
        dir: PathBuf,
        /// The CA's common name.
        #[arg(long, default_value = "Meridian control plane CA")]
        name: String,
        /// Days the CA is valid.
        #[arg(long, default_value_t = 3650)]
        days: u32,
        /// Replace a CA already in DIR (every certificate it issued stops
        /// being trusted once processes reload the new ca.pem).
        #[arg(long)]
        force: bool,
    },
    /// Issue a certificate for a coordinator node or a region's limiters,
    /// signed by the CA in --dir: OUT/node-ID.pem + OUT/node-ID-key.pem, or
    /// OUT/region-NAME.pem + OUT/region-NAME-key.pem. Issuing again replaces
    /// the files in place; running processes reload them (rotation).
    Issue {
        /// Directory holding ca.pem and ca-key.pem.
        #[arg(long)]
        dir: PathBuf,
        /// A coordinator node, by Raft id (`meridian://node/ID`).
        #[arg(long, conflicts_with = "region", required_unless_present = "region")]
        node: Option<u64>,
        /// A region's limiters (`meridian://region/NAME`).
        #[arg(long)]
        region: Option<String>,
        /// A DNS name or IP address the node is dialled by (repeatable; at
        /// least one for a node: limiters and peers check it).
        #[arg(long = "host", value_name = "HOST")]
        hosts: Vec<String>,
        /// Days the certificate is valid.
        #[arg(long, default_value_t = 365)]
        days: u32,
        /// Where to write the files (default: --dir).
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

/// Runs `meridian certs`.
pub fn run(args: CertsArgs) -> Result<(), String> {
    match args.command {
        CertsCommand::Ca {
            dir,
            name,
            days,
            force,
        } => {
            let cert = dir.join(CA_CERT);
            if cert.exists() && !force {
                return Err(format!(
                    "{} exists; --force replaces it (and distrusts every certificate it issued)",
                    cert.display()
                ));
            }
            let ca = new_ca(&name, days)?;
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            write_atomic(&dir.join(CA_KEY), &ca.key_pem, true)?;
            write_atomic(&cert, &ca.cert_pem, false)?;
            println!(
                "CA certificate: {} (--tls-ca for every process)",
                cert.display()
            );
            println!(
                "CA key:         {} (keep it secret and off the servers)",
                dir.join(CA_KEY).display()
            );
            Ok(())
        }
        CertsCommand::Issue {
            dir,
            node,
            region,
            hosts,
            days,
            out,
        } => {
            let identity = match (node, region) {
                (Some(id), _) => Identity::Node(id),
                (None, Some(name)) => {
                    if !crate::allocation::valid_region_name(&name) {
                        return Err(format!(
                            "--region {name:?}: 1-64 characters of a-z, 0-9, '-' or '_'"
                        ));
                    }
                    Identity::Region(name)
                }
                (None, None) => return Err("give --node ID or --region NAME".into()),
            };
            if matches!(identity, Identity::Node(_)) && hosts.is_empty() {
                return Err(
                    "a node's certificate needs at least one --host (a DNS name or IP address \
                     it is dialled by, e.g. --host 10.0.0.1 --host coordinator-1.internal)"
                        .into(),
                );
            }
            let read = |name: &str| {
                let path = dir.join(name);
                std::fs::read_to_string(&path).map_err(|e| {
                    format!(
                        "{}: {e} (make a CA first: meridian certs ca --dir {})",
                        path.display(),
                        dir.display()
                    )
                })
            };
            let issued = issue(&read(CA_CERT)?, &read(CA_KEY)?, &identity, &hosts, days)?;
            let pair = write_pair(out.as_deref().unwrap_or(&dir), &stem(&identity), &issued)?;
            println!("{identity}");
            println!("  --tls-cert {}", pair.cert.display());
            println!("  --tls-key  {}", pair.key.display());
            println!("  --tls-ca   {}", dir.join(CA_CERT).display());
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_certificates_name_their_holder_and_chain_to_the_ca() {
        let ca = new_ca("test CA", 1).unwrap();
        let region = Identity::Region("mumbai".into());
        let issued = issue(&ca.cert_pem, &ca.key_pem, &region, &[], 1).unwrap();
        let der =
            rustls::pki_types::pem::PemObject::from_pem_slice(issued.cert_pem.as_bytes()).unwrap();
        let (identity, not_after) = super::super::reload::describe(&der).unwrap();
        assert_eq!(identity, region);
        let in_a_day = time::OffsetDateTime::now_utc().unix_timestamp() + 86_400;
        assert!(
            (not_after - in_a_day).abs() < 120,
            "{not_after} vs {in_a_day}"
        );
    }
}
