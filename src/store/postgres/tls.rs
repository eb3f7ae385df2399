//! TLS to PostgreSQL with rustls (no OpenSSL), by libpq's `sslmode`:
//!
//! - `disable`: plain; `allow` and `prefer` (the default): TLS if the server offers it,
//!   certificate not checked (as libpq);
//! - `require`: TLS or no connection, certificate not checked, unless a root certificate
//!   is given (`sslrootcert`), which makes it `verify-ca` (as libpq);
//! - `verify-ca`: the chain must lead to a trusted root; the host name is not checked;
//! - `verify-full`: chain and host name.
//!
//! Trusted roots are the PEM file of `sslrootcert` / `PGSSLROOTCERT`, or the system's
//! (`sslrootcert=system`, and whenever none is given; libpq would read
//! `~/.postgresql/root.crt` instead).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

/// libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SslMode {
    Disable,
    Allow,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    pub(super) fn parse(s: &str) -> Option<SslMode> {
        Some(match s {
            "disable" => SslMode::Disable,
            "allow" => SslMode::Allow,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => return None,
        })
    }

    /// What tokio-postgres is told: whether TLS is optional or required.
    pub(super) fn wire(self) -> tokio_postgres::config::SslMode {
        use tokio_postgres::config::SslMode as Wire;
        match self {
            SslMode::Disable => Wire::Disable,
            SslMode::Allow | SslMode::Prefer => Wire::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => Wire::Require,
        }
    }
}

/// Where trusted roots come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Roots {
    System,
    File(PathBuf),
}

/// The rustls configuration for a mode. Errors are plain reasons (the caller names the target).
pub(super) fn client_config(mode: SslMode, roots: Option<&Roots>) -> Result<ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    // libpq: `require` with a root certificate file checks the chain, as `verify-ca`.
    let mode = match (mode, roots) {
        (SslMode::Require, Some(Roots::File(_))) => SslMode::VerifyCa,
        (m, _) => m,
    };
    let verifier: Arc<dyn ServerCertVerifier> = match mode {
        SslMode::Disable | SslMode::Allow | SslMode::Prefer | SslMode::Require => {
            Arc::new(Unverified { provider })
        }
        SslMode::VerifyCa | SslMode::VerifyFull => {
            let chain: Arc<dyn ServerCertVerifier> = match roots.unwrap_or(&Roots::System) {
                Roots::System => Arc::new(
                    rustls_platform_verifier::Verifier::new(provider.clone())
                        .map_err(|e| format!("system root certificates: {e}"))?,
                ),
                Roots::File(path) => WebPkiServerVerifier::builder_with_provider(
                    Arc::new(root_store(path)?),
                    provider.clone(),
                )
                .build()
                .map_err(|e| e.to_string())?,
            };
            if mode == SslMode::VerifyFull {
                chain
            } else {
                Arc::new(AnyName { chain })
            }
        }
    };
    Ok(builder
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth())
}

fn root_store(path: &Path) -> Result<RootCertStore, String> {
    let shown = path.display();
    let mut store = RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(path).map_err(|e| format!("{shown}: {e}"))?;
    for cert in certs {
        let cert = cert.map_err(|e| format!("{shown}: {e}"))?;
        store.add(cert).map_err(|e| format!("{shown}: {e}"))?;
    }
    if store.is_empty() {
        return Err(format!("{shown} holds no PEM certificate"));
    }
    Ok(store)
}

/// Encryption without authentication of the server (libpq's `prefer` and `require`): the
/// handshake's signatures are still checked, the certificate's chain and name are not.
#[derive(Debug)]
struct Unverified {
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// `verify-ca`: the chain must verify; a name mismatch alone is accepted.
#[derive(Debug)]
struct AnyName {
    chain: Arc<dyn ServerCertVerifier>,
}

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.chain.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.chain.supported_verify_schemes()
    }
}
