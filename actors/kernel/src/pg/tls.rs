//! TLS to the metastore, as the URL's `sslmode` asks: `require` encrypts and verifies the
//! server's certificate (Mozilla's roots, plus `ca_file` for a private CA); `disable` and
//! `prefer` (the default) connect in plain text. Unlike libpq's `require`, the certificate is
//! always verified: an encrypted connection to an unverified server is not offered.

use std::path::Path;
use std::sync::Arc;

use futures_util::stream::{BoxStream, StreamExt};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use tokio_postgres::config::SslMode;
use tokio_postgres::{AsyncMessage, Client, NoTls};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::StoreError;

/// A connection's messages (notifications), whatever its transport.
pub(super) type Messages = BoxStream<'static, Result<AsyncMessage, tokio_postgres::Error>>;

/// How a node connects: in plain text, or over rustls.
#[derive(Clone)]
pub(super) enum Tls {
    Plain,
    Rustls(MakeRustlsConnect),
}

impl Tls {
    /// What `config`'s `sslmode` asks for, trusting `ca_file`'s certificates (PEM) besides
    /// Mozilla's roots.
    pub(super) fn for_config(
        config: &tokio_postgres::Config,
        ca_file: Option<&Path>,
    ) -> Result<Tls, StoreError> {
        if config.get_ssl_mode() != SslMode::Require {
            return Ok(Tls::Plain);
        }
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        if let Some(path) = ca_file {
            let certs = CertificateDer::pem_file_iter(path)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|e| {
                    StoreError::invalid(format!("cannot read {}: {e}", path.display()), "ca_file")
                })?;
            for cert in certs {
                roots.add(cert).map_err(|e| {
                    StoreError::invalid(format!("{}: {e}", path.display()), "ca_file")
                })?;
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| StoreError::Unavailable(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Tls::Rustls(MakeRustlsConnect::new(client)))
    }

    /// A connection outside the pool (a listener's), with its messages as one stream.
    pub(super) async fn connect(
        &self,
        config: &tokio_postgres::Config,
    ) -> Result<(Client, Messages), tokio_postgres::Error> {
        Ok(match self {
            Tls::Plain => {
                let (client, mut connection) = config.connect(NoTls).await?;
                let messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
                (client, messages.boxed())
            }
            Tls::Rustls(tls) => {
                let (client, mut connection) = config.connect(tls.clone()).await?;
                let messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
                (client, messages.boxed())
            }
        })
    }
}
