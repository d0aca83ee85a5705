//! Change notifications between nodes: writers `NOTIFY` a channel in the transaction that
//! changes something (delivered when it commits), and every node `LISTEN`s on a connection of
//! its own and drops what it cached. A notification can be missed (the listener's connection
//! dropped and came back), so on every (re)connection, and every `resync` period as a
//! backstop, the listener reports "anything may have changed".

use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::StreamExt;
use tokio_postgres::AsyncMessage;

use super::tls::Tls;

use super::Pg;

/// What a listener reports: one payload, or `None` for "anything may have changed".
pub type OnChange = Arc<dyn Fn(Option<&str>) + Send + Sync>;

/// How long a listener waits before reconnecting.
const RECONNECT: Duration = Duration::from_secs(1);

impl Pg {
    /// Listens on `channel` for as long as the pool lives, calling `on_change` for each
    /// notification, and with `None` after each (re)connection and every `resync`.
    pub fn listen(&self, channel: &'static str, resync: Duration, on_change: OnChange) {
        let (config, tls) = (self.config.clone(), self.tls.clone());
        self.io.handle().spawn(async move {
            loop {
                listen_once(&config, &tls, channel, resync, &on_change).await;
                tokio::time::sleep(RECONNECT).await;
            }
        });
    }
}

/// One connection's worth of listening; returns when the connection is lost.
async fn listen_once(
    config: &tokio_postgres::Config,
    tls: &Tls,
    channel: &'static str,
    resync: Duration,
    on_change: &OnChange,
) {
    let (client, mut messages) = match tls.connect(config).await {
        Ok(pair) => pair,
        Err(e) => {
            tracing::warn!(channel, error = %e, "change listener cannot connect; retrying");
            return;
        }
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(n)) => {
                    if tx.send(n.payload().to_string()).is_err() {
                        break;
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "change listener's connection failed");
                    break;
                }
            }
        }
    });
    if let Err(e) = client.batch_execute(&format!("LISTEN {channel}")).await {
        tracing::warn!(channel, error = %e, "cannot LISTEN; retrying");
        driver.abort();
        return;
    }
    // Whatever changed while nobody listened.
    on_change(None);
    let mut ticker = tokio::time::interval(resync);
    ticker.tick().await;
    loop {
        tokio::select! {
            payload = rx.recv() => match payload {
                Some(p) => on_change(Some(&p)),
                None => break,
            },
            _ = ticker.tick() => on_change(None),
        }
    }
    driver.abort();
}
